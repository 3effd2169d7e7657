"""What the fedjax-semi app does for fedjax-semi-tune (results/tune.py).

* ``apply_tuned``: a preset's ``tuned`` entries (``conf/tuned/<preset>.yaml``, loaded by the
  preset's ``- optional /tuned: <preset>`` default) set the values the tuner chose, for the runs
  their ``where`` matches, unless the command line gives the key.
* ``finished_summary``: with ``resume=true``, a multirun job whose run directory holds a run
  complete for these settings returns its stored summary (cli.py), so a rerun sweep skips it
  without loading data.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fedjax_semi.config_groups import MOVED_KEYS, moved_message
from fedjax_semi.errors import ConfigError

__all__ = ["apply_tuned", "finished_summary", "given_keys", "record_tuned", "run_complete"]

_ABSENT = object()


def given_keys(overrides: Iterable[str]) -> set[str]:
    """The keys of command-line overrides (``+key=v``, ``~key``, ``key=v`` -> ``key``)."""
    return {o.split("=", 1)[0].lstrip("+~") for o in overrides}


def _value(cfg: Any, choices: Mapping[str, Any], key: str) -> Any:
    """A `where` key's value: the chosen option of a config group (``algorithm: fixavg``), else
    the config's value at the dotted key; _ABSENT when neither exists."""
    from omegaconf import OmegaConf

    if key in choices:
        return choices[key]
    return OmegaConf.select(cfg, key, default=_ABSENT, throw_on_missing=False)


def _same(a: Any, b: Any) -> bool:
    """Config values compare as values (5 == 5.0) or as their printed forms ('0.5' == 0.5)."""
    try:
        if a == b:
            return True
    except Exception:  # noqa: BLE001 (OmegaConf containers against anything)
        pass
    return str(a) == str(b)


def _entries(tuned: Any) -> list[tuple[dict, dict]]:
    """The (where, set) pairs of a `tuned` list; ConfigError for a malformed one."""
    from omegaconf import OmegaConf

    if tuned is None:
        return []
    raw = OmegaConf.to_container(tuned) if OmegaConf.is_config(tuned) else tuned
    ok = isinstance(raw, list) and all(
        isinstance(e, dict)
        and isinstance(e.get("where", {}), dict)
        and isinstance(e.get("set"), dict)
        and e["set"]
        for e in raw
    )
    if not ok:
        raise ConfigError(
            "tuned=... is not allowed: a list of {where: {key: value}, set: {key: value}} "
            "entries (conf/tuned/<preset>.yaml, written by fedjax-semi-tune)"
        )
    return [(e.get("where") or {}, e["set"]) for e in raw]


def apply_tuned(cfg: Any, choices: Mapping[str, Any], given: set[str]) -> dict[str, Any]:
    """Sets, in the composed ``cfg``, the ``set`` values of every ``cfg.tuned`` entry whose
    ``where`` matches (a group key against the chosen option in ``choices``, any other key
    against the config value), except keys in ``given`` (the command line's, which win).

    Returns:
      ``{key: value}`` applied.

    Raises:
      ConfigError: one line for a malformed list, a `where` or `set` key this config does not
        have, or two matching entries that set one key to different values.
    """
    from omegaconf import OmegaConf, read_write
    from omegaconf.errors import OmegaConfBaseException

    applied: dict[str, Any] = {}
    source: dict[str, int] = {}
    for i, (where, values) in enumerate(_entries(cfg.get("tuned"))):
        for key in [*where, *values]:  # a flat key of before the paper groups
            if key in MOVED_KEYS:
                raise ConfigError(f"tuned[{i}]: {moved_message(key)}")
        found = {k: _value(cfg, choices, k) for k in where}
        missing = [k for k, v in found.items() if v is _ABSENT]
        if missing:
            raise ConfigError(
                f"tuned[{i}].where={where!r} is not allowed: {missing} is neither a config key "
                "nor a config group of this run (conf/tuned/<preset>.yaml is stale? rerun "
                "fedjax-semi-tune or delete it)"
            )
        if not all(_same(found[k], v) for k, v in where.items()):
            continue
        for key, value in values.items():
            if OmegaConf.select(cfg, key, default=_ABSENT, throw_on_missing=False) is _ABSENT:
                raise ConfigError(
                    f"tuned[{i}].set={values!r} is not allowed: {key!r} is not a config key of "
                    "this run (conf/tuned/<preset>.yaml is stale? rerun fedjax-semi-tune)"
                )
            if key in given:
                continue
            if key in applied and not _same(applied[key], value):
                raise ConfigError(
                    f"tuned[{i}].set={values!r} is not allowed: tuned[{source[key]}] also "
                    f"matches this run and sets {key}={applied[key]!r}"
                )
            applied[key], source[key] = value, i
    with read_write(cfg):
        for key, value in applied.items():
            try:
                OmegaConf.update(cfg, key, value, merge=False)
            except OmegaConfBaseException as e:
                msg = str(e).splitlines()[0]
                raise ConfigError(f"tuned: {key}={value!r} is not allowed: {msg}") from None
    return applied


def record_tuned(out_dir: str | Path, applied: dict[str, Any]) -> None:
    """Adds ``"tuned": applied`` to the run's summary files (summary.json, and with replicas
    replicas.json and every seed_<s>/summary.json)."""
    out = Path(out_dir)
    for path in [out / "summary.json", out / "replicas.json", *out.glob("seed_*/summary.json")]:
        if path.exists():
            summary = json.loads(path.read_text())
            summary["tuned"] = applied
            path.write_text(json.dumps(summary, indent=2))


def run_complete(summary: dict, rounds: int, same_stop: bool) -> bool:
    """A run that needs no more rounds: every round done, or stopped by a rule (a stop rule, the
    method's own, a non-finite loss) under the same stop settings; an interrupted run is not."""
    reason = str(summary.get("stop_reason", ""))
    if reason.startswith("interrupted"):
        return False
    if summary.get("rounds_completed", 0) >= rounds:
        return True
    return reason != "rounds completed" and same_stop


def diverged(summary: dict) -> bool:
    """Whether the run, or a seed of its replicas, ended on a non-finite loss or model (the
    stop reason engine.loop.NaNGuard writes)."""
    return "non-finite" in str(summary.get("stop_reason"))


def finished_summary(cfg: Any, out_dir: str | Path) -> dict | None:
    """With ``resume=true``: the summary of the run in ``out_dir`` when it is complete for
    ``cfg`` (a ``Config``), else None (train or resume as usual). A directory started with
    settings that change results is a ConfigError (run_config.check_resume)."""
    from fedjax_semi.run_config import RUN_CONFIG, check_resume, config_json

    out = Path(out_dir)
    if not cfg.resume or not (out / RUN_CONFIG).exists():
        return None
    seeds = [cfg.seed + r for r in range(cfg.replicas)] if cfg.replicas > 1 else None
    paths = (
        [out / "summary.json"]
        if seeds is None
        else [out / f"seed_{s}" / "summary.json" for s in seeds]
    )
    if not all(p.exists() for p in paths) or (seeds and not (out / "replicas.json").exists()):
        return None
    try:
        summaries = [json.loads(p.read_text()) for p in paths]
        old_stop = json.loads((out / RUN_CONFIG).read_text()).get("stop")
    except (OSError, ValueError):
        return None  # a damaged file: the ordinary resume path says what is wrong
    same_stop = old_stop == config_json(cfg)["stop"]
    if not all(run_complete(s, cfg.rounds, same_stop) for s in summaries):
        return None
    check_resume(cfg, out)
    return summaries[0] if seeds is None else json.loads((out / "replicas.json").read_text())
