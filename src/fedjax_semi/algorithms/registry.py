"""The method registry: each method's factory and config class, by name, built-in or not.

A leaf module (it imports nothing of the package but `errors`), so `base` reads it without a
cycle. The built-in methods register when `fedjax_semi.algorithms` imports them (importing
this module imports that package first). A method of another installed package registers
through the entry-point group `fedjax_semi.methods`: each entry point names a module, or a
callable, whose import (or call) registers methods with `register`. They are loaded once, when
the registry is first read; docs/architecture.md, "Methods from another package".
"""

from __future__ import annotations

import importlib.metadata
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from fedjax_semi.errors import bad

# Names for the annotations only: the registry imports nothing of the package but `errors`
# (base and config import it), so a factory's result and a config class stay untyped here.
Algorithm = Any  # algorithms.base.Algorithm
AlgorithmConfig = Any  # config.AlgorithmConfig

ENTRY_POINT_GROUP = "fedjax_semi.methods"

V = TypeVar("V")


class PluginError(Exception):
    """An entry point of `fedjax_semi.methods` that failed to load (one line: which, and why)."""


class _Plugins:
    """Whether the entry points were loaded, and the error of the one that failed."""

    loaded: bool = False
    failure: str | None = None


def _name(ep: importlib.metadata.EntryPoint) -> str:
    return ep.name


def load_plugins() -> None:
    """Import (or call) every entry point of `fedjax_semi.methods`, once; a failure raises
    `PluginError` naming the entry point, now and on every later read of the registry."""
    if not _Plugins.loaded:
        _Plugins.loaded = True  # first: a plugin that reads the registry must not recurse
        for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=_name):
            try:
                obj = ep.load()
                if callable(obj) and not isinstance(obj, types.ModuleType):
                    obj()
            except Exception as e:  # any error of a plugin's code: one line, naming it
                why = str(e).strip().splitlines()[0] if str(e).strip() else ""
                _Plugins.failure = (
                    f"the method plugin {ep.name} = {ep.value} (entry-point group "
                    f"{ENTRY_POINT_GROUP}) failed to load: {type(e).__name__}: {why}"
                )
                break
    if _Plugins.failure is not None:
        raise PluginError(_Plugins.failure)


class _Registry(Mapping[str, V]):
    """A read-only view of one of the registry's tables; reading it loads the plugins first."""

    def __init__(self, table: dict[str, V]) -> None:
        self._table = table

    def __getitem__(self, name: str) -> V:
        load_plugins()
        return self._table[name]

    def __iter__(self) -> Iterator[str]:
        load_plugins()
        return iter(self._table)

    def __len__(self) -> int:
        load_plugins()
        return len(self._table)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({sorted(self)})"


_FACTORIES: dict[str, Callable[..., Algorithm]] = {}
_CONFIGS: dict[str, type[AlgorithmConfig]] = {}
ALGORITHMS: Mapping[str, Callable[..., Algorithm]] = _Registry(_FACTORIES)
# Each method's config class (stored in Hydra's ConfigStore as schema/algorithm/<name>).
ALGORITHM_CONFIGS: Mapping[str, type[AlgorithmConfig]] = _Registry(_CONFIGS)


def register(name: str, config: type[AlgorithmConfig]) -> Callable[[Any], Any]:
    """Register `factory(cfg, **kw) -> Algorithm` under `name`, with the config class it reads.
    A name registers once: a plugin cannot silently replace a built-in method."""

    def deco(factory):
        if name in _FACTORIES and _FACTORIES[name] is not factory:
            old = _FACTORIES[name]
            raise ValueError(
                f"algorithm {name!r} is registered twice: by {old.__module__}.{old.__qualname__}"
                f" and by {factory.__module__}.{factory.__qualname__}"
            )
        _FACTORIES[name] = factory
        _CONFIGS[name] = config
        return factory

    return deco


def algorithm_names() -> list[str]:
    return sorted(ALGORITHMS)


def check_name(name: str) -> None:
    """`algorithm.name` is a registered method (built-in or a plugin's)."""
    if name not in ALGORITHMS:
        raise bad("algorithm.name", name, f"one of {algorithm_names()}")


def check_config_class(name: str, cfg: AlgorithmConfig) -> None:
    """`algorithm.name` must be the method whose config `cfg` is (an `algorithm.name=...`
    override on another method's option would hand a method knobs it does not read)."""
    check_name(name)
    want = ALGORITHM_CONFIGS[name]
    if type(cfg) is not want:
        raise bad(
            "algorithm.name",
            name,
            f"the name of the selected algorithm option (its config is {type(cfg).__name__}, "
            f"{name} reads {want.__name__}): choose the method with algorithm={name}",
        )


# name -> [(applies(role names), factory)]: the task variants of a method, in registration order.
_VARIANTS: dict[str, list[tuple[Callable[[tuple[str, ...]], bool], Callable[..., Algorithm]]]] = {}


def register_variant(name: str, applies: Callable[[tuple[str, ...]], bool]) -> Callable[[Any], Any]:
    """Register `factory(cfg, **kw) -> Algorithm` as a task variant of method `name`: built
    instead of the method's own factory when `applies(roles)` holds for the partition's role
    names (DoFed-SPP's FedAvg and Local baselines on its tasks). The variant reads the method's
    config class; the first registered variant that applies wins."""

    def deco(factory):
        _VARIANTS.setdefault(name, []).append((applies, factory))
        return factory

    return deco


def make_algorithm(name: str, roles: tuple[str, ...] | None = None, **kwargs: Any) -> Algorithm:
    """Method `name` built from `kwargs` (cfg, model, ...): the first of its task variants whose
    `applies(roles)` holds for the partition's role names, else its own factory."""
    check_config_class(name, kwargs["cfg"])  # loads the plugins, whose variants count too
    if roles is not None:
        for applies, factory in _VARIANTS.get(name, ()):
            if applies(tuple(roles)):
                return factory(**kwargs)
    return ALGORITHMS[name](**kwargs)
