"""Hydra's side of the configs: the schemas in the ConfigStore and a composed node as a `Config`.

Each `conf/<group>/*.yaml` names its schema in its defaults list: `base_<group>`, and for an
algorithm `/schema/algorithm/<method>@_here_`, the method's own config class, so another
method's knob is refused. (The methods' schemas live in a group of their own so Hydra's list
of `algorithm` options stays the methods.)
"""

from __future__ import annotations

from typing import Any

from hydra.core.config_store import ConfigStore

from fedjax_semi.algorithms import ALGORITHM_CONFIGS  # importing it registers every method
from fedjax_semi.algorithms.base import check_config_class
from fedjax_semi.config import (
    Config,
    DatasetConfig,
    HardwareConfig,
    ModelConfig,
    PartitionConfig,
    SystemsConfig,
)


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    for group, node in [
        ("dataset", DatasetConfig),
        ("partition", PartitionConfig),
        ("model", ModelConfig),
        ("hardware", HardwareConfig),
        ("systems", SystemsConfig),
    ]:
        cs.store(group=group, name=f"base_{group}", node=node)
    for name, node in ALGORITHM_CONFIGS.items():
        cs.store(group="schema/algorithm", name=name, node=node)


def as_config(cfg: Any) -> Config:
    """An OmegaConf node (or Config) as a plain `Config` of dataclasses. Building the dataclasses
    runs each group's `__post_init__` checks (a `ConfigError` naming the key)."""
    if not isinstance(cfg, Config):
        from omegaconf import OmegaConf

        obj = OmegaConf.to_object(cfg)
        if not isinstance(obj, Config):  # composed without the base_config schema
            raise TypeError(f"expected a config composed on base_config, got {type(obj).__name__}")
        cfg = obj
    check_config_class(cfg.algorithm.name, cfg.algorithm)
    return cfg
