"""CFSL's hierarchical wireless network cost model (Hamood et al.: Eqs. 7-16 and 21; Table II;
the channel of Sec. VII-A), as pure jnp functions over fixed shapes.

Workers upload to their edge server over OFDMA sub-channels (Eqs. 9-11); each edge forwards its
edge and specialized models to the cloud over a wired backhaul (Eq. 14). A round lasts the
slowest edge's slowest selected worker plus that edge's backhaul upload (Eqs. 12, 15); its
energy is the selected workers' compute and upload energy plus the edges' backhaul energy
(Eqs. 13, 16). The paper leaves d_{i,j}, Upsilon, beta, the backhaul rate and the edge power
unspecified: the fills are ours (docs/choices.md: CFSL, the wireless constants the paper
does not give).

Units: seconds, joules, watts, hertz, bits. `C` is the worker axis, `J` the edge axis. Every
array result is float32. `HwnSystem` is frozen and hashable, so it (like `num_edges` and the
string options) is a static argument under `jit`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from fedjax_semi.systems.hwn_check import check_hwn
from fedjax_semi.systems.wireless import dbm_to_watt

_LN2 = 0.6931471805599453


def db_to_linear(x: Any) -> jax.Array:
    """10^(x / 10): -35 dB -> 3.1623e-4."""
    return 10.0 ** (jnp.asarray(x, jnp.float32) / 10.0)


@dataclasses.dataclass(frozen=True)
class HwnSystem:
    """The constants of Sec. 2.10's table. Table II: bandwidth_hz (B), noise_w (N_0, total over
    the band), power_dbm (P_i range), cpu_hz (f_i range), cycles_per_sample (Psi); Sec. VII-A:
    path_loss_exp (upsilon), g0_db, d0_m. Our fills: dist_m, capacitance (Upsilon),
    backhaul_bps (delta_j), edge_power_w (E_j^cld = P_edge T_j^cld), fading, bandwidth_share
    (beta: `dedicated` = 1/I, `share_selected` = 1/|C_r|)."""

    bandwidth_hz: float = 10e6
    noise_w: float = 1e-8
    power_dbm: tuple[float, float] = (-10.0, 20.0)
    cpu_hz: tuple[float, float] = (1e9, 9e9)
    cycles_per_sample: float = 20.0
    path_loss_exp: float = 4.0
    g0_db: float = -35.0
    d0_m: float = 2.0
    dist_m: tuple[float, float] = (2.0, 20.0)
    capacitance: float = 1e-28
    backhaul_bps: float = 1e8
    edge_power_w: float = 1.0
    fading: str = "rayleigh"
    bandwidth_share: str = "dedicated"

    def __post_init__(self) -> None:
        check_hwn(dataclasses.asdict(self))  # the checks of systems.hwn.*, one place
        # Stored as tuples of floats so the instance stays hashable (a static jit argument).
        for name in ("power_dbm", "cpu_hz", "dist_m"):
            pair = tuple(float(v) for v in dataclasses.asdict(self)[name])
            object.__setattr__(self, name, pair)

    @classmethod
    def from_config(cls, cfg: Any) -> HwnSystem:
        """From a `SystemsConfig` (or a `Config`, via its `.systems`): its `hwn` group."""
        group = getattr(cfg, "systems", cfg).hwn
        kwargs = {}
        for f in dataclasses.fields(cls):
            value = getattr(group, f.name)
            kwargs[f.name] = tuple(value) if f.name in ("power_dbm", "cpu_hz", "dist_m") else value
        return cls(**kwargs)


# ----------------------------------------------------------------------------- devices, channel


def draw_devices(key: jax.Array, n: int, sys: HwnSystem) -> dict[str, jax.Array]:
    """Each worker's fixed draws for the run (Eqs. 22e, 22f as sampling bounds) -> dict of f32
    [C]: power_w (uniform in dBm, then in W), cpu_hz (uniform), dist_m (uniform)."""
    k_p, k_f, k_d = jax.random.split(key, 3)
    power_dbm = jax.random.uniform(k_p, (n,), jnp.float32, *sys.power_dbm)
    return {
        "power_w": dbm_to_watt(power_dbm),
        "cpu_hz": jax.random.uniform(k_f, (n,), jnp.float32, *sys.cpu_hz),
        "dist_m": jax.random.uniform(k_d, (n,), jnp.float32, *sys.dist_m),
    }


def path_loss(dist_m: Any, sys: HwnSystem) -> jax.Array:
    """PL = g0 (d0 / d)^upsilon, linear [C]; equals g0 at d = d0."""
    d = jnp.asarray(dist_m, jnp.float32)
    return db_to_linear(sys.g0_db) * (sys.d0_m / d) ** sys.path_loss_exp


def channel_gain(dist_m: Any, key: jax.Array, sys: HwnSystem) -> jax.Array:
    """|h|^2 = PL(d) xi -> f32 [C], with Rayleigh block fading xi ~ Exp(1) drawn from `key` (redraw
    every round) when fading == "rayleigh", xi = 1 when "none" (`key` then unused)."""
    pl = path_loss(dist_m, sys)
    if sys.fading == "none":
        return pl
    return pl * jax.random.exponential(key, pl.shape, jnp.float32)


# ----------------------------------------------------------------------------- per worker


def bandwidth_shares(sel: Any, num_workers: int, sys: HwnSystem) -> jax.Array:
    """beta [C]: `dedicated` = 1/I for everyone (a fixed OFDMA sub-channel per worker);
    `share_selected` = 1/max(|C_r|, 1), the band split among this round's uploaders (Eq. 22g)."""
    sel = jnp.asarray(sel, bool)
    if sys.bandwidth_share == "dedicated":
        return jnp.full(sel.shape, 1.0 / num_workers, jnp.float32)
    n_sel = jnp.maximum(jnp.sum(sel), 1).astype(jnp.float32)
    return jnp.broadcast_to(1.0 / n_sel, sel.shape)


