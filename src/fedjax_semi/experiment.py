"""From a validated config to a running experiment: data, partition, model, algorithm, runner."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import jax
import numpy as np

from fedjax_semi.algorithms import Algorithm, make_algorithm
from fedjax_semi.algorithms.registry import check_config_class
from fedjax_semi.config import Config, bad, model_dropout, parse_chunk, validate
from fedjax_semi.data.federated import FederatedData, build_federated
from fedjax_semi.data.partitions import (
    Partition,
    PartitionFileError,
    apply_client_transforms,
    build_partition,
)
from fedjax_semi.data.partitions.ada import pool_split
from fedjax_semi.data.registry import ArrayDataset, load_dataset, subsample
from fedjax_semi.data.subclusters import with_subclusters
from fedjax_semi.engine import distributed
from fedjax_semi.engine.simulate import Runner
from fedjax_semi.models.zoo import Model, make_model
from fedjax_semi.results.run import simulate
from fedjax_semi.run_config import (  # noqa: F401  (data_seed, check_resume: also used as experiment.*)
    check_resume,
    data_seed,
    write_run_config,
    write_seed_config,
)


@dataclasses.dataclass
class Experiment:
    cfg: Config
    dataset: ArrayDataset
    partition: Partition
    fed: FederatedData
    model: Model
    alg: Algorithm

    def runner(
        self,
        backend: str | None = None,
        chunk: int | str | None = None,
        eval_chunk: int | str | None = None,
        seeds: Sequence[int] | None = None,
        replica_chunk: int | str | None = None,
        seed: int | None = None,
        hparams: dict[str, list[float]] | None = None,
    ) -> Runner:
        """The config's runner; arguments override hardware.*, the seed and the replica seeds.
        `hparams`: each replica's values of traced config keys (the vectorized launcher's)."""
        h = self.cfg.hardware
        return Runner(
            self.alg,
            self.fed,
            backend=backend or h.backend,
            chunk=parse_chunk("hardware.chunk", h.chunk if chunk is None else chunk, auto=True),
            eval_chunk=parse_chunk(
                "hardware.eval_chunk", h.eval_chunk if eval_chunk is None else eval_chunk
            ),
            devices=num_devices(h.devices),
            seed=self.cfg.seed if seed is None else seed,
            seeds=self.replica_seeds() if seeds is None else seeds,
            replica_chunk=parse_chunk(
                "hardware.replica_chunk",
                h.replica_chunk if replica_chunk is None else replica_chunk,
            ),
            hparams=hparams,
        )

    @property
    def key(self) -> jax.Array:
        """The run's key (`seed`), from which every random draw of training derives."""
        return jax.random.PRNGKey(self.cfg.seed)

    def replica_seeds(self) -> list[int] | None:
        """The seeds of the replica axis (`replicas` > 1), or None for a single run."""
        c = self.cfg
        return [c.seed + r for r in range(c.replicas)] if c.replicas > 1 else None


def num_devices(devices: int | str) -> int:
    import jax

    return jax.device_count() if devices == "all" else int(devices)


def make_partition(cfg: Config, ds: ArrayDataset) -> Partition:
    p = cfg.partition
    if p.file:
        return load_partition_file(p.file, ds, cfg.num_clients, p.holdout)
    knobs = {k: v for k, v in dataclasses.asdict(p).items() if k != "file"}  # groups as dicts
    return build_partition(ds, num_clients=cfg.num_clients, seed=data_seed(cfg), **knobs)


# What every scheme's partition holds: client roles and server sets the engine reads.
REQUIRED_ROLES = ("labeled", "test")
REQUIRED_SERVER_SETS = ("test_global",)


