"""Bring your own data: ``dataset.name=npz:PATH``, a ``.npz`` file written by ``np.savez``.

The file holds ``x_train``, ``y_train``, ``x_test``, ``y_test`` and, optionally, the natural
clients ``client_train`` / ``client_test`` (an integer client id per example). The inputs'
shape and dtype decide the dataset's kind (:attr:`ArrayDataset.kind`), hence the models
that fit it:

- ``[N, H, W]`` or ``[N, H, W, C]`` (any numeric dtype): images, stored ``uint8``; floats in
  ``[0, 1]`` are scaled by 255, other values must lie in ``[0, 255]``;
- ``[N, D]`` float: feature vectors, ``float32``, used as stored (standardize them yourself);
- ``[N, L]`` integer: token ids, ``int32``, id 0 is padding (the text models mask it out);
  the vocabulary size is the largest id + 1 (at least 3).

Labels are integer class ids; ``num_classes`` is the largest + 1. Client ids become
``side["writers"]`` (the distinct ids, sorted) and ``side["writer_train"]`` /
``side["writer_test"]`` (each example's index into it), the representation ``load_femnist``
gives LEAF's writers, so ``partition.scheme=natural`` (and CoFED's
``partition.cofed.variant=writers``) use them.

:func:`check_npz` reads only the arrays' headers, the labels and the client ids; every problem
is one :func:`~fedjax_semi.errors.bad` line naming ``dataset.name``, the value and what is
expected. No jax here, like the rest of the data layer.
"""

from __future__ import annotations

import dataclasses
import zipfile
from pathlib import Path

import numpy as np

from fedjax_semi.data.dataset import ArrayDataset
from fedjax_semi.data.image_loaders import make_image_dataset
from fedjax_semi.errors import ConfigError, bad

__all__ = ["NPZ_PREFIX", "NpzLayout", "check_npz", "load_npz", "npz_path"]

NPZ_PREFIX = "npz:"
REQUIRED = ("x_train", "y_train", "x_test", "y_test")
CLIENTS = ("client_train", "client_test")
FORMAT = (
    "npz:PATH, a .npz file (np.savez) with arrays x_train, y_train, x_test, y_test "
    "(+ optional client_train, client_test), see docs/datasets.md"
)
MIN_VOCAB = 3  # the text models' smallest vocabulary: padding, unknown, one word


@dataclasses.dataclass(frozen=True)
class NpzLayout:
    """What :func:`check_npz` found: the file and each array's ``(shape, dtype)``."""

    path: Path
    headers: dict[str, tuple[tuple[int, ...], np.dtype]]

    @property
    def kind(self) -> str:
        """The input kind: ``"image"``, ``"tokens"`` or ``"features"``."""
        shape, dtype = self.headers["x_train"]
        if len(shape) in (3, 4):
            return "image"
        return "tokens" if dtype.kind in "iu" else "features"


def npz_path(name: str) -> Path:
    """The file of dataset ``npz:PATH`` (``~`` expanded, made absolute)."""
    return Path(name[len(NPZ_PREFIX) :]).expanduser().absolute()


def _header(zf: zipfile.ZipFile, key: str) -> tuple[tuple[int, ...], np.dtype]:
    with zf.open(f"{key}.npy") as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(f)
        else:  # 2.0 and 3.0 share the header layout (3.0 allows utf-8 field names)
            shape, _, dtype = np.lib.format.read_array_header_2_0(f)
    return tuple(int(d) for d in shape), np.dtype(dtype)


def check_npz(name: str) -> NpzLayout:
    """Checks dataset ``npz:PATH`` without reading its inputs.

    Raises:
      ConfigError: one line naming ``dataset.name``, the value, the problem and the format:
        no file, not a zip/npz, an array missing (those present listed), a non-numeric
        array, mismatched lengths, labels not 1-D integers >= 0, inputs of another rank than
        images / features / tokens, x_train and x_test examples of different shapes or kinds,
        client ids not one integer per example (or client_test without client_train).
    """

    def fail(problem: str) -> ConfigError:
        return bad("dataset.name", name, f"{problem}; expected {FORMAT}")

    path = npz_path(name)
    if not name[len(NPZ_PREFIX) :]:
        raise fail("no path after 'npz:'")
    if not path.exists():
        raise fail(f"no file {str(path)!r}")
    if not path.is_file():
        raise fail(f"{str(path)!r} is not a file")
    if not zipfile.is_zipfile(path):
        raise fail(f"{str(path)!r} is not a .npz file (not a zip archive)")
    try:
        with zipfile.ZipFile(path) as zf:
            present = sorted(n[: -len(".npy")] for n in zf.namelist() if n.endswith(".npy"))
            for key in REQUIRED:
                if key not in present:
                    raise fail(f"array {key!r} is missing (the file has {present})")
            if "client_test" in present and "client_train" not in present:
                raise fail("client_test without client_train (give client_train, or both)")
            headers = {k: _header(zf, k) for k in (*REQUIRED, *CLIENTS) if k in present}
    except (zipfile.BadZipFile, ValueError, OSError) as e:
        if isinstance(e, ConfigError):
            raise
        raise fail(f"{str(path)!r} is not a readable .npz file ({type(e).__name__})") from None
    for key, (shape, dtype) in headers.items():
        if dtype.kind not in "biuf" or not shape:
            raise fail(f"{key} is {dtype} {list(shape)}; numeric arrays with an example axis")
    for split in ("train", "test"):
        (xs, _), (ys, ydt) = headers[f"x_{split}"], headers[f"y_{split}"]
        if xs[0] == 0:
            raise fail(f"x_{split} holds no example")
        if len(ys) != 1 or ydt.kind not in "iu":
            raise fail(f"y_{split} is {ydt} {list(ys)}; labels are integer class ids 0..K-1 [N]")
        if ys[0] != xs[0]:
            raise fail(f"x_{split} has {xs[0]} examples but y_{split} {ys[0]} labels")
        if f"client_{split}" in headers:
            cs, cdt = headers[f"client_{split}"]
            if len(cs) != 1 or cdt.kind not in "iu" or cs[0] != xs[0]:
                raise fail(
                    f"client_{split} is {cdt} {list(cs)} for {xs[0]} examples of x_{split}; "
                    "one integer client id per example"
                )
    (tr, tr_dt), (te, te_dt) = headers["x_train"], headers["x_test"]
    if len(tr) not in (2, 3, 4):
        raise fail(
            f"x_train is {list(tr)}; images [N,H,W] or [N,H,W,C], features [N,D] (float) "
            "or token ids [N,L] (integer)"
        )
    if tr[1:] != te[1:]:
        raise fail(f"x_train examples are {list(tr[1:])} but x_test's {list(te[1:])}; the same")
    layout = NpzLayout(path, headers)
    if layout.kind != "image" and (tr_dt.kind in "iu") != (te_dt.kind in "iu"):
        raise fail(f"x_train is {tr_dt} but x_test {te_dt}; both token ids or both features")
    with np.load(path, allow_pickle=False) as f:
        for key in ("y_train", "y_test"):
            y = f[key]
            if len(y) and y.min() < 0:
                raise fail(f"{key} has negative labels (min {y.min()}); class ids 0..K-1")
    return layout


