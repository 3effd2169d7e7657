"""What a run writes: metrics.jsonl, summary.json, Orbax checkpoints, plots."""

from __future__ import annotations

import json
import math
import os
import platform
from pathlib import Path
from typing import Any

import numpy as np

PyTree = Any


def jsonable(v: Any) -> Any:
    """numpy/jax scalars and arrays -> JSON values (NaN -> null)."""
    if isinstance(v, dict):
        return {k: jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [jsonable(x) for x in v]
    a = np.asarray(v)
    if a.ndim > 0:
        return [jsonable(x) for x in a.tolist()]
    x = a.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


class MetricsLog:
    """metrics.jsonl: one JSON object per round, flushed as it is written."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        with self.path.open() as f:
            return [json.loads(line) for line in f if line.strip()]

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


class Checkpointer:
    """Orbax checkpoints of the federated state, keyed by rounds completed."""

    def __init__(self, directory: Path, max_to_keep: int = 2) -> None:
        import orbax.checkpoint as ocp
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.WARNING)  # orbax logs every step at INFO

        self._ocp = ocp
        self.directory = Path(directory).absolute()
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=max_to_keep, create=True, enable_async_checkpointing=False
            ),
        )

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

    def close(self) -> None:
        self.manager.close()


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