def load_partition_file(
    path: str, ds: ArrayDataset, num_clients: int, holdout: float = 0.0
) -> Partition:
    """partition.file, checked against the dataset, num_clients and partition.holdout before
    any work starts: a file that does not fit fails here with one line, not with an index
    error mid-training (or, for holdout, an evaluation on the wrong split)."""
    try:
        part = Partition.load(path)
    except PartitionFileError as e:
        problem = f"{e.problem}; expected a partition .npz as save_partition=true writes"
        raise bad("partition.file", path, problem) from None
    if part.num_clients != num_clients:
        raise bad(
            "partition.file",
            path,
            f"it holds {part.num_clients} clients, num_clients={num_clients}",
        )
    held = float(part.meta.get("holdout", 0.0))  # files written before holdout: none
    if held != holdout:
        raise bad(
            "partition.file",
            path,
            f"it was drawn with holdout={held}, partition.holdout={holdout} (its test role is "
            "the validation split iff holdout > 0)",
        )
    missing = [r for r in REQUIRED_ROLES if r not in part.clients]
    missing += [f"server/{s}" for s in REQUIRED_SERVER_SETS if s not in part.server]
    if missing:
        raise bad("partition.file", path, f"it lacks the roles {missing} every partition has")
    # Indices refer to concat(train, test), and the unlabeled split after them (ada's pool).
    split = pool_split(ds)
    n = len(ds.x_train) + len(ds.x_test) + (len(split[0]) if split is not None else 0)
    sets = {
        f"clients/{r}": np.concatenate([np.zeros(0, np.int64), *v]) for r, v in part.clients.items()
    }
    sets.update({f"server/{s}": v for s, v in part.server.items()})
    for name, idx in sets.items():
        if len(idx) and (idx.min() < 0 or idx.max() >= n):
            raise bad(
                "partition.file",
                path,
                f"{name} has indices {idx.min()}..{idx.max()}, outside [0, {n}) (the "
                f"{len(ds.x_train)} train + {len(ds.x_test)} test examples of {ds.name!r})",
            )
    return part


