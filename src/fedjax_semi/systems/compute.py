"""The clients' compute time (DoFed-SPP, Sec. III's time model): n samples cost n seconds-per-
sample, per training epoch or per inference; clients compute in parallel, so a phase lasts its
slowest participant's time."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from fedjax_semi.config import SystemsConfig
from fedjax_semi.systems import wireless


@dataclasses.dataclass(frozen=True)
class Compute:
    """Seconds per training sample (per epoch) and per inference sample (pure)."""

    sec_per_train_sample: float
    sec_per_infer_sample: float

    @classmethod
    def from_config(cls, cfg: SystemsConfig) -> Compute:
        w = cfg.wireless
        return cls(w.time_sec_per_train_sample, w.time_sec_per_infer_sample)

    def slowest(self, n_train: jax.Array, epochs: int, n_infer: jax.Array | int = 0) -> jax.Array:
        """The slowest participant's epochs * t_train(n_train) + t_infer(n_infer); [S] -> []."""
        train = wireless.compute_time(n_train, self.sec_per_train_sample, epochs)
        infer = wireless.compute_time(n_infer, self.sec_per_infer_sample)
        return jnp.max(train + infer)
