"""DoFed-SPP's wireless and time model (Ching et al., IEEE TSC 2023: Sec. 3.1, Eqs. 7-9 and
12-13; Sec. 4.4, Eqs. 23-26; the experiments' upload rates, Sec. 6.1) and the simulated clock,
as pure functions. Where the paper gives only symbols, the constants are ours (docs/choices.md:
DoFed-SPP, the clock of Phase 0, compute time, and Eq. 24 and the upload-rate model).

Units: seconds, model sizes in MB (10^6 bytes), upload rates in MB/s, Shannon rates in bit/s,
bandwidth in Hz, powers in W, noise as a power spectral density in W/Hz. Uploads serialize on the
shared uplink; clients compute in parallel, so a round's compute time is the slowest client's.
Per-client arrays lead with `[N]`; scalars broadcast.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_semi.engine.pytrees import PyTree

BYTES_PER_MB = 1e6  # m in MB of 10^6 bytes (the paper's sizes, Sec. 6.1, are approximate)
BITS_PER_MB = 8 * BYTES_PER_MB
RATE_MBPS = (2.0, 10.0)  # Sec. 6.1: per-upload rate ~ U[2, 10] MB/s
MODES = ("empirical", "shannon")


def _check_number(name: str, value: Any, ok, allowed: str) -> None:
    try:
        v = np.asarray(value)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return  # traced: the caller validated the config
    if not bool(np.all(ok(v))):
        raise ValueError(f"{name}={value!r} is not allowed: {allowed}")


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is not allowed: one of {list(MODES)}")


def _check_rate_range(rate_range: tuple[float, float]) -> None:
    lo, hi = rate_range
    if not 0 < lo <= hi:
        raise ValueError(f"rate_range={rate_range!r} is not allowed: need 0 < low <= high (MB/s)")


# ----------------------------------------------------------------------------- model size


def param_count(params: PyTree) -> int:
    """Number of scalars in one model's parameters (not stacked over clients)."""
    return int(sum(np.size(leaf) for leaf in jax.tree.leaves(params)))


def model_size_mb(num_params: int, bytes_per_param: int = 4) -> float:
    """m = param count x bytes per parameter, in MB of 10^6 bytes (Eq. 9's model size m)."""
    _check_number("num_params", num_params, lambda v: v >= 0, "an int >= 0")
    _check_number("bytes_per_param", bytes_per_param, lambda v: v > 0, "an int > 0")
    return num_params * bytes_per_param / BYTES_PER_MB


# ----------------------------------------------------------------------------- paper model


def local_compute_time(
    iterations: Any, cycles_per_sample: Any, num_samples: Any, cpu_hz: Any
) -> jax.Array:
    """Eq. 7: t^l = I * C * D / f seconds."""
    _check_number("cpu_hz", cpu_hz, lambda v: v > 0, "a number > 0 (cycles per second)")
    return jnp.asarray(iterations) * cycles_per_sample * num_samples / cpu_hz


def dbm_to_watt(dbm: Any) -> jax.Array:
    """10^(dBm / 10) mW in W (also dBm/Hz to W/Hz): -174 dBm/Hz -> ~3.98e-21 W/Hz."""
    return 10.0 ** ((jnp.asarray(dbm, jnp.float32) - 30.0) / 10.0)


def path_loss_gain(
    distance_km: Any, intercept_db: float = 128.1, slope_db: float = 37.6
) -> jax.Array:
    """Channel gain g = 10^(-PL/10) with PL = 128.1 + 37.6 log10(d_km) dB, a common macro-cell
    path-loss model; the paper gives g only as a symbol."""
    _check_number("distance_km", distance_km, lambda v: v > 0, "a distance > 0 in km")
    pl_db = intercept_db + slope_db * jnp.log10(jnp.asarray(distance_km, jnp.float32))
    return 10.0 ** (-pl_db / 10.0)


def shannon_rate(bandwidth_hz: Any, gain: Any, power_w: Any, noise_psd: Any) -> jax.Array:
    """Eq. 8: r = b log2(1 + g p / (N0 b)) in bit/s. noise_psd N0 is in W/Hz."""
    _check_number("bandwidth_hz", bandwidth_hz, lambda v: v > 0, "a number > 0 (Hz)")
    _check_number("noise_psd", noise_psd, lambda v: v > 0, "a number > 0 (W/Hz)")
    _check_number("power_w", power_w, lambda v: v >= 0, "a number >= 0 (W)")
    _check_number("gain", gain, lambda v: v >= 0, "a number >= 0")
    b = jnp.asarray(bandwidth_hz, jnp.float32)
    return b * jnp.log2(1.0 + gain * power_w / (noise_psd * b))