def client_views(
    ds: ArrayDataset, part: Partition
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test) as the clients see them: per-client label maps and
    rotations of the partition (CFSL's clusters, CoFED's task labels) applied."""
    if not {"label_map", "rotation"} & set(part.assignments):
        return ds.x_train, ds.y_train, ds.x_test, ds.y_test
    n = len(ds.x_train)
    x, y = apply_client_transforms(
        np.concatenate([ds.x_train, ds.x_test]), np.concatenate([ds.y_train, ds.y_test]), part
    )
    return x[:n], y[:n], x[n:], y[n:]


# The server set a cross-dataset pool replaces, per partition scheme.
SERVER_POOL_ROLE = {"ada": "server_unlabeled", "cofed": "public"}


def server_pool(
    cfg: Config, ds: ArrayDataset, first_label: int
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """({server set: images}, {server set: labels}) of the cross-dataset variant
    (dataset.server_pool); labels only with dataset.server_pool_labels, numbered from
    `first_label` (after the task's classes). Both empty without a second dataset."""
    d = cfg.dataset
    if not d.server_pool:
        if d.server_pool_labels:
            raise bad("dataset.server_pool_labels", True, "false without dataset.server_pool")
        return {}, {}
    scheme = cfg.partition.scheme
    if scheme not in SERVER_POOL_ROLE:
        raise bad(
            "dataset.server_pool",
            d.server_pool,
            f"null for partition.scheme={scheme!r}; a second dataset is used by the schemes "
            f"{sorted(SERVER_POOL_ROLE)}",
        )
    other = load_dataset(d.server_pool, d.server_pool_dir)
    x, y = other.x_train, other.y_train
    if "x_unlabeled" in other.side:  # STL-10: its unlabeled split is the pool (Sec. 5.6: 100k)
        if d.server_pool_labels:
            raise bad(
                "dataset.server_pool_labels", True, f"false for {d.server_pool} (unlabeled rows)"
            )
        x = other.side["x_unlabeled"]  # a memory map: only the rows kept below are read
    fraction = cfg.partition.ada.server_unlabeled_fraction if scheme == "ada" else 1.0
    if d.server_pool_size or fraction < 1:
        rng = np.random.default_rng([data_seed(cfg), 7])
        size = min(d.server_pool_size or len(x), len(x))
        if d.server_pool_size:
            order = rng.choice(len(x), size, replace=False)
        else:
            order = rng.permutation(size)
        # Fig. 13: a prefix of one random order, so a smaller share is a subset of a larger one.
        keep = np.sort(order[: int(round(fraction * size))])
        x, y = x[keep], (y[keep] if d.server_pool_labels else y)
    role = SERVER_POOL_ROLE[scheme]
    labels = {role: (np.asarray(y) + first_label).astype(np.int32)} if d.server_pool_labels else {}
    return {role: resize_images(x, ds.x_train.shape[1:])}, labels


def own_pool(ds: ArrayDataset, part: Partition) -> tuple[dict, dict]:
    """({"server_unlabeled": inputs}, {"server_unlabeled": hidden labels}) when the ada pool
    draws on the dataset's own unlabeled split (partition.ada.server_unlabeled_extra): the
    pool's rows, train rows and unlabeled-split rows alike, gathered in index order (only those
    rows of a memory-mapped split are read) and resized to the train images' shape. The labels (-1
    where the split has none) reach evaluation only (pl_acc). Both empty otherwise."""
    n_base = len(ds.x_train) + len(ds.x_test)
    idx = part.server.get("server_unlabeled", np.zeros(0, np.int64))
    if not (idx >= n_base).any():
        return {}, {}
    x_split, y_split = pool_split(ds)
    own, other = idx[idx < len(ds.x_train)], idx[idx >= n_base] - n_base
    x_other = np.asarray(x_split[other])
    if ds.kind == "image":
        x_other = resize_images(x_other, ds.x_train.shape[1:])
    y_other = np.full(len(other), -1) if y_split is None else np.asarray(y_split)[other]
    x = np.concatenate([ds.x_train[own], x_other.astype(ds.x_train.dtype)])
    y = np.concatenate([ds.y_train[own], y_other]).astype(np.int32)
    return {"server_unlabeled": x}, {"server_unlabeled": y}


def resized(ds: ArrayDataset, size: int | None) -> ArrayDataset:
    """The dataset with its train and test images resized to size x size (dataset.image_size;
    STL-10's 96x96 to VGG9's 32x32, so VGG9 keeps its 4096-input FC7); its unlabeled split is
    resized when a pool draws on it. Normalization statistics are kept (bilinear resizing barely
    moves them)."""
    if size is None:
        return ds
    if ds.kind != "image":
        raise bad("dataset.image_size", size, f"null for {ds.name!r} (its inputs are {ds.kind})")
    shape = (size, size, ds.x_train.shape[-1])
    return dataclasses.replace(
        ds, x_train=resize_images(ds.x_train, shape), x_test=resize_images(ds.x_test, shape)
    )


def check_pool(cfg: Config, fed: FederatedData) -> None:
    """Scheme ada: a non-empty server pool, or one line naming the setting that emptied it."""
    if cfg.partition.scheme != "ada" or fed.server["server_unlabeled"].shape[0] > 0:
        return
    p = cfg.partition
    if p.ada.server_unlabeled_fraction < 1:
        raise bad(
            "partition.ada.server_unlabeled_fraction",
            p.ada.server_unlabeled_fraction,
            "a share that keeps at least one sample of the server's unlabeled pool",
        )
    raise bad(
        "partition.labeled_fraction",
        p.labeled_fraction,
        "a share that leaves train samples for the server's unlabeled pool, or set "
        "partition.ada.server_unlabeled_extra=true where the dataset has an unlabeled split",
    )


def resize_images(x: np.ndarray, shape: tuple[int, ...], batch: int = 2048) -> np.ndarray:
    """uint8 [N, h, w, c] -> uint8 [N, *shape]: bilinear resize, grey <-> RGB by mean/repeat."""
    import jax

    h, w, c = shape
    if x.shape[-1] != c:
        x = x.mean(-1, keepdims=True) if c == 1 else np.repeat(x[..., :1], c, axis=-1)
    if x.shape[1:3] == (h, w):
        return np.asarray(x, np.uint8)
    out = [
        np.asarray(jax.image.resize(np.asarray(x[i : i + batch], np.float32),
                                    (len(x[i : i + batch]), h, w, c), "linear"))
        for i in range(0, len(x), batch)
    ]  # fmt: skip
    return np.clip(np.round(np.concatenate(out)), 0, 255).astype(np.uint8)


def num_classes(ds: ArrayDataset, part: Partition) -> int:
    """Classes the model predicts: the dataset's, or the task labels of a label map."""
    label_map = part.assignments.get("label_map")
    if label_map is None or np.size(label_map) == 0:
        return ds.num_classes
    return max(int(np.max(label_map)) + 1, 1)


def build(cfg: Config, dataset: ArrayDataset | None = None) -> Experiment:
    """Validate, load, partition and construct everything a run needs (no training yet).
    With hardware.distributed this process first joins the others (jax.distributed), before
    anything here starts JAX."""
    validate(cfg)
    check_config_class(cfg.algorithm.name, cfg.algorithm)  # a registered method, its own config
    dropout = model_dropout(cfg)
    if cfg.hardware.distributed:
        distributed.initialize()
    d = cfg.dataset
    if d.server_pool and cfg.partition.scheme == "ada" and cfg.partition.ada.server_unlabeled_extra:
        raise bad(
            "partition.ada.server_unlabeled_extra",
            True,
            "false with dataset.server_pool (the second dataset's images are the whole pool)",
        )
    if dataset is not None:
        ds = dataset
    else:
        ds = load_dataset(d.name, d.data_dir, vocab_size=d.vocab_size, seq_len=d.seq_len)
    ds = resized(subsample(ds, d.fraction, data_seed(cfg)), d.image_size)
    if d.subclusters:
        ds = with_subclusters(ds, d.subclusters, data_seed(cfg))
    part = make_partition(cfg, ds)
    k = num_classes(ds, part)
    cross, labels = server_pool(cfg, ds, k)
    own, hidden = own_pool(ds, part)
    fed = build_federated(*client_views(ds, part), part, k, {**cross, **own}, labels, hidden)
    check_pool(cfg, fed)
    m = cfg.model
    model = make_model(
        m.name,
        ds.x_train.shape[1:],
        fed.num_classes,
        mean=ds.mean,
        std=ds.std,
        width=m.width,
        dropout=dropout,
        conv_impl=m.conv,
        hidden=tuple(m.hidden),
        norm=m.norm,
        embed_dim=m.embed_dim,
        conv_kernel=m.conv_kernel,
        dense=m.dense,
        output_scale=m.output_scale,
        vocab_size=ds.vocab_size,
        input_kind=ds.kind,
    )
    alg = make_algorithm(
        cfg.algorithm.name,
        roles=tuple(fed.roles),
        cfg=cfg.algorithm,
        model=model,
        num_clients=cfg.num_clients,
        clients_per_round=cfg.clients_per_round,
        data_seed=data_seed(cfg),
        eval_batch=cfg.hardware.eval_batch,
        systems=cfg.systems,
    )
    return Experiment(cfg, ds, part, fed, model, alg)


def run(exp: Experiment, out_dir: str | Path) -> dict:
    """Train and write the run directory (metrics.jsonl and the other writers' files,
    summary.json, plots, checkpoints)."""
    cfg = exp.cfg
    out = Path(out_dir)
    check_resume(cfg, out)
    out.mkdir(parents=True, exist_ok=True)
    if distributed.is_primary():  # hardware.distributed: process 0 writes the files
        write_run_files(exp, cfg, out)
        for s in exp.replica_seeds() or []:
            write_seed_config(cfg, out, s)
    return train(exp, out, exp.runner())


def write_run_files(exp: Experiment, cfg: Config, out: Path) -> None:
    """What a run directory holds before training: run_config.json (`cfg`'s settings), the
    partition (with save_partition) and its counts."""
    write_run_config(cfg, out)
    if cfg.save_partition:
        exp.partition.save(out / "partition.npz")
    (out / "counts.json").write_text(
        json.dumps({k: v.tolist() for k, v in exp.partition.counts().items()})
    )


def train(exp: Experiment, out: Path, runner: Runner, dirs: list[Path] | None = None) -> dict:
    """`simulate` with the config's loop settings (rounds, evaluations, checkpoints, stop rules,
    writers); `dirs`: the replicas' run directories (a vectorized sweep's jobs)."""
    cfg = exp.cfg
    return simulate(
        exp.alg,
        exp.fed,
        rounds=cfg.rounds,
        out_dir=out,
        runner=runner,
        eval_every=cfg.eval_every,
        eval_initial=cfg.eval_initial,
        eval_every_time=cfg.eval_every_time,
        checkpoint_every=cfg.checkpoint_every,
        resume=cfg.resume,
        stop=cfg.stop,
        progress=cfg.progress,
        title=f"{cfg.algorithm.name} on {cfg.dataset.name} ({cfg.partition.scheme})",
        writers=cfg.writers,
        dirs=dirs,
    )