def _images(name: str, key: str, x: np.ndarray) -> np.ndarray:
    """uint8 [N, H, W, C]: floats in [0, 1] scaled by 255, other values kept; all in [0, 255]."""
    if x.ndim == 3:
        x = x[..., None]
    if x.dtype == np.uint8:
        return x
    lo, hi = (x.min(), x.max()) if x.size else (0, 0)
    if not (np.isfinite(lo) and np.isfinite(hi) and lo >= 0 and hi <= 255):
        raise bad("dataset.name", name, f"{key} has values in [{lo}, {hi}]; images in [0, 255]")
    if x.dtype.kind == "f" and hi <= 1:
        x = x * 255.0
    return np.round(x).astype(np.uint8) if x.dtype.kind == "f" else x.astype(np.uint8)


def _clients(ct: np.ndarray, cs: np.ndarray | None) -> dict[str, np.ndarray]:
    ids = np.unique(ct if cs is None else np.concatenate([ct, cs]))
    side = {"writers": ids, "writer_train": np.searchsorted(ids, ct).astype(np.int32)}
    if cs is not None:
        side["writer_test"] = np.searchsorted(ids, cs).astype(np.int32)
    return side


def load_npz(name: str, data_dir: str | None = None) -> ArrayDataset:
    """Dataset ``npz:PATH`` (``data_dir`` is unused: the path is in the name), checked by
    :func:`check_npz` first; see the module docstring for the format.

    Raises:
      ConfigError: see :func:`check_npz`; also image values outside ``[0, 255]``, negative or
        out-of-``int32`` token ids and non-finite features.
    """
    del data_dir
    layout = check_npz(name)
    with np.load(layout.path, allow_pickle=False) as f:
        a = {k: f[k] for k in (*REQUIRED, *CLIENTS) if k in layout.headers}
    y_train, y_test = a["y_train"].astype(np.int32), a["y_test"].astype(np.int32)
    num_classes = int(max(y_train.max(), y_test.max())) + 1
    side = _clients(a["client_train"], a.get("client_test")) if "client_train" in a else {}
    if layout.kind == "image":
        x_train = _images(name, "x_train", a["x_train"])
        x_test = _images(name, "x_test", a["x_test"])
        return make_image_dataset(name, x_train, y_train, x_test, y_test, num_classes, side)
    vocab = None
    if layout.kind == "tokens":
        lo = min(a["x_train"].min(), a["x_test"].min())
        hi = max(a["x_train"].max(), a["x_test"].max())
        if lo < 0 or hi >= np.iinfo(np.int32).max:
            raise bad("dataset.name", name, f"token ids in [{lo}, {hi}]; ids in [0, 2**31 - 1)")
        vocab = max(int(hi) + 1, MIN_VOCAB)
    dtype = np.int32 if layout.kind == "tokens" else np.float32
    x_train, x_test = a["x_train"].astype(dtype), a["x_test"].astype(dtype)
    if layout.kind == "features" and not (np.isfinite(x_train).all() and np.isfinite(x_test).all()):
        raise bad("dataset.name", name, "x_train or x_test has NaN or inf; finite features")
    arrays = [np.ascontiguousarray(v) for v in (x_train, y_train, x_test, y_test)]
    for v in [*arrays, *side.values()]:
        v.setflags(write=False)  # shared through the in-process cache of load_dataset
    return ArrayDataset(
        name, *arrays, num_classes=num_classes, mean=(0.0,), std=(1.0,), kind=layout.kind,
        vocab_size=vocab, side=side,
    )  # fmt: skip
