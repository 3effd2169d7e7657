"""The wireless uplink a method composes for its simulated clock (DoFed-SPP, Sec. III: uploads
to the base station serialize; a round's upload time is the sum over the uploaders of m / r_i).

Two rate models (`systems.wireless.mode`):
* empirical: every upload's rate r_i ~ U[rate_mbps] MB/s, drawn afresh each round from
  the run's key (purpose UPLOAD, folded with the round);
* shannon: each client has one fixed Eq. 8 rate at a distance ~ U[distance_km], drawn
  once at `init_state` (purpose CHANNEL), so a client has the same channel under every method.

A method keeps `init_state`'s `UplinkState` in its own state and hands it back to `upload_time`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_semi.config import SystemsConfig
from fedjax_semi.engine.keys import CHANNEL, UPLOAD, round_key
from fedjax_semi.systems import wireless


@struct.dataclass
class UplinkState:
    """What the uplink keeps from round to round.

    rate_mbps: float32 [N] every client's fixed Eq. 8 rate in MB/s (shannon mode); None in
        empirical mode, whose rates are drawn afresh each round.
    """

    rate_mbps: jax.Array | None = None


@dataclasses.dataclass(frozen=True)
class Uplink:
    """Upload times of a model of `model_mb` MB over the uplink (pure; keys are arguments)."""

    mode: str  # "empirical" | "shannon"
    model_mb: float
    rate_mbps: tuple[float, float]  # empirical: U[lo, hi] MB/s per upload
    bandwidth_hz: float  # shannon: b
    power_w: float  # shannon: p
    noise_dbm_hz: float  # shannon: N0
    distance_km: tuple[float, float]  # shannon: per-client distance ~ U[lo, hi]

    @classmethod
    def from_config(cls, cfg: SystemsConfig, model_mb: float) -> Uplink:
        return cls(
            mode=cfg.wireless.mode,
            model_mb=model_mb,
            rate_mbps=tuple(cfg.wireless.rate_mbps),
            bandwidth_hz=cfg.wireless.bandwidth_hz,
            power_w=cfg.wireless.power_w,
            noise_dbm_hz=cfg.wireless.noise_dbm_hz,
            distance_km=tuple(cfg.wireless.distance_km),
        )

    def shannon_rates(self, key: jax.Array, n: int) -> jax.Array:
        """Eq. 8 rates in MB/s [N], client i at a fixed distance ~ U[distance_km]."""
        lo, hi = self.distance_km
        dist = jax.random.uniform(round_key(key, CHANNEL, 0), (n,), jnp.float32, lo, hi)
        return wireless.shannon_rate_mbps(
            self.bandwidth_hz,
            wireless.path_loss_gain(dist),
            self.power_w,
            wireless.dbm_to_watt(self.noise_dbm_hz),
        )

    def init_state(self, key: jax.Array, n: int) -> UplinkState:
        """What the uplink keeps in a method's state: the fixed rates [N] in shannon mode,
        nothing in empirical mode."""
        if self.mode == "shannon":
            return UplinkState(rate_mbps=self.shannon_rates(key, n))
        return UplinkState()

    def upload_time(
        self, key: jax.Array, chosen: jax.Array, t: jax.Array | int, state: UplinkState
    ) -> tuple[jax.Array, jax.Array]:
        """Round t's uploads, chosen [N] bool -> (sum of m / r_i, per-client seconds [N], 0
        where not chosen). `state` is `init_state`'s."""
        if self.mode == "empirical":
            return wireless.round_upload_time(
                chosen, self.model_mb, key=round_key(key, UPLOAD, t), rate_range=self.rate_mbps
            )
        return wireless.round_upload_time(
            chosen, self.model_mb, mode="shannon", rate_mbps=state.rate_mbps
        )

    def mean_upload_time(self, state: UplinkState) -> jax.Array:
        """The expected seconds of one upload (DoFed-SPP's budget constant C3, Eq. 26)."""
        if self.mode == "empirical":
            return self.model_mb * wireless.expected_inverse_rate(self.rate_mbps)
        return jnp.mean(self.model_mb / state.rate_mbps)
