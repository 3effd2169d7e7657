"""The paper groups of `partition` and `systems`: one nested dataclass per paper's knobs
(`partition.dofed`, `.cofed`, `.cfsl`, `.ada`; `systems.wireless`, `.hwn`, `.tx2`), and the
flat keys they replaced (`MOVED_KEYS`), refused with one line naming the new place.

A leaf module (it imports only the checks of `systems/` and `errors`), so `config` builds its
`PartitionConfig` and `SystemsConfig` from these groups. The partition groups' values are checked
with the dataset-free checks of `data/partitions/knobs.py` (`config.check_partition`); the
systems groups check themselves here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from fedjax_semi.errors import ConfigError, bad
from fedjax_semi.systems.hwn_check import WIRELESS_MODES, check_hwn, check_range
from fedjax_semi.systems.tx2_check import check_tx2

# ----------------------------------------------------------------------------- partition groups


@dataclass
class DofedPartition:
    """DoFed-SPP's SUBSET and NORMAL schemes (Ching et al., Sec. 6.1, "Data Distributions").
    [paper]: its value; else ours."""

    n_clusters: int = 5  # SUBSET clusters Kc (the paper's CIFAR-10 example); fixed_total: Q // Kc
    # SUBSET (train, target) cluster pairs: even (train and target clusters both spread evenly)
    # | balanced (even train, uniform target) | random (ours)
    assignment: str = "even"
    train_per_class: int = 500  # per class of the train set ([paper]: 500 C / Kc; ours)
    target_per_class: int = 200  # per target class, 10 labeled + 190 ([paper]: 200 C / Kc; ours)
    target_labeled_fraction: float = 0.05  # labeled share of the target set (10:190) [paper]
    test_per_class: int = 100  # test samples per target class (the paper defines no test set)
    min_classes: int = 2  # NORMAL: k_tr, k_tg ~ U{min..max}, capped at Q [paper]
    max_classes: int = 10
    reject: str = "identical"  # NORMAL redraw: identical | subset (also target ⊆ train)
    size_mode: str = "fixed_total"  # NORMAL sizes: fixed_total (SUBSET's) | per_class
    overlap: str = "allow"  # samples shared across clients: allow (only when short) | none


@dataclass
class CofedPartition:
    """CoFED's partition (Cao et al., Sec. 5.2: CIFAR-100 superclasses as tasks; Sec. 5.3:
    FEMNIST writers)."""

    variant: str = "iid"  # iid | noniid (1..max_subclasses subclasses) | writers
    min_classes: int = 6  # tasks per participant ~ U{min..max} (paper: 6 to 8; U: ours)
    max_classes: int = 8
    samples_per_class: int = 50  # private training samples per owned task (the paper's)
    max_subclasses: int = 2  # non-IID: subclasses per (participant, task) ~ U{1..max}
    # Held-out share of the train split = the server's public set (the paper uses CIFAR-10's
    # train set, see dataset.server_pool; docs/deviations.md, Partitions).
    public_fraction: float = 0.2
    # variant=writers (Sec. 5.3, FEMNIST): the num_clients writers with the most samples are the
    # participants, each with a random train_share of its samples as D_i (0.4, the paper's) and
    # the rest as its test set; Y_i = the classes of D_i (present) or all classes (all: our
    # choice; test rows outside Y_i are dropped with present). Same value as
    # algorithm.label_space for CoFED.
    train_share: float = 0.4
    label_space: str = "present"


@dataclass
class CfslPartition:
    """CFSL's partition (Hamood et al., Sec. VII-A and Table II)."""

    num_edges: int = 3  # edge servers J (Table II); workers joined at random, balanced (ours)
    clusters: int = 2  # latent worker groups (cluster structure to recover)
    # Per-group transform: label_permutation (group 0 identity, others derangements) | rotation
    # (group g: (4 g) // clusters quarter turns) | none (the paper's own setup).
    transform: str = "label_permutation"
    base: str = "shards"  # worker data: shards (classes_per_client) | iid | dirichlet
    local_test_fraction: float = 0.2  # split=pooled: per-worker local test share (80/20)


