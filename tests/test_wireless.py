"""DoFed-SPP's wireless clock (systems/wireless.py, the paper's Secs. 3.1 and 6.1; acceptance
checks AC25, AC26): Shannon rates, upload and compute times, the round clock, the budget
constants, and the one-line errors."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from fedjax_semi.systems import wireless as wl


def test_wireless_bad_arguments_name_the_argument():
    chosen = jnp.ones(3, bool)
    with pytest.raises(ValueError, match=r"mode='lte' is not allowed: one of \['empirical'"):
        wl.round_upload_time(chosen, 2.0, mode="lte")
    with pytest.raises(ValueError, match=r"key=None is not allowed with mode='empirical'"):
        wl.round_upload_time(chosen, 2.0)
    with pytest.raises(ValueError, match=r"rate_mbps=None is not allowed with mode='shannon'"):
        wl.round_upload_time(chosen, 2.0, mode="shannon")
    with pytest.raises(ValueError, match=r"rate_mbps=0.0 is not allowed: rates > 0"):
        wl.round_upload_time(chosen, 2.0, mode="shannon", rate_mbps=0.0)
    with pytest.raises(ValueError, match=r"rate_range=\(5.0, 2.0\) is not allowed"):
        wl.sample_rates(jax.random.PRNGKey(0), (3,), (5.0, 2.0))
    with pytest.raises(ValueError, match=r"model_mb=-1.0 is not allowed"):
        wl.upload_time(-1.0, 2.0)
    with pytest.raises(ValueError, match=r"bandwidth_hz=0.0 is not allowed"):
        wl.shannon_rate(0.0, 1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match=r"distance_km=0.0 is not allowed"):
        wl.path_loss_gain(0.0)
    with pytest.raises(ValueError, match=r"cpu_hz=0 is not allowed"):
        wl.local_compute_time(1, 1, 1, 0)


# ------------------------------------------------------------------------ wireless (AC25, AC26)


def test_shannon_golden_numbers():
    """b = 1 MHz, N0 = 1e-12 W/Hz, g = 1e-5, p = 0.1 W: SNR g p / (N0 b) = 1, so
    r = 1e6 * log2(2) = 1e6 bit/s = 0.125 MB/s and one 1 MB model takes 8 s; K = 3 takes 24 s.
    With p = 0.3 W, SNR = 3, r = 2e6 bit/s and K = 3 takes 12 s."""
    args = (1e6, 1e-5, 0.1, 1e-12)
    # float32 through rounded constants, a product, a ratio and log2: rel 1e-5 (not 1e-6, a
    # few float32 ulps); none of these values is near 0.
    assert float(wl.shannon_rate(*args)) == pytest.approx(1e6, rel=1e-5)
    assert float(wl.shannon_rate_mbps(*args)) == pytest.approx(0.125, rel=1e-5)
    assert float(wl.design_upload_time(3, 1.0, *args)) == pytest.approx(24.0, rel=1e-5)
    assert float(wl.design_upload_time(3, 1.0, 1e6, 1e-5, 0.3, 1e-12)) == pytest.approx(
        12.0, rel=1e-5
    )
    # shannon mode of the round clock: K uploads at the same rate = Eq. 24's K m / r.
    chosen = jnp.asarray([True, False, True, True, False])
    total, per = wl.round_upload_time(
        chosen, 1.0, mode="shannon", rate_mbps=wl.shannon_rate_mbps(*args)
    )
    assert float(total) == pytest.approx(24.0, rel=1e-5)
    np.testing.assert_allclose(per, [8, 0, 8, 8, 0], rtol=1e-5)  # the 0s are exact (where)
    # Spec 3.6's example units: -174 dBm/Hz, and 128.1 dB of path loss at 1 km.
    # abs=0: these values (4e-21, 1.5e-13) are below approx's default abs of 1e-12, which
    # would let any value in [0, 1e-12] pass; float32 10 ** x is good to rel 1e-5 here.
    assert float(wl.dbm_to_watt(-174.0)) == pytest.approx(10**-20.4, rel=1e-5, abs=0)
    assert float(wl.path_loss_gain(1.0)) == pytest.approx(10**-12.81, rel=1e-5, abs=0)
    assert float(wl.path_loss_gain(0.1)) == pytest.approx(10 ** -((128.1 - 37.6) / 10), rel=1e-5)


def test_empirical_upload_times():
    """Each upload takes m / r with r in [2, 10] MB/s, fresh per upload; unchosen clients (and
    the Local baseline, which uploads nothing) add no time; the mean matches m ln(5) / 8."""
    m = 2.1
    chosen = jnp.asarray([True, False, True, True, False, True])
    total, per = wl.round_upload_time(chosen, m, key=jax.random.PRNGKey(0))
    per = np.asarray(per)
    assert float(total) == pytest.approx(per.sum(), rel=1e-5)  # float32 sums, another order
    assert (per[[1, 4]] == 0).all()
    assert ((per[[0, 2, 3, 5]] >= m / 10 - 1e-6) & (per[[0, 2, 3, 5]] <= m / 2 + 1e-6)).all()
    other, _ = wl.round_upload_time(chosen, m, key=jax.random.PRNGKey(1))
    assert float(other) != float(total)  # a fresh draw every round
    none, _ = wl.round_upload_time(jnp.zeros(6, bool), m, key=jax.random.PRNGKey(0))
    assert float(none) == 0.0
    many = np.asarray(wl.sample_rates(jax.random.PRNGKey(2), (200_000,)))
    assert many.min() >= 2.0 and many.max() <= 10.0
    assert np.mean(m / many) == pytest.approx(m * wl.expected_inverse_rate(), rel=0.01)
    # Spec 2.3.3's numbers: E[1/r] = ln 5 / 8 = 0.2012 s/MB, C3 = 0.4225 s for 2.1 MB.
    assert wl.expected_inverse_rate() == pytest.approx(np.log(5) / 8)
    assert m * wl.expected_inverse_rate() == pytest.approx(0.4225, abs=1e-4)
    assert 51.2 * wl.expected_inverse_rate() == pytest.approx(10.30, abs=0.01)
    assert wl.expected_inverse_rate((4.0, 4.0)) == pytest.approx(0.25)


def test_simulated_clock():
    """Phase 0 adds L rounds of training, N uploads and the SR inference; every round adds
    compute plus the chosen uploads, so the clock is strictly increasing."""
    n, m = 5, 2.18
    kw = dict(sec_per_train_sample=1e-3, sec_per_infer_sample=2e-4)
    n_train, n_lab, n_unl = np.array([1000, 800, 1000, 900, 1000]), 20, 380
    comp0 = wl.phase0_compute_time(n_train, n_lab, n, 10, **kw)
    # float32 products and a sum of O(10) s vs float64: rel a few float32 ulps; never near 0.
    assert float(comp0) == pytest.approx(10 * 1000 * 1e-3 + n * 20 * 2e-4, rel=1e-5)
    up0, per0 = wl.round_upload_time(jnp.ones(n, bool), m, key=jax.random.PRNGKey(0))
    assert int((np.asarray(per0) > 0).sum()) == n  # all N clients upload in Phase 0
    clock = wl.advance_clock(0.0, comp0, up0)
    times = [float(clock)]
    rng = np.random.default_rng(0)
    for r in range(1, 6):
        chosen = jnp.asarray(rng.permutation(n) < 2)
        t_up, _ = wl.round_upload_time(chosen, m, key=jax.random.fold_in(jax.random.PRNGKey(1), r))
        t_comp = wl.dofed_compute_time(n_train, n_lab, n_unl, n, 2, **kw)
        clock = jax.jit(wl.advance_clock)(clock, t_comp, t_up)
        # float32 clock of O(10-100) s; rel 1e-5 is far below one round's increment (> 1 s).
        assert float(clock) == pytest.approx(times[-1] + float(t_comp) + float(t_up), rel=1e-5)
        times.append(float(clock))
    assert all(b > a for a, b in itertools.pairwise(times))
    assert bool(wl.over_budget(times[-1], times[-1])) and not bool(
        wl.over_budget(times[-2], times[-1])
    )


def test_dofed_compute_time_matches_formula():
    kw = dict(sec_per_train_sample=1e-3, sec_per_infer_sample=2e-4, epochs_rec=2, epochs_tar=3)
    n_train = np.array([1000, 3000, 2000])
    n_lab = np.array([20, 60, 10])
    n_unl = np.array([380, 100, 190])
    got = float(wl.dofed_compute_time(n_train, n_lab, n_unl, 25, 10, **kw))
    per = [
        n_train[c] * 1e-3 * 2
        + (n_unl[c] + n_lab[c]) * 1e-3 * 3
        + 25 * n_lab[c] * 2e-4
        + 10 * n_unl[c] * 2e-4
        for c in range(3)
    ]
    # The slowest client sets the pace. float32 products and sums of O(10) s vs float64.
    assert got == pytest.approx(max(per), rel=1e-5)


@settings(max_examples=examples(30), deadline=None)
@given(
    st.integers(1, 10),
    st.integers(1, 10),
    st.floats(1.0, 200.0),
    st.floats(0.01, 5.0),
    st.floats(0.0, 2.0),
)
def test_budget_constants_equal_eqs_23_to_25(k, b, round_budget, dist_km, c_pse_giga):
    """B C2 + K C3 <= C1 (Eq. 26) exactly when t^l + t^u <= T / G (Eqs. 23-25)."""
    b = min(b, k)
    comp = dict(iterations=1, cycles_train=2e6, num_samples=1000, cycles_sr=5e8, cpu_hz=1e10)
    radio = dict(
        bandwidth_hz=1e7, gain=wl.path_loss_gain(dist_km), power_w=0.2,
        noise_psd=wl.dbm_to_watt(-174.0),
    )  # fmt: skip
    cycles_pse = c_pse_giga * 1e9
    fixed = wl.design_compute_time(cycles_pse=cycles_pse, b=0, **comp)
    label = cycles_pse / comp["cpu_hz"]
    per_up = wl.design_upload_time(1, 2.18, **radio)
    c1, c2, c3 = wl.budget_constants(round_budget, fixed, label, per_up)
    t_round = wl.design_compute_time(cycles_pse=cycles_pse, b=b, **comp) + wl.design_upload_time(
        k, 2.18, **radio
    )
    lhs = float(b * c2 + k * c3)
    assert lhs == pytest.approx(float(t_round) - float(fixed), rel=1e-4)
    if abs(float(t_round) - round_budget) > 1e-3 * round_budget:  # away from the boundary
        assert (lhs <= float(c1)) == (float(t_round) <= round_budget)


def test_paper_model_formulas():
    assert float(wl.local_compute_time(2, 3e6, 1000, 1e9)) == pytest.approx(6.0)  # Eq. 7
    assert float(wl.total_time(50, 0.5, 4.2)) == pytest.approx(235.0)  # Eq. 12
    assert float(wl.upload_time(2.1, 7.0)) == pytest.approx(0.3)  # Eq. 9
    assert float(wl.compute_time(400, 1e-3, 2)) == pytest.approx(0.8)
    # Spec 3.3: the CIFAR CNN has 545,098 parameters = 2.18 MB of f32.
    assert wl.model_size_mb(545_098) == pytest.approx(2.180392)
    tree = {"a": np.zeros((3, 4)), "b": {"c": np.zeros(5)}}
    assert wl.param_count(tree) == 17
    c1, c2, c3 = wl.budget_constants(10.0, 2.5, 0.5, 1.0)
    assert (float(c1), float(c2), float(c3)) == (7.5, 0.5, 1.0)
