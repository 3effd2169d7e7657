"""The uplink's typed state (systems/uplink.py): what `init_state` returns in each rate model,
how `upload_time` and `mean_upload_time` read it, and that it travels as a pytree (jit,
replica stacking). The Eq. 8 rates and the round clock themselves are tested in
test_wireless.py; the methods' use of them in test_dofed_spp.py,
test_dofed_spp_options.py and test_dofed_baselines_config.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_semi.engine.keys import UPLOAD, round_key
from fedjax_semi.systems import wireless as wl
from fedjax_semi.systems.uplink import Uplink, UplinkState

N, MB = 5, 2.0


def uplink(mode: str) -> Uplink:
    return Uplink(
        mode=mode,
        model_mb=MB,
        rate_mbps=(2.0, 10.0),
        bandwidth_hz=1e7,
        power_w=0.2,
        noise_dbm_hz=-174.0,
        distance_km=(0.05, 0.5),
    )


def test_empirical_state_is_empty_and_rates_are_drawn_per_round():
    up, key = uplink("empirical"), jax.random.PRNGKey(0)
    state = up.init_state(key, N)
    assert isinstance(state, UplinkState) and state.rate_mbps is None
    assert jax.tree.leaves(state) == []
    chosen = jnp.asarray([True, False, True, True, False])
    total, per = jax.jit(up.upload_time)(key, chosen, jnp.int32(3), state)
    rates = np.asarray(wl.sample_rates(round_key(key, UPLOAD, 3), (N,), (2.0, 10.0)))
    want = np.where(np.asarray(chosen), MB / rates, 0.0)
    np.testing.assert_allclose(per, want, rtol=1e-6)
    assert float(total) == pytest.approx(want.sum(), rel=1e-6)
    other, _ = up.upload_time(key, chosen, 4, state)  # another round, other rates
    assert float(other) != pytest.approx(float(total), rel=1e-6)
    # E[m / r] for r ~ U[2, 10]: m ln(5) / 8.
    assert float(up.mean_upload_time(state)) == pytest.approx(MB * np.log(5) / 8, rel=1e-6)


def test_shannon_state_holds_fixed_rates_read_every_round():
    up, key = uplink("shannon"), jax.random.PRNGKey(1)
    state = up.init_state(key, N)
    rates = np.asarray(state.rate_mbps)
    assert rates.shape == (N,) and rates.dtype == np.float32
    np.testing.assert_array_equal(rates, up.shannon_rates(key, N))
    chosen = jnp.asarray([False, True, True, False, True])
    for t in (1, 7):  # the same channel every round
        total, per = jax.jit(up.upload_time)(key, chosen, jnp.int32(t), state)
        want = np.where(np.asarray(chosen), MB / rates, 0.0)
        np.testing.assert_allclose(per, want, rtol=1e-6)
        assert float(total) == pytest.approx(want.sum(), rel=1e-6)
    assert float(up.mean_upload_time(state)) == pytest.approx(np.mean(MB / rates), rel=1e-6)
    # Replicas stack states on a leading axis; each replica's slice is a state of its own.
    other = up.init_state(jax.random.PRNGKey(2), N)
    stacked = jax.tree.map(lambda *a: jnp.stack(a), state, other)
    assert isinstance(stacked, UplinkState) and stacked.rate_mbps.shape == (2, N)
    assert not np.array_equal(stacked.rate_mbps[0], stacked.rate_mbps[1])