@dataclass
class AdaPartition:
    """Ada-FedSemi's partition (Xu et al., Sec. 5.2)."""

    variant: str = "noniid"  # iid | noniid (non-IID-zeta, dominant class m mod Q)
    zeta: float = 0.5  # dominant-class share per client (the paper's: 0.5 / 0.6 / 0.75)
    server_unlabeled_size: int = 0  # random subset size of the server pool (0 = all the rest)
    server_unlabeled_extra: bool = False  # the pool also draws on SVHN extra / STL-10 unlabeled
    server_unlabeled_fraction: float = 1.0  # share of the pool kept (Fig. 13), nested subsets


# The partition groups by name (`partition.<name>`).
PARTITION_GROUPS: dict[str, type] = {
    "dofed": DofedPartition,
    "cofed": CofedPartition,
    "cfsl": CfslPartition,
    "ada": AdaPartition,
}


# ----------------------------------------------------------------------------- systems groups


@dataclass
class WirelessSystems:
    """DoFed-SPP's clock (Secs. 3.1 and 6.1): the uplink and the clients' compute."""

    # Uplink rates: empirical (r_i ~ U[rate_mbps] MB/s per upload) | shannon (Eq. 8).
    mode: str = "empirical"
    rate_mbps: list[float] = field(default_factory=lambda: [2.0, 10.0])
    bandwidth_hz: float = 10e6  # shannon: b
    power_w: float = 0.2  # shannon: p
    noise_dbm_hz: float = -174.0  # shannon: N0
    distance_km: list[float] = field(default_factory=lambda: [0.05, 0.5])  # per client
    # Compute: seconds per training sample per epoch and per inference sample (placeholders: the
    # paper timed an RTX 3090; docs/choices.md: DoFed-SPP, compute time).
    time_sec_per_train_sample: float = 2e-4
    time_sec_per_infer_sample: float = 5e-5

    def __post_init__(self) -> None:
        if self.mode not in WIRELESS_MODES:
            raise bad("systems.wireless.mode", self.mode, f"one of {list(WIRELESS_MODES)}")
        check_range("systems.wireless.rate_mbps", self.rate_mbps)
        check_range("systems.wireless.distance_km", self.distance_km)
        for key in ("bandwidth_hz", "power_w"):
            if not getattr(self, key) > 0:
                raise bad(f"systems.wireless.{key}", getattr(self, key), "a number > 0")
        for key in ("time_sec_per_train_sample", "time_sec_per_infer_sample"):
            if not getattr(self, key) >= 0:
                raise bad(f"systems.wireless.{key}", getattr(self, key), "seconds >= 0")


@dataclass
class HwnSystems:
    """CFSL's hierarchical wireless network (Hamood et al., Eqs. 7-16 and 21; read by
    systems/hwn.py, `systems=hwn`). Table II: bandwidth, noise (N0, total over the band), power
    range (dBm, drawn per worker), CPU range, cycles per sample; Sec. VII-A: path-loss exponent,
    g0, d0. Our fills (the paper gives none): distance range, effective capacitance, backhaul
    rate, edge power, fading (rayleigh | none) and the bandwidth share (dedicated = 1/I |
    share_selected = 1/|selected|)."""

    bandwidth_hz: float = 10e6
    noise_w: float = 1e-8
    power_dbm: list[float] = field(default_factory=lambda: [-10.0, 20.0])
    cpu_hz: list[float] = field(default_factory=lambda: [1e9, 9e9])
    cycles_per_sample: float = 20.0
    path_loss_exp: float = 4.0
    g0_db: float = -35.0
    d0_m: float = 2.0
    dist_m: list[float] = field(default_factory=lambda: [2.0, 20.0])
    capacitance: float = 1e-28
    backhaul_bps: float = 1e8
    edge_power_w: float = 1.0
    fading: str = "rayleigh"
    bandwidth_share: str = "dedicated"

    def __post_init__(self) -> None:
        check_hwn(dataclasses.asdict(self))