def shannon_rate_mbps(bandwidth_hz: Any, gain: Any, power_w: Any, noise_psd: Any) -> jax.Array:
    """Eq. 8 in MB/s, the unit of the empirical mode (Sec. 6.1's rates are 2-10 MB/s)."""
    return shannon_rate(bandwidth_hz, gain, power_w, noise_psd) / BITS_PER_MB


def upload_time(model_mb: Any, rate_mbps: Any) -> jax.Array:
    """Eq. 9: t^u = m / r for one model, seconds."""
    _check_number("model_mb", model_mb, lambda v: v >= 0, "a size >= 0 in MB")
    _check_number("rate_mbps", rate_mbps, lambda v: v > 0, "a rate > 0 in MB/s")
    return jnp.asarray(model_mb, jnp.float32) / rate_mbps


def design_compute_time(
    iterations: Any,
    cycles_train: Any,
    num_samples: Any,
    cycles_sr: Any,
    b: Any,
    cycles_pse: Any,
    cpu_hz: Any,
) -> jax.Array:
    """Eq. 23: t^l = (I C_tra D + C_SR + B C_pse) / f, identical devices."""
    _check_number("cpu_hz", cpu_hz, lambda v: v > 0, "a number > 0 (cycles per second)")
    work = jnp.asarray(iterations, jnp.float32) * cycles_train * num_samples
    return (work + cycles_sr + b * cycles_pse) / cpu_hz


def design_upload_time(
    k: Any, model_mb: Any, bandwidth_hz: Any, gain: Any, power_w: Any, noise_psd: Any
) -> jax.Array:
    """Eq. 24 literally: t^u = K m / (b log2(1 + g p / (N0 b))). The K uploaders share b, yet b
    (not b / K) stays inside the log, as printed. m in MB,
    result in seconds."""
    rate = shannon_rate(bandwidth_hz, gain, power_w, noise_psd)
    return jnp.asarray(k, jnp.float32) * model_mb * BITS_PER_MB / rate


def total_time(rounds: Any, t_compute: Any, t_upload: Any) -> jax.Array:
    """Eq. 12: T_n = G (t^l + t^u); Eq. 13 asks T_n <= T."""
    return jnp.asarray(rounds, jnp.float32) * (jnp.asarray(t_compute) + t_upload)


def expected_inverse_rate(rate_range: tuple[float, float] = RATE_MBPS) -> float:
    """E[1/r] for r ~ U[low, high] MB/s: ln(high / low) / (high - low) s/MB (ln 5 / 8 for 2-10)."""
    _check_rate_range(rate_range)
    lo, hi = (float(v) for v in rate_range)
    return 1.0 / lo if hi == lo else float(np.log(hi / lo) / (hi - lo))


