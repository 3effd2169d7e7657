"""``fedjax-semi-data``: inspect datasets and partitions without training.

fedjax-semi-data list                          every dataset: found where, or where it looked
fedjax-semi-data check NAME [--data-dir D]     load it; shapes, dtypes, class counts, mean/std
fedjax-semi-data describe [overrides] [--out DIR]
                                               the partition `fedjax-semi [overrides]` would
                                               use: per-client counts, class heatmap PNG, .npz
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Any

import numpy as np

PROG = "fedjax-semi-data"


def _fail(msg: str, code: int = 2) -> int:
    print(f"{PROG}: error: {msg}", file=sys.stderr)
    return code


# ----------------------------------------------------------------------------- list


def cmd_list() -> int:
    """Prints one line per registered dataset: found (where) or missing (where it looked)."""
    from fedjax_semi.data import registry

    width = max(len(n) for n in registry.dataset_names())
    for name in registry.dataset_names():
        try:
            where = registry.locate(name)
            print(f"{name:<{width}}  found    {where}")
        except registry.DatasetNotFoundError as e:
            looked = ", ".join(str(d) for d in e.looked_in) or str(e).splitlines()[0]
            print(f"{name:<{width}}  missing  looked in: {looked}")
        except ValueError as e:  # e.g. a malformed file: report it, keep listing
            print(f"{name:<{width}}  error    {str(e).splitlines()[0]}")
    has_tfds = importlib.util.find_spec("tensorflow_datasets") is not None
    state = "installed" if has_tfds else "not installed: pip install 'fedjax-semi[tfds]'"
    pattern = f"{registry.TFDS_PREFIX}NAME"
    print(
        f"{pattern:<{width}}  pattern  any dataset prepared by tensorflow-datasets in "
        f"array_record format (tensorflow-datasets {state})"
    )
    pattern = f"{registry.NPZ_PREFIX}PATH"
    print(
        f"{pattern:<{width}}  pattern  your own .npz file: x_train, y_train, x_test, y_test "
        "(+ client_train, client_test); docs/datasets.md"
    )
    return 0


# ----------------------------------------------------------------------------- check


def _split_summary(label: str, x: np.ndarray, y: np.ndarray, num_classes: int) -> str:
    counts = np.bincount(y, minlength=num_classes) if len(y) else np.zeros(num_classes, int)
    return (
        f"{label}: x {x.dtype} {list(x.shape)}, y {y.dtype} {list(y.shape)}\n"
        f"  class counts: {counts.tolist()}"
    )


def cmd_check(name: str, data_dir: str | None) -> int:
    """Loads ``name`` and prints shapes, dtypes, class counts and channel statistics."""
    from fedjax_semi.data import registry

    try:
        ds = registry.load_dataset(name, data_dir)
    except registry.DatasetNotFoundError as e:
        return _fail(str(e), code=1)
    except ValueError as e:
        return _fail(str(e))
    print(f"{ds.name}: {ds.kind}, {ds.num_classes} classes")
    print(_split_summary("train", ds.x_train, ds.y_train, ds.num_classes))
    print(_split_summary("test", ds.x_test, ds.y_test, ds.num_classes))
    print(f"mean: {[round(m, 4) for m in ds.mean]}")
    print(f"std:  {[round(s, 4) for s in ds.std]}")
    if ds.vocab_size is not None:
        print(f"vocab_size: {ds.vocab_size}")
    for key, value in ds.side.items():
        if isinstance(value, np.ndarray):
            print(f"side[{key!r}]: {value.dtype} {list(value.shape)}")
        else:
            print(f"side[{key!r}]: {type(value).__name__}")
    return 0


# ----------------------------------------------------------------------------- describe


def _compose(overrides: list[str]) -> Any:
    """The validated config ``fedjax-semi`` would run with ``overrides``."""
    from hydra import compose, initialize_config_dir

    from fedjax_semi.cli import CONF_DIR
    from fedjax_semi.config import validate
    from fedjax_semi.store import as_config, register_configs

    if not (CONF_DIR / "config.yaml").exists():
        raise ValueError(
            f"no Hydra configs at {CONF_DIR}; set FEDJAX_SEMI_CONF to the repo's conf/ folder"
        )
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        node = compose("config", overrides=overrides)
    cfg = as_config(node)
    validate(cfg)
    return cfg


def partition_table(part: Any, labels: np.ndarray) -> str:
    """A fixed-width table: one row per client (sample counts per role and the number of
    classes in its training data), then total/min/median/max rows.

    Args:
      part: a :class:`~fedjax_semi.data.partitions.Partition`.
      labels: ``int [N]`` labels of ``concat(train, test)`` (what partition indices index).
    """
    roles = list(part.clients)
    counts = part.counts()
    train_classes = np.array(
        [len(np.unique(labels[idx])) for idx in _train_indices(part)], dtype=np.int64
    )
    cols = [*roles, "classes"]
    table = np.stack([*(counts[r] for r in roles), train_classes], axis=1)  # [C, len(cols)]
    w = max(9, *(len(c) + 2 for c in cols))
    lines = [f"{'client':>8}" + "".join(f"{c:>{w}}" for c in cols)]
    for k, row in enumerate(table):
        lines.append(f"{k:>8}" + "".join(f"{v:>{w}d}" for v in row))
    lines.append("-" * len(lines[0]))
    stats = {
        "total": table.sum(axis=0),
        "min": table.min(axis=0),
        "median": np.median(table, axis=0),
        "max": table.max(axis=0),
    }
    for label, values in stats.items():
        cells = [f"{_fmt(v):>{w}}" for v in values]
        if label == "total":
            cells[-1] = f"{'':>{w}}"  # a sum of per-client class counts means nothing
        lines.append(f"{label:>8}" + "".join(cells))
    return "\n".join(lines)


def _fmt(v: float) -> str:
    # Medians of an even number of clients can be x.5; everything else is a whole count.
    return str(int(v)) if float(v).is_integer() else f"{float(v):.1f}"


def _train_indices(part: Any) -> list[np.ndarray]:
    """Per-client training data: labeled ∪ unlabeled indices."""
    return [
        np.concatenate([part.clients[r][k] for r in ("labeled", "unlabeled") if r in part.clients])
        for k in range(part.num_clients)
    ]


def class_histograms(
    part: Any, labels: np.ndarray, num_classes: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(train, test)`` count matrices ``int64 [C, num_classes]`` per client and class;
    train counts labeled ∪ unlabeled, test the client's ``"test"`` role (zeros if absent)."""
    train = np.stack([np.bincount(labels[i], minlength=num_classes) for i in _train_indices(part)])
    tests = part.clients.get("test", [np.empty(0, np.int64)] * part.num_clients)
    test = np.stack([np.bincount(labels[i], minlength=num_classes) for i in tests])
    return train, test


