"""Heterogeneous Jetson TX2 clients (Xu et al., "Enhancing Federated Learning with Server-Side
Unlabeled Data by Adaptive Client and Data Selection", Sec. 5.8 and Table 8): the simulated time
a client needs to train and exchange a (sub-)model, for Ada-FedSemi and HeteroAda-FedSemi on one
clock. The paper states the structure (five power modes, mode 0 about 2x faster than mode 1,
modes redrawn every 20 rounds; 10 / 5 / 5 clients at 2 / 10 / 20 m from one Wi-Fi router with
fluctuating bandwidth) but no speeds or bandwidths; the constants are our calibration
(docs/choices.md: Ada-FedSemi, the heterogeneous clients):

    t^cp_{k,m}(d) = t_ovh + t_full (load_d / load_L) / speed[mode_m(k)]      (training, s)
    t^cm_{k,m}(d) = directions * size_d[MB] / bw_m(k)[MB/s]                  (broadcast + upload)
    mode_m(k) ~ U{0 .. #modes - 1}, one draw per mode period (rounds 1-20, 21-40, ...; the
                profiling at k = 0 sees the draw of rounds 1-20)
    bw_m(k)   = bw_group(m) LogNormal(-sigma^2 / 2, sigma) (mean bw_group), one draw per round

The fixed overhead t_ovh is counted in the training time a client reports (Eq. 24's t^cp).
Every draw is stateless: a function of (seed key, purpose, round), so Ada-FedSemi and
HeteroAda-FedSemi with one seed meet the same devices and channel. `[M]`: every client.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_semi.engine.keys import TX2_BANDWIDTH, TX2_MODE, round_key
from fedjax_semi.systems.tx2_check import check_tx2

BYTES_PER_MB = 1e6


@dataclasses.dataclass(frozen=True)
class Tx2System:
    """The constants of `systems.tx2.*` (conf/systems/tx2.yaml): speeds (relative training
    speed of each power mode; mode 0 = 1), mode_period (rounds), group_shares and
    group_bw_mbps (the distance groups: share of the clients, mean bandwidth in MB/s),
    bw_sigma (lognormal sigma), overhead_s (t_ovh), compute_full_s (t_full in mode 0)."""

    speeds: tuple[float, ...] = (1.0, 0.5, 0.75, 0.8, 0.7)
    mode_period: int = 20
    group_shares: tuple[float, ...] = (0.5, 0.25, 0.25)
    group_bw_mbps: tuple[float, ...] = (4.5, 1.5, 0.75)
    bw_sigma: float = 0.3
    overhead_s: float = 5.0
    compute_full_s: float = 15.0

    def __post_init__(self) -> None:
        check_tx2(dataclasses.asdict(self))
        for name in ("speeds", "group_shares", "group_bw_mbps"):  # hashable: a static argument
            object.__setattr__(self, name, tuple(float(v) for v in getattr(self, name)))

    @classmethod
    def from_config(cls, cfg: Any) -> Tx2System:
        """From a `SystemsConfig` (or a `Config`, via its `.systems`): its `tx2` group."""
        group = getattr(cfg, "systems", cfg).tx2
        return cls(**{f.name: getattr(group, f.name) for f in dataclasses.fields(cls)})


def client_groups(num_clients: int, shares: tuple[float, ...]) -> np.ndarray:
    """Each client's distance group, int32 [M]: the first round(s_0 M) clients in group 0, the
    next in group 1, ... (M = 20 with shares 0.5 / 0.25 / 0.25: 10, 5, 5 clients)."""
    ends = np.floor(np.cumsum(shares) * num_clients + 0.5).astype(int)
    return np.searchsorted(ends, np.arange(num_clients), side="right").astype(np.int32)


def modes(sys: Tx2System, key: jax.Array, rnd: jax.Array, num_clients: int) -> jax.Array:
    """Each client's power mode in round rnd (0: the profiling before round 1), int32 [M]."""
    period = jnp.maximum(jnp.asarray(rnd, jnp.int32) - 1, 0) // sys.mode_period
    k = round_key(key, TX2_MODE, period)
    return jax.random.randint(k, (num_clients,), 0, len(sys.speeds)).astype(jnp.int32)


def mean_bandwidth_mbps(sys: Tx2System, num_clients: int) -> jax.Array:
    """Each client's mean bandwidth, its distance group's, MB/s float32 [M]."""
    group = jnp.asarray(client_groups(num_clients, sys.group_shares))
    return jnp.asarray(sys.group_bw_mbps, jnp.float32)[group]


def bandwidth_mbps(sys: Tx2System, key: jax.Array, rnd: jax.Array, num_clients: int) -> jax.Array:
    """Each client's bandwidth in round rnd, MB/s float32 [M] (mean: its group's)."""
    z = jax.random.normal(round_key(key, TX2_BANDWIDTH, rnd), (num_clients,))
    factor = jnp.exp(sys.bw_sigma * z - 0.5 * sys.bw_sigma**2)
    return mean_bandwidth_mbps(sys, num_clients) * factor


def client_times(
    sys: Tx2System,
    key: jax.Array,
    rnd: jax.Array,
    num_clients: int,
    load_frac: Any,
    size_bytes: Any,
    directions: int = 2,
    mean_bandwidth: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """(t^cp, t^cm) float32 [M] seconds of every client in round rnd, for the (sub-)model each
    would train: load_frac [M] (or [], broadcast) its training load over the full model's
    (Table 9: load_d / load_L), size_bytes [M] (or []) its size, exchanged `directions` times.
    mean_bandwidth: at its group's mean bandwidth instead of the round's draw (a nominal time)."""
    speed = jnp.asarray(sys.speeds, jnp.float32)[modes(sys, key, rnd, num_clients)]
    t_cp = sys.overhead_s + sys.compute_full_s * jnp.asarray(load_frac, jnp.float32) / speed
    if mean_bandwidth:
        bw = mean_bandwidth_mbps(sys, num_clients)
    else:
        bw = bandwidth_mbps(sys, key, rnd, num_clients)
    t_cm = directions * (jnp.asarray(size_bytes, jnp.float32) / BYTES_PER_MB) / bw
    return t_cp, t_cm
