"""Structured configs and validation.

Every group of `conf/` is typed by one dataclass: here, except each method's, which extends
`AlgorithmConfig` beside its method in `fedjax_semi/algorithms/` (`store.py` registers them all
with Hydra's ConfigStore), so a misspelt key fails at composition. A group's own values are
checked in its `__post_init__`, the cross-group ones in `validate`, before any work starts; both
raise `ConfigError` with the key, the value and what is allowed (`errors.bad`).
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar

from fedjax_semi.config_groups import (
    AdaPartition,
    CfslPartition,
    CofedPartition,
    DofedPartition,
    HwnSystems,
    Tx2Systems,
    WirelessSystems,
)
from fedjax_semi.engine.clients import COHORT_SAMPLERS
from fedjax_semi.engine.train import optimizer_names
from fedjax_semi.errors import ConfigError, bad

BASELINE_TRAIN_DATA = ("train_and_lab", "train")


@dataclass
class AlgorithmConfig:
    """The knobs every method shares; each method's config extends it (beside the method, in
    `fedjax_semi/algorithms/`) and is stored in Hydra's ConfigStore as `schema/algorithm/<name>`,
    so a knob another method owns fails at composition, naming the key."""

    name: str = "fedavg"
    # Local training: epochs over the client's training role, or a fixed number of steps.
    local_epochs: int = 1
    local_steps: int = 0  # used when local_epochs == 0
    batch_size: int = 32
    optimizer: str = "sgd"  # any optax alias: sgd, adam, adamw, rmsprop, ...
    lr: float = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0
    # How a round's cohort is drawn (engine/clients.py `select_cohort`): auto | permutation |
    # floyd. auto = permutation (O(N log N)) up to 1000 clients, Floyd's O(S^2) draw above.
    cohort_sampler: str = "auto"
    # The dropout rate this method trains with (UM-pFSSL needs MC dropout, its baselines run
    # without), so one sweep over algorithms gives each its own; null = model.dropout.
    model_dropout: float | None = None
    # On DoFed-SPP's tasks (partition subset | normal), what its baselines (fedavg, local,
    # fedfomo, fedbe) train on: train_and_lab (D_train + D_lab, every label a client holds) |
    # train (D_train only); docs/choices.md: DoFed-SPP, the baselines' details.
    baseline_train_data: str = "train_and_lab"
    # The keys whose values a vectorized sweep (hydra/launcher=vectorized) gives each run of one
    # compiled program as traced scalars: they enter the round's arithmetic only, never a shape
    # or a Python branch (tests/test_vectorized.py traces each method's round with each). A
    # method's config adds its own.
    traceable: ClassVar[tuple[str, ...]] = ("lr",)

    def __post_init__(self) -> None:
        e, s = self.local_epochs, self.local_steps
        if e < 0 or s < 0 or (e == 0 and s == 0):
            raise bad(
                "algorithm.local_epochs", e, "an integer >= 1, or 0 with algorithm.local_steps >= 1"
            )
        if self.batch_size < 1:
            raise bad("algorithm.batch_size", self.batch_size, "an integer >= 1")
        if self.optimizer not in optimizer_names():
            raise bad(
                "algorithm.optimizer", self.optimizer, f"an optax optimizer: {optimizer_names()}"
            )
        if not self.lr > 0:
            raise bad("algorithm.lr", self.lr, "a number > 0")
        if self.cohort_sampler not in COHORT_SAMPLERS:
            raise bad(
                "algorithm.cohort_sampler", self.cohort_sampler, f"one of {list(COHORT_SAMPLERS)}"
            )
        if self.model_dropout is not None and not 0 <= self.model_dropout < 1:
            raise bad("algorithm.model_dropout", self.model_dropout, "a rate in [0, 1), or null")
        if self.baseline_train_data not in BASELINE_TRAIN_DATA:
            raise bad(
                "algorithm.baseline_train_data",
                self.baseline_train_data,
                f"one of {list(BASELINE_TRAIN_DATA)}",
            )


@dataclass
class DatasetConfig:
    name: str = "fashion_mnist"
    data_dir: str | None = None
    # Cross-dataset variants (Ada-FedSemi Sec. 5.6, Fig. 13a; CoFED Sec. 5.2's public set): the
    # train images of this second dataset, resized to the first's shape, replace the server's
    # unlabeled/public pool.
    server_pool: str | None = None
    server_pool_dir: str | None = None
    server_pool_size: int = 0  # random subset of the second dataset (0 = all of it)
    # Keep the second dataset's labels, visible, as classes K .. K+P-1 after the task's K (FedMD's
    # labeled public set, its Sec. 2); false = an unlabeled pool.
    server_pool_labels: bool = False
    image_size: int | None = None  # resize images to image_size^2 (STL-10 -> 32); null = as stored
    # Text datasets: vocabulary size (incl. padding and unknown ids) and sequence length.
    vocab_size: int = 20000
    seq_len: int = 128
    # Keep a random share of the official train and test sets (per class, seeded by `data_seed`,
    # or `seed`), for reduced-scale runs with the paper's participation per client; 1.0 = all of it.
    fraction: float = 1.0
    # k-means sub-clusters per class as subclasses (data/subclusters.py): the classes become
    # coarse tasks with k subclasses each, as CIFAR-100's superclasses (CoFED's non-IID
    # stand-in on Fashion-MNIST); 0 = off.
    subclusters: int = 0


@dataclass
class PartitionConfig:
    # iid | dirichlet | shards | subset | normal (DoFed-SPP) | cofed | cfsl | ada (Ada-FedSemi)
    scheme: str = "dirichlet"
    alpha: float = 0.5
    classes_per_client: int = 2
    # Per-client labeled share; ada: share of the train split forming the clients' labeled pool.
    labeled_fraction: float = 0.1
    labeled_mode: str = "fixed"  # fixed | dirichlet (per-client ratio ~ Dir_2(label_ratio_alpha))
    label_ratio_alpha: float = 0.5
    split: str = "official"  # official | pooled (70/10/20 of train+test; cfsl: per-worker split)
    val_fraction: float = 0.0  # ada: share of the test split forming server_val
    min_client_size: int = 10
    # Each paper scheme's own knobs, in a group of its own (config_groups.py says what each is).
    dofed: DofedPartition = field(default_factory=DofedPartition)  # subset | normal
    cofed: CofedPartition = field(default_factory=CofedPartition)
    cfsl: CfslPartition = field(default_factory=CfslPartition)
    ada: AdaPartition = field(default_factory=AdaPartition)
    file: str | None = None  # load a saved partition (.npz) instead of drawing one
    # Validation split for tuning (fedjax-semi-tune): > 0 holds this share of every client's
    # training rows out, by class, and evaluates on them IN PLACE of the test split (the
    # client's `test` role, the server's `test_global`); the test split is then only listed as
    # withheld. Every scheme; the roles per scheme: data/partitions/holdout.py.
    holdout: float = 0.0


@dataclass
class ModelConfig:
    name: str = "cnn"
    width: float = 1.0
    dropout: float = 0.0
    conv: str = "im2col"  # im2col | auto (im2col under a vmap over clients, else lax) | lax | xla
    hidden: list[int] = field(default_factory=lambda: [200, 200])
    norm: str = "batch"
    embed_dim: int = 64  # text models: embedding width
    conv_kernel: int = 5  # cnn: square kernel size (DoFed-SPP's net: 3)
    dense: int = 512  # cnn: dense layer width (DoFed-SPP's net: 128)
    output_scale: float = 1.0  # resnet9: logits x this (the Myrtle ResNet-9's 0.125)


@dataclass
class HardwareConfig:
    """The schema of conf/hardware/*.yaml; its defaults are the `cpu` preset's (a test holds them
    equal), so a config built without Hydra runs like `hardware=cpu`."""

    name: str = "cpu"
    # Clients mapped per vmap chunk: a positive integer, "all" (pure vmap) or "auto" (the fastest
    # of a few sizes, timed on the first round; see engine/simulate.py `Runner._tune`).
    chunk: Any = 1
    eval_chunk: Any = 1
    eval_batch: int = 1000
    # jit: one compiled program per round; reference: a Python loop of per-client jitted steps.
    backend: str = "jit"
    devices: Any = 1  # number of devices the client axis is sharded over, or "all"
    # With replicas > 1: seeds mapped per chunk, like clients ("all": one vmap; 1: a loop).
    replica_chunk: Any = 1
    # XLA's persistent compilation cache (compile_cache.py): "auto" is $JAX_COMPILATION_CACHE_DIR
    # or ${XDG_CACHE_HOME:-~/.cache}/fedjax_semi/xla; a directory; or "off". A repeated job
    # loads its compiled programs instead of compiling them.
    compile_cache: Any = "auto"
    # Several processes (hosts) through jax.distributed (engine/distributed.py): the client axis
    # sharded over every process's devices; needs devices "all", chunk "all", backend jit.
    distributed: bool = False


@dataclass
class StopConfig:
    metric: str = "accuracy"
    patience: int = 0  # 0 = no early stopping
    min_rounds: int = 0
    target: float | None = None  # stop once the metric reaches this value
    # DoFed-SPP's FA rule: stop once |m_r - m_{r-1}| < plateau for `patience` evaluations in a
    # row (after min_rounds); patience then counts plateaued evaluations, not ones without a gain.
    plateau: float | None = None
    sim_time: float | None = None  # stop once the simulated clock reaches this many seconds (TTAP)


@dataclass
class SystemsConfig:
    """The simulated devices and network (`systems/`): what a round costs in seconds.

    The DoFed-SPP clock (its Secs. 3.1 and 6.1): a round lasts the slowest participant's compute
    plus the serialized uploads m / r_i; DoFed-SPP, its baselines and the FedAvg family on its
    tasks read it. Methods that keep no clock ignore it.
    """

    name: str = "wireless"
    # Each clock's constants, in a group of its own (config_groups.py says what each is).
    wireless: WirelessSystems = field(default_factory=WirelessSystems)  # DoFed-SPP's
    hwn: HwnSystems = field(default_factory=HwnSystems)  # CFSL's, systems=hwn
    tx2: Tx2Systems = field(default_factory=Tx2Systems)  # Ada-FedSemi's TX2s, systems=tx2


@dataclass
class Config:
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    stop: StopConfig = field(default_factory=StopConfig)
    systems: SystemsConfig = field(default_factory=SystemsConfig)
    seed: int = 0
    # The seed of the data (partition, subsample, server pool); null = `seed`. Fix it to vary
    # only the training randomness (model init, cohort sampling, dropout) across seeds.
    data_seed: int | None = None
    # Seeds seed, seed+1, ..., seed+replicas-1 of one experiment as ONE compiled program (a
    # leading replica axis; the data come from `data_seed`, or `seed`, and are shared). Each seed
    # writes its own run directory, seed_<s>/, under the run's.
    replicas: int = 1
    rounds: int = 30
    num_clients: int = 100
    clients_per_round: int = 10
    eval_every: int = 1
    # Evaluate each time the simulated clock passes a multiple of this many seconds instead
    # (null: every eval_every rounds), so methods whose rounds last differently are evaluated
    # equally often on one clock (DoFed-SPP's Local against the uploading methods).
    eval_every_time: float | None = None
    eval_initial: bool = False  # also evaluate the state before round 1 (after warm-up): round 0
    checkpoint_every: int = 5
    resume: bool = False
    progress: bool = True
    # Metric writers, each writing into every run directory (results/writers.py): jsonl
    # (metrics.jsonl; always on: resume and fedjax-semi-report read it), tensorboard
    # (tensorboard/), mlflow (mlruns/, MLflow's local SQLite store; needs the mlflow package).
    writers: list[str] = field(default_factory=lambda: ["jsonl", "tensorboard"])
    out_dir: str | None = None  # defaults to Hydra's run directory
    save_partition: bool = True
    # The final metric the run returns to Hydra (what a sweeper such as Optuna optimises).
    objective: str = "accuracy"
    # Experiment presets may carry the paper's numbers for fedjax-semi-report.
    paper: Any = None
    # Values fedjax-semi-tune chose, [{where: {key: value}, set: {key: value}}, ...] (a preset
    # loads them from conf/tuned/<preset>.yaml); the app applies the matching entries' `set`
    # unless the command line gives the key (fedjax_semi/tuned.py).
    tuned: Any = None


# Final metrics a run can return as its objective: the last evaluation's accuracies and loss,
# and the best accuracy seen (summary.json's `final` and `best_accuracy`).
OBJECTIVES = ("accuracy", "global_acc", "personal_acc", "pl_acc", "train_loss", "best_accuracy")


# The metric writers `writers` may name (results/writers.py `WRITERS`).
WRITERS = ("jsonl", "tensorboard", "mlflow")


def check_writers(writers: Any) -> None:
    """The `writers` checks of `validate`: known names, each once, jsonl among them, and mlflow
    only where it is installed."""
    import importlib.util

    names = list(writers) if isinstance(writers, list | tuple) else writers
    if not isinstance(names, list) or any(w not in WRITERS for w in names):
        raise bad("writers", names, f"a list of names from {list(WRITERS)}")
    if len(set(names)) != len(names):
        raise bad("writers", names, "a list naming each writer once")
    if "jsonl" not in names:
        raise bad("writers", names, "a list with 'jsonl' (resume and fedjax-semi-report read it)")
    if "mlflow" in names and importlib.util.find_spec("mlflow") is None:
        raise bad("writers", names, "'mlflow' needs the mlflow package: pip install mlflow")


def parse_chunk(key: str, value: Any, auto: bool = False) -> int | str:
    """A chunk size: a positive integer, 'all', or (where `auto`) 'auto'."""
    allowed = "a positive integer, 'all' or 'auto'" if auto else "a positive integer or 'all'"
    if isinstance(value, str) and (value == "all" or (auto and value == "auto")):
        return value
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise bad(key, value, allowed) from None
    if n < 1 or str(n) != str(value).strip():
        raise bad(key, value, allowed)
    return n


def check_partition(p: PartitionConfig) -> None:
    """The `partition.*` checks of `validate` (those that need no dataset)."""
    from fedjax_semi.data.partitions import PAPER_DEFAULTS, SCHEMES, check_knobs
    from fedjax_semi.data.partitions.holdout import check_holdout

    if p.scheme not in SCHEMES:
        raise bad("partition.scheme", p.scheme, f"one of {list(SCHEMES)}")
    if not p.alpha > 0:
        raise bad("partition.alpha", p.alpha, "a number > 0")
    if not 0 < p.labeled_fraction <= 1:
        raise bad("partition.labeled_fraction", p.labeled_fraction, "a number in (0, 1]")
    if p.labeled_mode not in ("fixed", "dirichlet"):
        raise bad("partition.labeled_mode", p.labeled_mode, "one of ['fixed', 'dirichlet']")
    if not p.label_ratio_alpha > 0:
        raise bad("partition.label_ratio_alpha", p.label_ratio_alpha, "a number > 0")
    if p.split not in ("official", "pooled"):
        raise bad("partition.split", p.split, "one of ['official', 'pooled']")
    if not 0 <= p.val_fraction < 1:
        raise bad("partition.val_fraction", p.val_fraction, "a number in [0, 1)")
    try:
        check_knobs(p.scheme, {g: dataclasses.asdict(getattr(p, g)) for g in PAPER_DEFAULTS})
        check_holdout(p.scheme, p.holdout, p.split, p.val_fraction)
    except ValueError as e:
        raise ConfigError(str(e)) from None


class SettingReplaced(UserWarning):
    """A value of the config that the method replaces with its own (the CLI: one line)."""


def model_dropout(cfg: Config) -> float:
    """The model's dropout rate: the method's own algorithm.model_dropout when it sets one
    (model.dropout then 0 or the same rate), said when it replaces model.dropout."""
    rate, own = cfg.model.dropout, cfg.algorithm.model_dropout
    if own is None or rate == own:
        return rate
    if rate != 0.0:
        raise bad("model.dropout", rate, f"0 or algorithm.model_dropout={own} (both are set)")
    msg = f"model.dropout=0.0 is replaced by algorithm.model_dropout={own} (the rate "
    warnings.warn(msg + f"{cfg.algorithm.name} trains with)", SettingReplaced, stacklevel=2)
    return own


def validate(cfg: Config) -> None:
    """Check every value a run needs before any data is loaded."""
    from fedjax_semi.data.registry import dataset_names, is_known_dataset
    from fedjax_semi.models.zoo import model_names

    p, h = cfg.partition, cfg.hardware
    if not is_known_dataset(cfg.dataset.name):
        raise bad("dataset.name", cfg.dataset.name, f"one of {dataset_names()} or tfds:NAME")
    if not 0 < cfg.dataset.fraction <= 1:
        raise bad("dataset.fraction", cfg.dataset.fraction, "a share in (0, 1]")
    size = cfg.dataset.image_size
    if size is not None and not (isinstance(size, int) and size >= 1):
        raise bad("dataset.image_size", size, "an integer >= 1 (pixels a side), or null")
    if not (isinstance(cfg.dataset.subclusters, int) and cfg.dataset.subclusters >= 0):
        raise bad("dataset.subclusters", cfg.dataset.subclusters, "an integer >= 0 (0 = off)")
    if cfg.model.name not in model_names():
        raise bad("model.name", cfg.model.name, f"one of {model_names()}")
    if cfg.num_clients < 1:
        raise bad("num_clients", cfg.num_clients, "an integer >= 1")
    if not 1 <= cfg.clients_per_round <= cfg.num_clients:
        raise bad(
            "clients_per_round",
            cfg.clients_per_round,
            f"an integer in [1, num_clients={cfg.num_clients}]",
        )
    if cfg.rounds < 1:
        raise bad("rounds", cfg.rounds, "an integer >= 1")
    if cfg.objective not in OBJECTIVES:
        raise bad("objective", cfg.objective, f"one of {list(OBJECTIVES)}")
    check_writers(cfg.writers)
    if not (isinstance(cfg.replicas, int) and cfg.replicas >= 1):
        raise bad("replicas", cfg.replicas, "an integer >= 1")
    if cfg.replicas > 1 and h.backend != "jit":
        raise bad(
            "replicas",
            cfg.replicas,
            "1 with hardware.backend=reference (replicas are one compiled program)",
        )
    for key in ("eval_every", "checkpoint_every"):
        if getattr(cfg, key) < 1:
            raise bad(key, getattr(cfg, key), "an integer >= 1")
    if cfg.eval_every_time is not None and not cfg.eval_every_time > 0:
        raise bad("eval_every_time", cfg.eval_every_time, "a number of seconds > 0, or null")
    check_partition(p)
    space = getattr(cfg.algorithm, "label_space", None)  # CoFED's Y_i
    writers = p.scheme == "cofed" and p.cofed.variant == "writers"
    if writers and space is not None and space != p.cofed.label_space:
        raise bad(
            "algorithm.label_space",
            space,
            f"{p.cofed.label_space!r} as partition.cofed.label_space (the label spaces the "
            "participants train in and the test rows they keep must agree)",
        )
    chunk = parse_chunk("hardware.chunk", h.chunk, auto=True)
    parse_chunk("hardware.eval_chunk", h.eval_chunk)
    parse_chunk("hardware.replica_chunk", h.replica_chunk)
    if h.backend not in ("jit", "reference"):
        raise bad("hardware.backend", h.backend, "one of ['jit', 'reference']")
    if not (h.devices == "all" or (isinstance(h.devices, int) and h.devices >= 1)):
        raise bad("hardware.devices", h.devices, "a positive integer or 'all'")
    if chunk == "auto" and h.backend != "jit":
        allowed = "a positive integer or 'all' with hardware.backend=reference"
        raise bad("hardware.chunk", h.chunk, allowed)
    if not isinstance(h.distributed, bool):
        raise bad("hardware.distributed", h.distributed, "true or false")
    if h.distributed and h.backend != "jit":
        allowed = "false with hardware.backend=reference (the processes share one compiled round)"
        raise bad("hardware.distributed", True, allowed)
    if h.distributed and h.devices != "all":
        allowed = "'all' with hardware.distributed=true (the mesh spans every process's devices)"
        raise bad("hardware.devices", h.devices, allowed)
    if h.devices != 1 and chunk != "all":
        raise bad("hardware.chunk", h.chunk, "'all' when the client axis is sharded (devices != 1)")
    if isinstance(h.devices, int) and cfg.clients_per_round % h.devices:
        raise bad(
            "clients_per_round",
            cfg.clients_per_round,
            f"a multiple of hardware.devices={h.devices}",
        )
    if cfg.stop.metric not in ("accuracy", "global_acc", "personal_acc"):
        raise bad(
            "stop.metric", cfg.stop.metric, "one of ['accuracy', 'global_acc', 'personal_acc']"
        )
    if cfg.stop.patience < 0:
        raise bad("stop.patience", cfg.stop.patience, "an integer >= 0")
    if cfg.stop.plateau is not None and not (cfg.stop.plateau > 0 and cfg.stop.patience >= 1):
        raise bad("stop.plateau", cfg.stop.plateau, "a float > 0 together with stop.patience >= 1")
    if cfg.stop.sim_time is not None and not cfg.stop.sim_time > 0:
        raise bad("stop.sim_time", cfg.stop.sim_time, "a number of seconds > 0")