def plot_heatmap(train: np.ndarray, test: np.ndarray, path: Path, title: str) -> None:
    """Writes the two class-histogram heatmaps (clients x classes) side by side as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    num_clients, num_classes = train.shape
    height = min(12.0, 2.5 + 0.12 * num_clients)
    width = min(16.0, 4.0 + 0.25 * num_classes) * 2
    fig, axes = plt.subplots(1, 2, figsize=(width, height), constrained_layout=True)
    for ax, counts, name in (
        (axes[0], train, "train (labeled + unlabeled)"),
        (axes[1], test, "test"),
    ):
        im = ax.imshow(counts, aspect="auto", interpolation="nearest", cmap="viridis")
        ax.set_xlabel("class")
        ax.set_ylabel("client")
        ax.set_title(f"{name}: samples per class")
        fig.colorbar(im, ax=ax, label="count")
    fig.suptitle(title)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def cmd_describe(overrides: list[str], out: Path) -> int:
    """Composes the config, builds its partition, prints the table and writes the plot."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from fedjax_semi import experiment
    from fedjax_semi.data.registry import DatasetNotFoundError, load_dataset

    try:
        cfg = _compose(overrides)
        d = cfg.dataset
        ds = load_dataset(d.name, d.data_dir, vocab_size=d.vocab_size, seq_len=d.seq_len)
        part = experiment.make_partition(cfg, ds)
    except DatasetNotFoundError as e:
        return _fail(str(e), code=1)
    except (ValueError, HydraException, OmegaConfBaseException) as e:
        # ConfigError is a ValueError; Hydra errors come from bad override syntax or keys.
        return _fail(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
    labels = np.concatenate([ds.y_train, ds.y_test])
    p = cfg.partition
    title = (
        f"{d.name}: {cfg.num_clients} clients, {p.scheme}"
        + (f" (alpha={p.alpha})" if p.scheme == "dirichlet" else "")
        + f", labeled_fraction={p.labeled_fraction}, seed={experiment.data_seed(cfg)}"
    )
    print(title)
    print(partition_table(part, labels))
    out.mkdir(parents=True, exist_ok=True)
    train, test = class_histograms(part, labels, ds.num_classes)
    plot_heatmap(train, test, out / "partition.png", title)
    part.save(out / "partition.npz")
    print(f"wrote {out / 'partition.png'} and {out / 'partition.npz'}")
    return 0


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``fedjax-semi-data``; returns (and as a script exits with) the code."""
    ap = argparse.ArgumentParser(prog=PROG, description="Inspect datasets and partitions.")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="every registered dataset: found where, or where it looked")
    check = sub.add_parser("check", help="load a dataset; print shapes, class counts, mean/std")
    check.add_argument("name")
    check.add_argument("--data-dir", default=None)
    describe = sub.add_parser(
        "describe", help="the partition a run with these Hydra overrides would use"
    )
    describe.add_argument("overrides", nargs="*", help="Hydra overrides, as for fedjax-semi")
    describe.add_argument("--out", type=Path, default=Path("."), help="output folder")
    args = ap.parse_args(argv)
    if args.command == "list":
        return cmd_list()
    if args.command == "check":
        return cmd_check(args.name, args.data_dir)
    return cmd_describe(args.overrides, args.out)


if __name__ == "__main__":
    sys.exit(main())
