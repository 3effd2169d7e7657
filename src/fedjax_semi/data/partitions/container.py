"""The :class:`Partition` container and its ``.npz`` file (save, and a load that checks the
file and says what is wrong with a bad one)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Partition", "PartitionFileError"]


class PartitionFileError(ValueError):
    """A partition file that cannot be read or is not a consistent partition."""

    def __init__(self, path: str | Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path, self.problem = path, problem


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _os_problem(e: OSError) -> str:
    """What an OSError means for a file the user named, in words."""
    if isinstance(e, FileNotFoundError):
        return "no such file"
    if isinstance(e, IsADirectoryError):
        return "a directory, not a file"
    if isinstance(e, PermissionError):
        return "not readable (permission denied)"
    return f"cannot be read ({e.strerror or _first_line(e)})"


@dataclasses.dataclass(eq=False)
class Partition:
    """A complete federated partition of one dataset.

    Attributes:
      clients: role -> ``C`` sorted int64 index arrays; roles ``"labeled"``,
        ``"unlabeled"``, ``"test"`` and optionally ``"val"``; DoFed-SPP has
        ``"target_labeled"``/``"target_unlabeled"`` instead of ``"unlabeled"``.
      server: server-side index sets, at least ``"test_global"`` (and ``"val_global"``
        when there is a val role); CoFED adds ``"public"``, Ada-FedSemi
        ``"server_unlabeled"`` and ``"server_val"``.
      mu: ``float [C]`` labeled ratio per client.
      meta: JSON-serializable settings (scheme, alpha, seed, ...).
      assignments: per-client arrays with a leading ``[C]`` axis, e.g. ``"edge"`` int [C],
        ``"cluster"`` int [C], ``"label_map"`` int [C, num_classes] (the label client ``k``
        sees for true class ``y`` is ``label_map[k, y]``), ``"rotation"`` int [C] (quarter
        turns: inputs of client ``k`` are rotated by ``90 * rotation[k]`` degrees). Empty for
        the generic schemes; :func:`apply_client_transforms` applies the last two.

    All indices refer to ``concat(x_train, x_test)`` of the source dataset.
    """

    clients: dict[str, list[np.ndarray]]
    server: dict[str, np.ndarray]
    mu: np.ndarray
    meta: dict[str, Any]
    assignments: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

    @property
    def num_clients(self) -> int:
        return len(self.mu)

    def counts(self) -> dict[str, np.ndarray]:
        """Role -> ``int64 [C]`` number of samples per client."""
        return {r: np.array([len(a) for a in v], dtype=np.int64) for r, v in self.clients.items()}

    def save(self, path: str | Path) -> None:
        """Writes one ``.npz``: ragged lists as concatenated values + offsets, meta as JSON."""
        arrays: dict[str, np.ndarray] = {"mu": np.asarray(self.mu, dtype=np.float64)}
        for role, lists in self.clients.items():
            sizes = np.array([len(a) for a in lists], dtype=np.int64)
            arrays[f"clients/{role}/offsets"] = np.concatenate([[0], np.cumsum(sizes)])
            arrays[f"clients/{role}/values"] = (
                np.concatenate(lists).astype(np.int64) if lists else np.empty(0, np.int64)
            )
        for name, idx in self.server.items():
            arrays[f"server/{name}"] = np.asarray(idx, dtype=np.int64)
        for name, a in self.assignments.items():
            arrays[f"assignments/{name}"] = np.asarray(a)  # dtype kept by the .npz
        header = {
            "roles": list(self.clients),
            "server": list(self.server),
            "meta": self.meta,
            "assignments": list(self.assignments),
        }
        arrays["header"] = np.array(json.dumps(header))
        # A file object keeps np.savez from appending ".npz" to the requested path.
        with open(path, "wb") as f:
            np.savez_compressed(f, **arrays)

    @classmethod
    def load(cls, path: str | Path) -> Partition:
        """Reads a partition written by :meth:`save`.

        Raises :class:`PartitionFileError` saying what is wrong when the path cannot be read or
        does not hold a consistent partition (truncated, junk, offsets that do not add up), so
        a bad file ends in one clear line instead of an error from deep inside numpy or zipfile.
        """
        try:
            with open(path, "rb") as f:
                magic = f.read(4)
        except OSError as e:
            raise PartitionFileError(path, _os_problem(e)) from None
        if not magic:
            raise PartitionFileError(path, "the file is empty")
        if magic not in (b"PK\x03\x04", b"PK\x05\x06"):  # np.load would try it as a pickle
            raise PartitionFileError(path, "not a .npz archive")
        try:
            with np.load(path, allow_pickle=False) as z:
                return cls._from_npz(z, path)
        except PartitionFileError:
            raise
        except OSError as e:
            raise PartitionFileError(path, _os_problem(e)) from None
        except Exception as e:  # noqa: BLE001 (zipfile, zlib, numpy and json raise many types)
            problem = f"damaged or truncated .npz archive ({_first_line(e)})"
            raise PartitionFileError(path, problem) from None

    @classmethod
    def _from_npz(cls, z: Any, path: str | Path) -> Partition:
        """The partition in an open .npz, checked for consistency (PartitionFileError)."""

        def field(name: str) -> np.ndarray:
            if name not in z.files:
                raise PartitionFileError(path, f"no {name!r} array (not written by Partition.save)")
            return z[name]

        def indices(name: str) -> np.ndarray:
            a = field(name)
            if a.ndim != 1 or not np.issubdtype(a.dtype, np.integer):
                raise PartitionFileError(path, f"{name!r} is not a 1-D integer array")
            return a

        header = json.loads(str(field("header")))
        if not isinstance(header, dict) or not {"roles", "server", "meta"} <= set(header):
            raise PartitionFileError(path, "its header lacks roles, server or meta")
        mu = field("mu")
        if mu.ndim != 1:
            raise PartitionFileError(path, f"'mu' has shape {mu.shape}, not [num_clients]")
        c = len(mu)
        clients = {}
        for role in header["roles"]:
            values = indices(f"clients/{role}/values")
            offsets = indices(f"clients/{role}/offsets")
            ok = len(offsets) == c + 1 and offsets[0] == 0 and offsets[-1] == len(values)
            if not ok or (np.diff(offsets) < 0).any():
                raise PartitionFileError(
                    path, f"the offsets of role {role!r} do not split its indices into {c} clients"
                )
            clients[role] = [values[offsets[k] : offsets[k + 1]].copy() for k in range(c)]
        server = {name: indices(f"server/{name}") for name in header["server"]}
        # Files written before assignments existed have no such header key.
        assignments = {a: field(f"assignments/{a}") for a in header.get("assignments", [])}
        for name, a in assignments.items():
            if a.ndim == 0 or len(a) != c:
                raise PartitionFileError(
                    path, f"assignment {name!r} has shape {a.shape}, not [{c}, ...]"
                )
        return cls(
            clients=clients, server=server, mu=mu, meta=header["meta"], assignments=assignments
        )