@dataclass
class Tx2Systems:
    """Ada-FedSemi's heterogeneous Jetson TX2 clients (Sec. 5.8, Table 8; `systems=tx2`, read by
    systems/tx2.py, which says what each constant is; calibrated in docs/choices.md)."""

    speeds: list[float] = field(default_factory=lambda: [1.0, 0.5, 0.75, 0.8, 0.7])
    mode_period: int = 20
    group_shares: list[float] = field(default_factory=lambda: [0.5, 0.25, 0.25])
    group_bw_mbps: list[float] = field(default_factory=lambda: [4.5, 1.5, 0.75])
    bw_sigma: float = 0.3
    overhead_s: float = 5.0
    compute_full_s: float = 15.0

    def __post_init__(self) -> None:
        check_tx2(dataclasses.asdict(self))


SYSTEMS_GROUPS: dict[str, type] = {
    "wireless": WirelessSystems,
    "hwn": HwnSystems,
    "tx2": Tx2Systems,
}


# ----------------------------------------------------------------------------- the moved keys


# The flat name each group knob had before the groups: `<group>_<name>`, or (dofed) `<name>`,
# except these.
_OLD_NAMES = {
    ("dofed", "min_classes"): "normal_min_classes",
    ("dofed", "max_classes"): "normal_max_classes",
    ("dofed", "reject"): "normal_reject",
    ("dofed", "size_mode"): "normal_size_mode",
    ("cofed", "samples_per_class"): "samples_per_class",
    ("cofed", "public_fraction"): "public_fraction",
    ("cfsl", "num_edges"): "num_edges",
    ("cfsl", "local_test_fraction"): "local_test_fraction",
    ("ada", "server_unlabeled_size"): "server_unlabeled_size",
    ("ada", "server_unlabeled_extra"): "server_unlabeled_extra",
    ("ada", "server_unlabeled_fraction"): "server_unlabeled_fraction",
    ("wireless", "time_sec_per_train_sample"): "time_sec_per_train_sample",
    ("wireless", "time_sec_per_infer_sample"): "time_sec_per_infer_sample",
}


def _moved() -> dict[str, str]:
    """Old flat key -> its place in a group (partition.cofed_min_classes ->
    partition.cofed.min_classes), for every knob of every group."""
    moved = {}
    for top, groups in (("partition", PARTITION_GROUPS), ("systems", SYSTEMS_GROUPS)):
        for group, cls in groups.items():
            for f in dataclasses.fields(cls):
                bare = f.name if group == "dofed" else f"{group}_{f.name}"
                old = _OLD_NAMES.get((group, f.name), bare)
                moved[f"{top}.{old}"] = f"{top}.{group}.{f.name}"
    return moved


MOVED_KEYS: dict[str, str] = _moved()


def moved_message(old: str) -> str:
    """The one line for a moved flat key."""
    return f"{old} moved to {MOVED_KEYS[old]}"


def check_moved_override(arg: str) -> None:
    """A command-line override (`partition.cofed_min_classes=3`, `+systems.hwn_noise_w=1e-9`,
    `~partition.ada_zeta`, a sweep's `key=a,b`) that sets an old flat key: ConfigError, one line."""
    key = arg.split("=", 1)[0].lstrip("+~")
    if key in MOVED_KEYS:
        raise ConfigError(moved_message(key))


def check_group_keys(node: Any, group: str, cls: type) -> None:
    """The keys a YAML or an override gave `group` (a composed node, before it becomes `cls`):
    an old flat key says where it moved, another unknown key is refused naming the group's keys.
    (The `partition` and `systems` schemas accept unknown keys at composition so that this, not
    Hydra's multi-line report, is what an old key gets.)"""
    known = {f.name for f in dataclasses.fields(cls)}
    for key in node:
        full = f"{group}.{key}"
        if full in MOVED_KEYS:
            raise ConfigError(moved_message(full))
        if key not in known:
            raise bad(full, node[key], f"a key of {group} ({cls.__name__}): {sorted(known)}")
