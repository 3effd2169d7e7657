"""What a run writes: metrics.jsonl, summary.json, Orbax checkpoints, plots."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from fedjax_semi.engine.loop import Hook, NaNError, Rows, Run, jsonable, rounds_done
from fedjax_semi.engine.pytrees import PyTree


class MetricsLog:
    """metrics.jsonl: one JSON object per round, flushed as it is written."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        lines = [line for line in self.path.read_text().splitlines(keepends=True) if line.strip()]
        if lines and not lines[-1].endswith("\n"):
            # A run killed mid-write leaves a partial last line; its round is redone on resume.
            try:
                json.loads(lines[-1])
            except json.JSONDecodeError:
                lines.pop()
        return [json.loads(line) for line in lines]

    def truncate(self, last_round: int) -> list[dict]:
        """Keep the lines of rounds <= last_round (a resumed run redoes the rest)."""
        rows = [r for r in self.read() if r["round"] <= last_round]
        with self.path.open("w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        return rows

    def append(self, row: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(jsonable(row)) + "\n")


class CheckpointError(ValueError):
    """resume=true found checkpoints, but none of them can be restored."""


class CheckpointWarning(UserWarning):
    """A checkpoint that cannot be restored was skipped for an older one."""


class Checkpointer:
    """Orbax checkpoints of the federated state, keyed by rounds completed.

    Keeps the newest `max_to_keep` (>= 2: when the newest turns out unreadable, the one before
    it is still there). Temporary directories of a writer that was killed mid-save are ignored
    by Orbax and removed when the manager opens (`cleanup_tmp_directories`)."""

    def __init__(self, directory: Path, max_to_keep: int = 2) -> None:
        import orbax.checkpoint as ocp
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.WARNING)  # orbax logs every step at INFO

        if max_to_keep < 2:
            raise ValueError(f"max_to_keep={max_to_keep}: keep >= 2 to fall back on")
        self._ocp = ocp
        self.directory = Path(directory).absolute()
        self.options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            create=True,
            enable_async_checkpointing=False,
            cleanup_tmp_directories=True,
        )
        self.manager = self._open()

    def _open(self) -> Any:
        with _quiet_orbax():  # it logs an ERROR per damaged step it lists
            return self._ocp.CheckpointManager(self.directory, options=self.options)

    def latest(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state: PyTree) -> None:
        from flax import serialization

        if step in self.manager.all_steps():
            return
        tree = serialization.to_state_dict(state)
        self.manager.save(step, args=self._ocp.args.StandardSave(tree), force=True)
        self.manager.wait_until_finished()

    def restore(self, step: int, like: PyTree) -> PyTree:
        import jax
        from flax import serialization

        template = serialization.to_state_dict(like)
        abstract = jax.tree.map(self._ocp.utils.to_shape_dtype_struct, template)
        tree = self.manager.restore(step, args=self._ocp.args.StandardRestore(abstract))
        return serialization.from_state_dict(like, tree)

    def restore_latest(self, like: PyTree) -> tuple[int, PyTree] | None:
        """(step, state) of the newest checkpoint that restores, or None when there is none.

        An unreadable checkpoint (junk bytes, a truncated or missing file) is skipped. Once an
        older one restores, each skipped one gets a CheckpointWarning and is moved aside to
        `<step>.corrupt`: the resumed run saves that step again, and it must not count against
        max_to_keep (Orbax would delete the intact one to make room). When none restores,
        nothing is moved and CheckpointError names the directory."""
        errors: dict[int, str] = {}
        for step in sorted(self.manager.all_steps(), reverse=True):
            try:
                with _quiet_orbax():
                    state = self.restore(step, like)
            except Exception as e:  # noqa: BLE001 (orbax, tensorstore and json raise many types)
                errors[step] = _first_line(e)
                # A failed restore can leave the manager's handlers set up for the wrong
                # layout (a step without its item reads as a multi-item checkpoint): reopen.
                self.close()
                self.manager = self._open()
                continue
            for bad, why in errors.items():
                moved = self._set_aside(bad)
                warnings.warn(
                    f"checkpoint {self.directory / str(bad)} (round {bad}) cannot be restored "
                    f"({why}); resuming from round {step} instead, the damaged one is moved "
                    f"to {moved}",
                    CheckpointWarning,
                    stacklevel=2,
                )
            return step, state
        if errors:
            # Close first: an open manager's background threads can print a traceback while
            # the interpreter shuts down after the error line.
            self.close()
            newest = max(errors)
            raise CheckpointError(
                f"resume=true: no intact checkpoint in {self.directory}: rounds "
                f"{sorted(errors)} cannot be restored (round {newest}: {errors[newest]}); "
                "resume=false starts the run afresh"
            )
        return None

    def clear(self) -> None:
        """Delete every checkpoint (a fresh run replacing an old one in the same directory)."""
        for step in self.manager.all_steps():
            self.manager.delete(step)

    def _set_aside(self, step: int) -> Path:
        """Move an unreadable step directory out of Orbax's sight (kept for inspection; by
        process 0 alone with hardware.distributed)."""
        from fedjax_semi.engine import distributed

        src = self.directory / str(step)
        dst = self.directory / f"{step}.corrupt"
        n = 1
        while dst.exists():
            n += 1
            dst = self.directory / f"{step}.corrupt{n}"
        distributed.barrier("fedjax_semi: before moving a damaged checkpoint")
        if distributed.is_primary():
            src.rename(dst)
        distributed.barrier("fedjax_semi: damaged checkpoint moved")
        with _quiet_orbax():
            self.manager.reload()
        return dst

    def close(self) -> None:
        # Orbax (0.12, locked) starts removing a killed writer's temporary directories in a
        # thread when a manager opens, and awaits it only in save(). A manager opened to
        # restore would leave that thread running into interpreter shutdown, where it fails
        # and prints a traceback after our one error line: await it first.
        self.manager._maybe_await_cleanup_tmp_directory()  # noqa: SLF001
        self.manager.close()