def budget_constants(
    round_budget_s: Any, fixed_compute_s: Any, label_s_per_model: Any, upload_s_per_model: Any
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Eq. 26's (C1, C2, C3): B C2 + K C3 <= C1 is Ineq. 25 with Eqs. 23-24 rearranged.

    round_budget_s = T / G; fixed_compute_s = (I C_tra D + C_SR) / f (the compute that does not
    grow with B: `design_compute_time(..., b=0, ...)` or `dofed_compute_time(..., b=0)`);
    label_s_per_model = C_pse / f; upload_s_per_model = m / r (Shannon: `design_upload_time(1,
    ...)`; empirical: m * `expected_inverse_rate()`, the expected upload time at random rates).
    """
    _check_number("label_s_per_model", label_s_per_model, lambda v: v >= 0, "seconds >= 0")
    _check_number("upload_s_per_model", upload_s_per_model, lambda v: v >= 0, "seconds >= 0")
    c1 = jnp.asarray(round_budget_s, jnp.float32) - fixed_compute_s
    return c1, jnp.asarray(label_s_per_model, jnp.float32), jnp.asarray(upload_s_per_model)


# ----------------------------------------------------------------------------- simulated clock


def sample_rates(
    key: jax.Array, shape: tuple[int, ...], rate_range: tuple[float, float] = RATE_MBPS
) -> jax.Array:
    """Empirical upload rates r ~ U[low, high] MB/s, one fresh draw per upload (Sec. 6.1)."""
    _check_rate_range(rate_range)
    lo, hi = rate_range
    return jax.random.uniform(key, shape, jnp.float32, lo, hi)


def round_upload_time(
    chosen: jax.Array,
    model_mb: Any,
    *,
    mode: str = "empirical",
    key: jax.Array | None = None,
    rate_range: tuple[float, float] = RATE_MBPS,
    rate_mbps: Any = None,
) -> tuple[jax.Array, jax.Array]:
    """Upload time of one round: sum over the chosen i of m / r_i (uploads serialize on the
    shared uplink).

    chosen [N] bool. mode "empirical": r_i ~ U[rate_range] MB/s, drawn afresh from `key` for
    every client (fold the round into the key). mode "shannon": rate_mbps (scalar or [N], from
    `shannon_rate_mbps`); with one rate for all this is Eq. 24's K m / r.
    Returns (total seconds, per-client seconds [N], 0 where not chosen).
    """
    _check_mode(mode)
    _check_number("model_mb", model_mb, lambda v: v >= 0, "a size >= 0 in MB")
    chosen = jnp.asarray(chosen, bool)
    if mode == "empirical":
        if key is None:
            raise ValueError("key=None is not allowed with mode='empirical': pass a PRNG key")
        rates = sample_rates(key, chosen.shape, rate_range)
    else:
        if rate_mbps is None:
            raise ValueError("rate_mbps=None is not allowed with mode='shannon': pass MB/s")
        _check_number("rate_mbps", rate_mbps, lambda v: v > 0, "rates > 0 in MB/s")
        rates = jnp.broadcast_to(jnp.asarray(rate_mbps, jnp.float32), chosen.shape)
    per_client = jnp.where(chosen, jnp.asarray(model_mb, jnp.float32) / rates, 0.0)
    return jnp.sum(per_client), per_client


def compute_time(n_samples: Any, sec_per_sample: Any, passes: Any = 1) -> jax.Array:
    """Analytic compute time passes * n * seconds per sample, in place of Eq. 7's I C D / f
    (the paper timed an RTX 3090; a vmapped simulation cannot time one client)."""
    _check_number("sec_per_sample", sec_per_sample, lambda v: v >= 0, "seconds >= 0")
    return jnp.asarray(passes, jnp.float32) * n_samples * sec_per_sample


def dofed_compute_time(
    n_train: Any,
    n_lab: Any,
    n_unl: Any,
    n_providers: int,
    b: Any,
    *,
    sec_per_train_sample: Any,
    sec_per_infer_sample: Any,
    epochs_rec: Any = 1,
    epochs_tar: Any = 1,
) -> jax.Array:
    """Compute time of one DoFed-SPP round (Eq. 23's terms), the slowest client's (devices run
    in parallel):

        t_train(|D_tr|) E_rec + t_train(|D_unl| + |D_lab|) E_tar + t_infer(N |D_lab|)
        + t_infer(B |D_unl|)

    n_train, n_lab, n_unl: per-client valid counts [N] or scalars; n_providers: the N models
    scored for the SRs; b: labeling models per client.
    """
    train = compute_time(n_train, sec_per_train_sample, epochs_rec)
    student = compute_time(jnp.asarray(n_unl) + n_lab, sec_per_train_sample, epochs_tar)
    sr = compute_time(jnp.asarray(n_lab) * n_providers, sec_per_infer_sample)
    label = compute_time(jnp.asarray(n_unl) * b, sec_per_infer_sample)
    return jnp.max(train + student + sr + label)


def phase0_compute_time(
    n_train: Any,
    n_lab: Any,
    n_providers: int,
    warmup_rounds: Any,
    *,
    sec_per_train_sample: Any,
    sec_per_infer_sample: Any,
    epochs_rec: Any = 1,
) -> jax.Array:
    """Phase 0's compute (Algorithm 2 lines 1-12): L t_train(|D_tr|) E_rec + t_infer(N |D_lab|),
    slowest client. Its N uploads come from `round_upload_time` with every client chosen; both
    count on the clock (the paper does not say whether its time curves include them)."""
    _check_number("warmup_rounds", warmup_rounds, lambda v: v >= 0, "an int >= 0")
    warm = compute_time(n_train, sec_per_train_sample, jnp.asarray(warmup_rounds) * epochs_rec)
    sr = compute_time(jnp.asarray(n_lab) * n_providers, sec_per_infer_sample)
    return jnp.max(warm + sr)


def advance_clock(clock: Any, t_compute: Any, t_upload: Any = 0.0) -> jax.Array:
    """clock + t_compute + t_upload: compute in parallel, then the serialized uploads."""
    return jnp.asarray(clock, jnp.float32) + t_compute + t_upload


def over_budget(clock: Any, time_budget_s: Any) -> jax.Array:
    """TTAP stop rule (Sec. 6.1): True once the simulated clock reaches the budget."""
    return jnp.asarray(clock) >= time_budget_s