def worker_costs(
    n_samples: Any,
    epochs: Any,
    h2: Any,
    devices: dict[str, jax.Array],
    model_bits: Any,
    beta: Any,
    sys: HwnSystem,
) -> dict[str, jax.Array]:
    """Eqs. 7-11 and 21 per worker -> dict of f32 [C].

    n_samples [C] is D_i, the pool trained on this round (D_i,new after labeling, Eq. 21);
    h2 [C] the channel gain; devices from `draw_devices`; model_bits sigma; beta [C] or scalar.
    Keys: t_cmp = P D Psi / f (Eq. 7/21), e_cmp = (Y/2) P f^2 D Psi (Eq. 8),
    rate = beta B log2(1 + h2 P_i / N0) (Eq. 9: N0 is the whole band's noise and is not scaled by
    beta, as the paper writes it), t_com = sigma / rate (Eq. 10), e_com = P_i t_com (Eq. 11),
    latency = t_cmp + t_com, energy = e_cmp + e_com.
    """
    f32 = jnp.float32
    work = jnp.asarray(epochs, f32) * jnp.asarray(n_samples, f32) * sys.cycles_per_sample
    f = jnp.asarray(devices["cpu_hz"], f32)
    p = jnp.asarray(devices["power_w"], f32)
    t_cmp = work / f
    # (Y f) f rather than Y f^2: keeps the intermediate near 1e-19 instead of 1e-28 * 8e19.
    e_cmp = 0.5 * (sys.capacitance * f) * f * work
    snr = jnp.asarray(h2, f32) * p / sys.noise_w
    # log1p: at the far, faded workers' SNR << 1, float32's 1 + snr would drop most digits.
    rate = jnp.asarray(beta, f32) * sys.bandwidth_hz * (jnp.log1p(snr) / _LN2)
    t_com = jnp.asarray(model_bits, f32) / rate
    e_com = p * t_com
    out = {
        "t_cmp": t_cmp,
        "e_cmp": e_cmp,
        "rate": rate,
        "t_com": t_com,
        "e_com": e_com,
        "latency": t_cmp + t_com,
        "energy": e_cmp + e_com,
    }
    shape = jnp.broadcast_shapes(*(v.shape for v in out.values()))
    return {k: jnp.broadcast_to(v, shape) for k, v in out.items()}


# ----------------------------------------------------------------------------- per round


def round_cost(
    sel: Any,
    edge_of: Any,
    num_edges: int,
    costs: dict[str, jax.Array],
    clusters_per_edge: Any,
    model_bits: Any,
    sys: HwnSystem,
) -> dict[str, jax.Array]:
    """Eqs. 12-16 over the selected workers -> dict of f32.

    sel [C] bool (C_r), edge_of [C] int in [0, J), num_edges J (static), costs from
    `worker_costs`, clusters_per_edge [J] int (models each edge uploads: sigma_j^up = sigma x
    that count), model_bits sigma. Keys ([J] per edge, scalars per round):
    T_edge_workers = max over selected workers of latency (Eq. 12; 0 with none selected),
    E_edge_workers = their energy sum (Eq. 13), T_cld = sigma_j^up / backhaul (Eq. 14),
    E_cld = P_edge T_cld, round_time = max_j (T_cld + T_edge_workers) (Eq. 15),
    round_energy = sum_j (E_edge_workers + E_cld) (Eq. 16), worker_energy = sum_j E_edge_workers.
    """
    sel = jnp.asarray(sel, bool)
    edge_of = jnp.asarray(edge_of, jnp.int32)
    # where() (not a multiply) so a non-selected worker's inf/nan cost cannot leak in.
    lat = jnp.where(sel, jnp.asarray(costs["latency"], jnp.float32), 0.0)
    eng = jnp.where(sel, jnp.asarray(costs["energy"], jnp.float32), 0.0)
    # segment_max gives -inf for an edge with no workers at all: clamp to 0 (costs are >= 0).
    t_edge = jnp.maximum(jax.ops.segment_max(lat, edge_of, num_segments=num_edges), 0.0)
    e_edge = jax.ops.segment_sum(eng, edge_of, num_segments=num_edges)
    cpe = jnp.asarray(clusters_per_edge, jnp.float32)
    t_cld = jnp.broadcast_to(
        jnp.asarray(model_bits, jnp.float32) * cpe / sys.backhaul_bps, (num_edges,)
    )
    e_cld = sys.edge_power_w * t_cld
    return {
        "T_edge_workers": t_edge,
        "E_edge_workers": e_edge,
        "T_cld": t_cld,
        "E_cld": e_cld,
        "round_time": jnp.max(t_cld + t_edge),
        "round_energy": jnp.sum(e_edge + e_cld),
        "worker_energy": jnp.sum(e_edge),
    }
