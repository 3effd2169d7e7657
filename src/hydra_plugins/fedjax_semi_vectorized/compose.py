"""Composing a multirun's jobs without composing each one from scratch.

Hydra's launchers compose every job again from its defaults list (``load_sweep_config``, about
0.5-0.8 s a job here). The jobs of a sweep over values (``algorithm.lr=0.01,0.03 seed=0,1``)
differ only in those values: their defaults lists, and so every other node, are the same. For
such a job this composer takes the config composed for an earlier job of the same shape and
applies the differing value overrides as Hydra itself applies a command-line value
(``OmegaConf.update(..., merge=True)``), then rewrites the two fields Hydra derives from the
overrides (``hydra.overrides.task`` and ``hydra.job.override_dirname``). Anything else (a config
group, ``+``/``~`` overrides, a ``hydra.*`` key, a value that is not a plain scalar) is composed
by Hydra as before. ``tests/test_vectorized.py`` checks the result equals Hydra's own.
"""

# No `from __future__ import annotations`: Hydra loads plugin modules outside sys.modules.
import copy
from collections.abc import Sequence
from typing import Any

from hydra._internal.config_loader_impl import get_overrides_dirname
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType, ValueType
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

_SCALARS = (int, float, bool, str, type(None))


def _parse(overrides: Sequence[str]) -> list[Override]:
    return OverridesParser.create().parse_overrides(list(overrides))


def _plain_value(o: Override) -> bool:
    """``key=scalar``: a change of one element, no package, no sweep, no interpolation."""
    if o.type != OverrideType.CHANGE or o.package is not None:
        return False
    if o.value_type != ValueType.ELEMENT:
        return False
    value = o.value()
    return isinstance(value, _SCALARS) and not (isinstance(value, str) and "${" in value)


class JobComposer:
    """``compose(overrides)``: the job config Hydra's ``load_sweep_config`` would return."""

    def __init__(self, config_loader: Any, master: DictConfig) -> None:
        self.loader, self.master = config_loader, master
        self.templates: list[tuple[list[Override], DictConfig]] = []
        self.fast = 0  # jobs composed from a template (for the log line)

    def _from_template(self, parsed: list[Override]) -> DictConfig | None:
        for t_parsed, t_cfg in self.templates:
            if len(t_parsed) != len(parsed):
                continue
            keys = [o.key_or_group for o in parsed]
            if keys != [o.key_or_group for o in t_parsed]:
                continue
            pairs = zip(t_parsed, parsed, strict=True)
            changed = [(a, b) for a, b in pairs if a.input_line != b.input_line]
            if not all(_plain_value(a) and _plain_value(b) for a, b in changed):
                continue
            # A value of the composed config, not a config group (whose node is a dict/list).
            if any(
                isinstance(OmegaConf.select(t_cfg, b.key_or_group), (DictConfig, ListConfig))
                for _, b in changed
            ):
                continue
            cfg = copy.deepcopy(t_cfg)
            for _, b in changed:
                OmegaConf.update(cfg, b.key_or_group, b.value(), merge=True)
            job = cfg.hydra.job
            with open_dict(cfg.hydra):
                cfg.hydra.overrides.task = [o.input_line for o in parsed]
                job.override_dirname = get_overrides_dirname(
                    overrides=parsed,
                    kv_sep=job.config.override_dirname.kv_sep,
                    item_sep=job.config.override_dirname.item_sep,
                    exclude_keys=job.config.override_dirname.exclude_keys,
                )
            OmegaConf.copy_cache(from_config=self.master, to_config=cfg)
            return cfg
        return None

    def compose(self, overrides: Sequence[str]) -> DictConfig:
        parsed = _parse(overrides)
        # A hydra.* override changes Hydra's own config: always composed by Hydra.
        task_only = not any(o.key_or_group.startswith("hydra") for o in parsed)
        cfg = self._from_template(parsed) if task_only else None
        if cfg is not None:
            self.fast += 1
            return cfg
        cfg = self.loader.load_sweep_config(self.master, list(overrides))
        if task_only:
            self.templates.append((parsed, copy.deepcopy(cfg)))
        return cfg
