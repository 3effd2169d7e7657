"""The runs of a sweep directory: every run with a summary.json, its config (Hydra's, else its
run_config.json) and overrides, the label of its setting (the overrides and config values that
vary across the sweep, seed excluded), the runs grouped by setting, and the runs left out
(unfinished). Every table and plot of results/ reads its runs from here.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import yaml

from fedjax_semi.run_config import RUN_CONFIG, flat_keys, result_neutral, run_control

SEED_KEYS = ("seed",)


def _get(cfg: dict, dotted: str):
    node = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _natural(path: Path) -> list:
    """Sort key that puts job 2 before job 10."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]


def find_runs(root: Path) -> list[dict]:
    """Every run under root that has a summary.json, with its config and overrides. The config
    is Hydra's (`.hydra/config.yaml`), else the run's `run_config.json`: a run directory
    committed without `.hydra/` still has its seed, its algorithm and its paper."""
    runs = []
    for summary_path in sorted(Path(root).rglob("summary.json"), key=_natural):
        d = summary_path.parent
        cfg_path, ov_path = d / ".hydra" / "config.yaml", d / ".hydra" / "overrides.yaml"
        if cfg_path.exists():
            cfg = yaml.safe_load(cfg_path.read_text())
        elif (d / "run_config.json").exists():
            cfg = json.loads((d / "run_config.json").read_text())
        else:
            cfg = {}
        overrides = yaml.safe_load(ov_path.read_text()) if ov_path.exists() else []
        seeds = [_split(o)[1] for o in overrides or [] if _split(o)[0] in SEED_KEYS]
        seed = _get(cfg or {}, "seed")
        runs.append(
            {
                "dir": d,
                "settings": _run_settings(d),
                "seed": str(seed) if seed is not None else (seeds[0] if seeds else None),
                "summary": json.loads(summary_path.read_text()),
                "config": cfg or {},
                # A resumed run (resume=true) pools with the runs it did not need resuming.
                "overrides": [
                    o
                    for o in overrides or []
                    if _split(o)[0] not in SEED_KEYS and not run_control(_split(o)[0])
                ],
            }
        )
    return runs


def unfinished_runs(root: Path) -> str:
    """One line naming every run under root with a metrics.jsonl but no summary.json, and its
    last logged round: the tables leave them out. "" when none."""
    left = []
    for m in sorted(Path(root).rglob("metrics.jsonl"), key=_natural):
        if (m.parent / "summary.json").exists():
            continue
        last = "?"
        try:
            lines = m.read_text().splitlines()
        except (OSError, UnicodeDecodeError):  # unreadable, or cut mid-character by a kill
            lines = []
        for line in reversed(lines):
            try:
                last = int(json.loads(line)["round"])
                break
            except (ValueError, KeyError, TypeError, OverflowError):  # a line cut by a kill
                continue
        left.append(f"{m.parent.relative_to(root)} (round {last})")
    if not left:
        return ""
    why = "stopped, still running, or a replica group's seed from before per-seed summaries"
    return f"Left out, without a summary.json ({why}): " + ", ".join(left)


def _run_settings(d: Path) -> dict:
    """The settings the run ran at (its run_config.json, or its replica parent's), flattened,
    without the seeds and the keys that never change a result (run_config.result_neutral):
    what tells apart runs whose overrides agree but whose tuned files did not."""
    for f in (d / RUN_CONFIG, d.parent / RUN_CONFIG):
        if f.exists():
            flat = flat_keys(json.loads(f.read_text()))
            return {
                k: v for k, v in flat.items()
                if k not in ("seed", "data_seed", "replicas") and not result_neutral(k)
            }  # fmt: skip
    return {}


def _split(override: str) -> tuple[str, str]:
    key, _, value = override.partition("=")
    return key.lstrip("+~"), value


def _settings(runs: list[dict]) -> list[str]:
    """A label per run: the overrides whose values vary across the sweep (seed excluded). A key
    overridden in some runs only varies too; where it is absent the label says `key=default`."""
    keys = [{_split(o)[0]: _split(o)[1] for o in r["overrides"]} for r in runs]
    all_keys = set().union(*keys)
    varying = {k for k in all_keys if len({kv.get(k) for kv in keys}) > 1}
    labels = []
    for r, kv in zip(runs, keys, strict=True):
        parts = [o for o in r["overrides"] if _split(o)[0] in varying]
        parts = sorted(parts + [f"{k}=default" for k in varying - kv.keys()])
        labels.append(" ".join(parts) or str(r["summary"].get("algorithm", r["dir"].name)))
    return _split_by_settings(runs, labels)


def _split_by_settings(runs: list[dict], labels: list[str]) -> list[str]:
    """Runs that share a label but ran at different settings (a tuned file changed between
    them, say) get the keys that differ within the label, as `key=value` in place of a
    `key=default` token, so no row pools them."""
    out = list(labels)
    for label in set(labels):
        idx = [i for i, lab in enumerate(labels) if lab == label]
        flats = [runs[i].get("settings", {}) for i in idx]
        keys = sorted({k for f in flats for k in f if len({repr(g.get(k)) for g in flats}) > 1})
        if not keys:
            continue
        kept = [t for t in label.split(" ") if _split(t)[0] not in keys]
        for i, f in zip(idx, flats, strict=True):
            out[i] = " ".join(sorted(kept + [f"{k}={f.get(k)}" for k in keys]))
    return out


def default_values(groups: dict[str, list[dict]]) -> list[str]:
    """One line per setting with `key=default` tokens: the values its runs resolved for those
    keys (run_config.json: the preset, then its tuned file), so a label's `default` is never
    read as the preset's value where a tuned file set another. Keys the runs do not record
    are left out (runs of one label never record two values: `_split_by_settings`)."""
    lines = []
    for label, rs in groups.items():
        resolved = []
        for token in label.split(" "):
            key, value = _split(token)
            if value == "default" and all(key in r.get("settings", {}) for r in rs):
                resolved.append(f"{key}={rs[0]['settings'][key]}")
        if resolved:
            lines.append(f"- {label}: {', '.join(resolved)}")
    return lines


def grouped_runs(root: Path) -> dict[str, list[dict]]:
    """The runs under root grouped by setting (`_settings`), the seeds of one setting together."""
    runs = find_runs(root)
    if not runs:
        left = unfinished_runs(root)
        raise ValueError(
            f"sweep_dir={str(root)!r} holds no run with a summary.json. {left}".strip()
        )
    groups: dict[str, list[dict]] = defaultdict(list)
    for r, label in zip(runs, _settings(runs), strict=True):
        groups[label].append(r)
    return groups
