"""Hydra's side of the configs: the schemas in the ConfigStore and a composed node as a `Config`.

Each `conf/<group>/*.yaml` names its schema in its defaults list: `base_<group>`, and for an
algorithm `/schema/algorithm/<method>@_here_`, the method's own config class, so another
method's knob is refused. (The methods' schemas live in a group of their own so Hydra's list
of `algorithm` options stays the methods.) Every registered method, built-in or a plugin's, has
an option of its name in the `algorithm` group, found on Hydra's config search path (a plugin's
YAML comes through `hydra.searchpath` or its own SearchPathPlugin), and every option names a
registered method: `check_algorithm_options`.

The `partition` and `systems` schemas take unknown keys at composition (their paper groups,
`partition.cofed` etc., do not), so `as_config` can answer a flat key of before the groups,
from the command line or a YAML, with one line naming its new place (config_groups.MOVED_KEYS)
rather than Hydra's report; any other unknown key there is refused by `as_config` too.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hydra.core.config_store import ConfigStore

from fedjax_semi.algorithms import ALGORITHM_CONFIGS  # importing it registers every method
from fedjax_semi.algorithms.registry import algorithm_names, check_config_class
from fedjax_semi.config import (
    Config,
    DatasetConfig,
    HardwareConfig,
    ModelConfig,
    PartitionConfig,
    SystemsConfig,
)
from fedjax_semi.config_groups import check_group_keys
from fedjax_semi.errors import ConfigError

# The groups whose schema takes unknown keys at composition, for `as_config` to answer.
OPEN_GROUPS = {"partition": PartitionConfig, "systems": SystemsConfig}


def _first_set(value: Any, default: Any) -> Any:
    """`${fedjax.or:${out_dir},...}`: value unless it is null (oc.select keeps a null)."""
    return default if value is None else value


def register_configs() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("fedjax.or"):
        OmegaConf.register_new_resolver("fedjax.or", _first_set)
    cs = ConfigStore.instance()
    root = OmegaConf.structured(Config)
    for group in OPEN_GROUPS:
        _open(root[group])
    cs.store(name="base_config", node=root)
    for group, node in [
        ("dataset", DatasetConfig),
        ("partition", _open(OmegaConf.structured(PartitionConfig))),
        ("model", ModelConfig),
        ("hardware", HardwareConfig),
        ("systems", _open(OmegaConf.structured(SystemsConfig))),
    ]:
        cs.store(group=group, name=f"base_{group}", node=node)
    for name, node in ALGORITHM_CONFIGS.items():
        cs.store(group="schema/algorithm", name=name, node=node)


def _open(node: Any) -> Any:
    """The node takes unknown keys (its own level only: its nested groups stay strict)."""
    from omegaconf import OmegaConf

    OmegaConf.set_struct(node, False)
    for key in node:
        if OmegaConf.is_dict(node[key]):
            OmegaConf.set_struct(node[key], True)
    return node


def as_config(cfg: Any) -> Config:
    """An OmegaConf node (or Config) as a plain `Config` of dataclasses. Building the dataclasses
    runs each group's `__post_init__` checks (a `ConfigError` naming the key). A key of
    `partition` or `systems` that is none of theirs (an old flat key: where it moved) is a
    `ConfigError` first."""
    if not isinstance(cfg, Config):
        from omegaconf import OmegaConf

        for group, cls in OPEN_GROUPS.items():
            if group in cfg:
                check_group_keys(cfg[group], group, cls)
        obj = OmegaConf.to_object(cfg)
        if not isinstance(obj, Config):  # composed without the base_config schema
            raise TypeError(f"expected a config composed on base_config, got {type(obj).__name__}")
        cfg = obj
    check_config_class(cfg.algorithm.name, cfg.algorithm)
    return cfg


def algorithm_options(sources: Iterable[Any]) -> dict[str, str | None]:
    """Each option of the `algorithm` group on Hydra's config search path, with the `name` its
    own YAML sets (None for a variant that takes it from its defaults). `sources` are Hydra's
    `hydra.runtime.config_sources` (schema, provider, path); the first source holding an option
    wins, as in Hydra's composition."""
    from hydra.core.object_type import ObjectType
    from hydra.core.plugins import Plugins
    from hydra.plugins.config_source import ConfigSource
    from omegaconf import OmegaConf

    kinds = {c.scheme(): c for c in Plugins.instance().discover(ConfigSource)}
    found: dict[str, str | None] = {}
    for s in sources:
        if s.schema not in kinds:
            continue
        src = kinds[s.schema](provider=s.provider, path=f"{s.schema}://{s.path}")
        if not (src.available() and src.is_group("algorithm")):
            continue
        for opt in src.list("algorithm", results_filter=ObjectType.CONFIG):
            if opt not in found:
                node = OmegaConf.to_container(src.load_config(f"algorithm/{opt}").config)
                found[opt] = node.get("name") if isinstance(node, dict) else None
    return found


def check_algorithm_options(sources: Iterable[Any]) -> None:
    """The registry and the `algorithm` options agree: every registered method has an option of
    its name, and every option that sets a `name` sets a registered one; else one line with
    both differences."""
    options = algorithm_options(sources)
    names = set(algorithm_names())
    no_yaml = sorted(names - set(options))
    no_method = sorted(
        f"{o} (name: {n})" for o, n in options.items() if n is not None and n not in names
    )
    if no_yaml or no_method:
        raise ConfigError(
            "the registered methods and the algorithm options on Hydra's search path differ: "
            f"registered without an algorithm/<name>.yaml: {no_yaml}; options naming no "
            f"registered method: {no_method} (a package's method registers through the entry "
            "points fedjax_semi.methods, its YAML comes through hydra.searchpath or its "
            "SearchPathPlugin)"
        )