@contextlib.contextmanager
def _quiet_orbax() -> Iterator[None]:
    """Orbax's own ERROR lines off while it reads checkpoints that may be damaged: the damage is
    reported once, as one warning or error line, by Checkpointer.restore_latest."""
    from absl import logging as absl_logging

    level = absl_logging.get_verbosity()
    absl_logging.set_verbosity(absl_logging.FATAL)
    try:
        yield
    finally:
        absl_logging.set_verbosity(level)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def cpu_affinity() -> int | None:
    """The number of CPUs this process may run on (`taskset`, cgroups); None where the OS does
    not say (macOS)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return None


# The vector extensions XLA:CPU compiles for, where they differ between x86 hosts.
CPU_ISA = ("sse4_2", "avx", "avx2", "fma", "f16c",
           "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile")  # fmt: skip


def host_cpu(cpuinfo: str | None = None) -> dict:
    """The host CPU's model name and which of `CPU_ISA` it has (Linux, /proc/cpuinfo; empty
    elsewhere). XLA:CPU compiles for the host's extensions, so the float order of a run, and
    with it every digit after a few rounds, can differ between CPUs: a committed row is
    repeated to the digit only on the CPU its run names (docs/results/ledger.md)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return {}
    fields = dict(
        (k.strip(), v.strip())
        for k, _, v in (line.partition(":") for line in cpuinfo.splitlines())
        if k.strip() in ("model name", "flags") and v
    )
    flags = set(fields.get("flags", "").split())
    return {
        "cpu_model": fields.get("model name"),
        "cpu_isa": [f for f in CPU_ISA if f in flags],
    }


def environment() -> dict:
    """Device and versions, recorded with every result."""
    import flax
    import jax
    import optax

    dev = jax.devices()[0]
    return {
        "platform": dev.platform,
        "device": getattr(dev, "device_kind", str(dev)),
        "device_count": jax.device_count(),
        "cpu_count": os.cpu_count(),
        # XLA:CPU sizes its thread pool by the CPUs this process may use, and the float order
        # of some ops follows it: a rerun is bit-identical only at the same count.
        "cpu_affinity": cpu_affinity(),
        **host_cpu(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "flax": flax.__version__,
        "optax": optax.__version__,
        "numpy": np.__version__,
    }


def plot_curves(rows: list[dict], path: Path, title: str) -> None:
    """Accuracy and training loss against rounds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for key, label in [("global_acc", "global test"), ("personal_acc", "per-client test")]:
        pts = [(r["round"], r[key]) for r in rows if r.get(key) is not None]
        if pts:
            ax1.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=label)
    ax1.set_xlabel("round")
    ax1.set_ylabel("accuracy")
    ax1.grid(alpha=0.3)
    ax1.legend()
    pts = [(r["round"], r["train_loss"]) for r in rows if r.get("train_loss") is not None]
    if pts:
        ax2.plot([p[0] for p in pts], [p[1] for p in pts], color="C3")
    ax2.set_xlabel("round")
    ax2.set_ylabel("local training loss")
    ax2.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


class Checkpoints(Hook):
    """Orbax checkpoints of the state (all replicas in one) in `directory`: every `every` rounds,
    after the last round and when a replica stops; the last good state when the loop ends on
    NaNError or KeyboardInterrupt. A fresh run first deletes an old run's checkpoints (a later
    resume must not find them). `restore` is the loop's restore: the newest intact checkpoint,
    a damaged newer one being moved aside (`Checkpointer.restore_latest`)."""

    def __init__(self, directory: Path, every: int) -> None:
        self.ckpt = Checkpointer(directory)
        self.directory, self.every = self.ckpt.directory, every

    def restore(self, like: PyTree) -> tuple[int, PyTree] | None:
        return self.ckpt.restore_latest(like)

    def start(self, run: Run) -> None:
        if not run.resumed:
            self.ckpt.clear()

    def round(self, run: Run, rnd: int, rows: Rows) -> None:
        stopped = any(run.reasons[r] for r in rows)
        if rnd % self.every == 0 or rnd == run.rounds or stopped:
            self.ckpt.save(rnd, run.state)

    def end(self, run: Run, error: BaseException | None) -> None:
        if isinstance(error, NaNError | KeyboardInterrupt):
            self.ckpt.save(rounds_done(run.state), run.state)  # to resume from or inspect
        self.ckpt.close()
