"""The test-only table preset the tuner's tests run on (digits, rows fedavg and local),
fedjax-semi-tune called on it in-process, and the app's config composed with a tuned file."""

from __future__ import annotations

from pathlib import Path

import yaml

from conftest import SMALL
from fedjax_semi.results.tune import main

PRESET = """# @package _global_
defaults:
  - optional /tuned: tiny_table
rounds: 2
hydra:
  sweeper:
    params:
      algorithm: {rows}
      seed: 0,1
"""
# SMALL without the keys the tuner sets (lr: the grid) or the preset sets (rounds).
EXTRAS = [o for o in SMALL if o.split("=")[0] not in ("algorithm.lr", "rounds")]
# SMALL's data overrides: the tuner scopes the values it writes to them (`where`).
DATA = {"dataset": "digits", "partition.min_client_size": 5, "partition.labeled_fraction": 0.3}


def make_conf(tmp_path: Path) -> tuple[Path, list[str]]:
    """A test-only table preset on Hydra's search path (tmp/conf/experiment/tiny_table.yaml);
    returns (conf dir, the overrides that select it)."""
    d = tmp_path / "conf"
    (d / "experiment").mkdir(parents=True)
    (d / "experiment" / "tiny_table.yaml").write_text(PRESET.format(rows="fedavg,local"))
    return d, [f"hydra.searchpath=[file://{d}]", "+experiment=tiny_table", *EXTRAS]


def tune(conf, tmp_path, *flags: str) -> int:
    """fedjax-semi-tune's exit code (0 when it returns: a dry run)."""
    d, overrides = conf
    argv = [*overrides, "--dir", str(tmp_path / "sweep"), "--conf-out", str(d / "tuned"), *flags]
    try:
        main(argv)
    except SystemExit as e:
        return e.code or 0
    return 0


def compose_real(*overrides: str):
    """The app's config, Hydra's part included (what apply_tuned reads)."""
    from hydra import compose, initialize_config_dir

    from conftest import _register_configs_once
    from fedjax_semi.cli import CONF_DIR

    _register_configs_once()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=True)


def compose_tiny(conf, *overrides: str):
    return compose_real(*conf[1], *overrides)


def write_tuned(conf, entries) -> None:
    (conf[0] / "tuned").mkdir(exist_ok=True)
    text = "# @package _global_\n" + yaml.safe_dump({"tuned": entries})
    (conf[0] / "tuned" / "tiny_table.yaml").write_text(text)


def apply(cfg):
    from fedjax_semi.tuned import apply_tuned, given_keys

    h = cfg.hydra
    return apply_tuned(cfg, h.runtime.choices, given_keys(h.overrides.task))
