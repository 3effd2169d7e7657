"""DoFed-SPP's baselines FedFomo and FedBE on the tiny SUBSET setup of dofed_setups.py, built but
not trained: bad config values name the key and what is allowed, a missing role is named, the
seed changes the partition and the init, and systems.wireless.mode=shannon gives DoFed-SPP's
channels."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from conftest import compose_config
from dofed_setups import BE, FOMO, N, S, leaves_equal
from fedjax_semi import experiment
from fedjax_semi.algorithms import fedbe as fb
from fedjax_semi.algorithms import fedfomo as ff
from fedjax_semi.errors import ConfigError


@pytest.fixture(scope="module")
def fomo():
    return (experiment.build(compose_config(*FOMO)),)


@pytest.fixture(scope="module")
def be():
    return (experiment.build(compose_config(*BE)),)


BAD = [
    ("fedfomo", "fedfomo_m", N, r"\[1, num_clients - 1 = 5\]"),
    ("fedfomo", "fedfomo_epsilon", 1.5, r"\[0, 1\]"),
    ("fedfomo", "fedfomo_epsilon_decay", -0.1, ">= 0"),
    ("fedfomo", "fedfomo_affinity", "softmax", "'raw', 'normalized'"),
    ("fedfomo", "sr_eps", 0.0, "> 0"),
    ("fedfomo", "baseline_train_data", "all", "'train_and_lab', 'train'"),
    ("fedfomo", "local_epochs", 0, ">= 1"),
    ("fedbe", "fedbe_pool", "public", "'train_split', 'clients_unlabeled', 'server'"),
    ("fedbe", "fedbe_target", "medium", "'soft', 'hard'"),
    ("fedbe", "fedbe_samples", -1, ">= 0"),
    ("fedbe", "fedbe_distill_epochs", 0, ">= 1"),
    ("fedbe", "fedbe_swa_start", 3, r"\[0, fedbe_distill_epochs - 1 = 2\]"),
    ("fedbe", "fedbe_var_scale", -1.0, ">= 0"),
    ("fedbe", "fedbe_distill_momentum", 1.0, r"\[0, 1\)"),
]


@pytest.mark.parametrize(
    ("name", "key", "value", "allowed"), BAD, ids=[f"{a}-{k}={v}" for a, k, v, _ in BAD]
)
def test_bad_config_values_name_key_and_allowed(fomo, be, name, key, value, allowed):
    exp = (fomo if name == "fedfomo" else be)[0]
    factory = ff.fedfomo if name == "fedfomo" else fb.fedbe
    with pytest.raises(ConfigError, match=rf"algorithm\.{key}=.*{allowed}"):
        cfg = dataclasses.replace(exp.alg.cfg, **{key: value})
        factory(cfg, model=exp.model, num_clients=N, clients_per_round=S)


def test_bad_config_through_the_cli_path_and_missing_roles(fomo, be):
    with pytest.raises(ConfigError, match=r"algorithm\.fedbe_target='medium'"):
        experiment.build(compose_config(*BE, "algorithm.fedbe_target=medium"))
    exp = be[0]
    cfg = dataclasses.replace(exp.alg.cfg, fedbe_pool="server")
    alg = fb.fedbe(cfg, model=exp.model, num_clients=N, clients_per_round=S)
    with pytest.raises(ConfigError, match=r"fedbe_pool='server'.*no server set"):
        alg.init(exp.key, exp.fed)
    roles = {k: v for k, v in exp.fed.roles.items() if k != "test"}
    for e in (fomo[0], exp):
        with pytest.raises(ConfigError, match=r"roles \['test'\].*partition=subset"):
            e.alg.init(e.key, dataclasses.replace(e.fed, roles=roles))


def test_seed_changes_partition_and_init(fomo):
    exp = fomo[0]
    other = experiment.build(compose_config(*FOMO, "seed=1"))
    assert not leaves_equal(
        other.alg.init(other.key, other.fed).theta, exp.alg.init(exp.key, exp.fed).theta
    )
    assert not all(
        np.array_equal(a, b)
        for a, b in zip(
            other.partition.clients["labeled"], exp.partition.clients["labeled"], strict=True
        )
    )


def test_shannon_mode_uses_dofed_spp_channels(fomo):
    """systems.wireless.mode=shannon: the baselines' fixed per-client rates are DoFed-SPP's (same
    channel stream), and a round's upload time is sum over the participants of m / r_i."""
    from fedjax_semi.algorithms.dofed_spp import dofed_spp
    from fedjax_semi.algorithms.dofed_task import DoFedSPPConfig

    exp = fomo[0]
    wireless = dataclasses.replace(exp.alg.systems.wireless, mode="shannon")
    shannon = dataclasses.replace(exp.alg.systems, wireless=wireless)
    alg = ff.fedfomo(
        exp.alg.cfg, model=exp.model, num_clients=N, clients_per_round=S, systems=shannon
    )
    dofed_cfg = DoFedSPPConfig(selection_k=3, selection_b=2)
    ref = dofed_spp(dofed_cfg, model=exp.model, num_clients=N, clients_per_round=N, systems=shannon)
    clock = alg.init(exp.key, exp.fed).clock
    np.testing.assert_array_equal(clock.rate_mbps, ref.uplink.shannon_rates(exp.key, N))
    chosen = jnp.asarray([True, False, True, False, False, True])
    total, _ = alg.uplink.upload_time(exp.key, chosen, jnp.int32(1), clock)
    rates = np.asarray(clock.rate_mbps)
    assert float(total) == pytest.approx(np.sum(alg.model_mb / rates[[0, 2, 5]]), rel=1e-5)
