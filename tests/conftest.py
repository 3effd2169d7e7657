"""Shared helpers: tiny real data (sklearn digits), configs composed by real Hydra, no network."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from fedjax_semi.cli import CONF_DIR
from fedjax_semi.config import Config, as_config, register_configs

# A run on digits that compiles and trains in seconds.
SMALL = [
    "dataset=digits",
    "model=mlp",
    "model.hidden=[32]",
    "num_clients=12",
    "clients_per_round=4",
    "rounds=3",
    "partition.min_client_size=5",
    "partition.labeled_fraction=0.3",
    "algorithm.lr=0.1",
    "algorithm.batch_size=16",
    "hardware.chunk=3",
    "hardware.eval_chunk=5",
    "hardware.eval_batch=128",
    "progress=false",
    "save_partition=false",
]


def compose_config(*overrides: str, small: bool = True) -> Config:
    """The config `fedjax-semi` would run with these overrides on top of SMALL."""
    register_configs()
    mine = {o.split("=")[0] for o in overrides}
    base = [o for o in (SMALL if small else []) if o.split("=")[0] not in mine]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=base + list(overrides))
    return as_config(cfg)


@pytest.fixture
def isolated_data_env(monkeypatch, tmp_path):
    """Keep the user's real data and cache out of dataset lookups; start with a cold cache."""
    from fedjax_semi.data import sources

    monkeypatch.delenv("FEDJAX_SEMI_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    sources.clear_cache()
    yield
    sources.clear_cache()
