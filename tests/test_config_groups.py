"""The paper groups of `partition` and `systems` (partition.cofed.min_classes, systems.hwn.*,
...): the flat keys they replaced give one line naming the new place, on the command line, in a
YAML and in a tuned file, before any work; nested keys compose and sweep."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser

from conftest import SMALL, compose_config
from fedjax_semi.cli import CONF_DIR
from fedjax_semi.config import PartitionConfig, SystemsConfig
from fedjax_semi.config_groups import MOVED_KEYS, PARTITION_GROUPS, SYSTEMS_GROUPS
from fedjax_semi.errors import ConfigError
from fedjax_semi.store import as_config, register_configs
from fedjax_semi.tuned import apply_tuned

# One of each kind: a prefixed key, an unprefixed one, one renamed inside its group, a clock's.
OLD = [
    ("partition.cofed_min_classes=3", "partition.cofed.min_classes"),
    ("partition.samples_per_class=12", "partition.cofed.samples_per_class"),
    ("partition.normal_reject=subset", "partition.dofed.reject"),
    ("partition.train_per_class=20", "partition.dofed.train_per_class"),
    ("partition.ada_zeta=0.6", "partition.ada.zeta"),
    ("partition.server_unlabeled_size=10", "partition.ada.server_unlabeled_size"),
    ("partition.cfsl_clusters=3", "partition.cfsl.clusters"),
    ("systems.hwn_noise_w=1e-9", "systems.hwn.noise_w"),
    ("systems.wireless_mode=shannon", "systems.wireless.mode"),
    ("systems.time_sec_per_train_sample=1e-4", "systems.wireless.time_sec_per_train_sample"),
    ("systems.tx2_mode_period=5", "systems.tx2.mode_period"),
]


def _line(old_override: str, new: str) -> str:
    return f"{old_override.split('=')[0]} moved to {new}"


def test_every_group_knob_has_its_old_key_and_the_new_place_exists():
    news = set(MOVED_KEYS.values())
    for top, groups, cls in (
        ("partition", PARTITION_GROUPS, PartitionConfig),
        ("systems", SYSTEMS_GROUPS, SystemsConfig),
    ):
        top_fields = {f.name for f in dataclasses.fields(cls)}
        for group, gcls in groups.items():
            assert group in top_fields
            for f in dataclasses.fields(gcls):
                assert f"{top}.{group}.{f.name}" in news
    assert len(news) == len(MOVED_KEYS)  # one old key per new place
    # No old key is still a key of its group's top level.
    for old in MOVED_KEYS:
        top, name = old.split(".")
        cls = PartitionConfig if top == "partition" else SystemsConfig
        assert name not in {f.name for f in dataclasses.fields(cls)}, old


@pytest.mark.parametrize(("override", "new"), OLD, ids=[o for o, _ in OLD])
def test_old_key_on_the_command_line_is_one_line(override, new):
    with pytest.raises(ConfigError) as e:
        compose_config(override)
    assert str(e.value) == _line(override, new)
    with pytest.raises(ConfigError) as e:  # appended (+key) too
        compose_config("+" + override)
    assert str(e.value) == _line(override, new)


def test_new_keys_compose_and_reach_the_readers():
    from fedjax_semi.systems.compute import Compute
    from fedjax_semi.systems.hwn import HwnSystem
    from fedjax_semi.systems.tx2 import Tx2System

    cfg = compose_config(
        "partition=cofed", "partition.cofed.min_classes=3", "partition.cofed.max_classes=4",
        "systems=hwn", "systems.hwn.noise_w=1e-9", "systems.tx2.mode_period=5",
        "systems.wireless.time_sec_per_train_sample=1e-3",
    )  # fmt: skip
    assert (cfg.partition.cofed.min_classes, cfg.partition.cofed.max_classes) == (3, 4)
    assert HwnSystem.from_config(cfg).noise_w == 1e-9
    assert Tx2System.from_config(cfg).mode_period == 5
    assert Compute.from_config(cfg.systems).sec_per_train_sample == 1e-3


def test_bad_nested_values_and_unknown_keys_name_the_key():
    with pytest.raises(ConfigError, match=r"^systems\.hwn\.fading='rician' is not allowed"):
        compose_config("systems=hwn", "systems.hwn.fading=rician")
    with pytest.raises(ConfigError) as e:  # an unknown key of partition: one line, the keys
        compose_config("+partition.alphaa=1")
    assert str(e.value).startswith("partition.alphaa=1 is not allowed: a key of partition")
    assert "\n" not in str(e.value)
    with pytest.raises(Exception, match="typo"):  # inside a group: Hydra's own refusal
        compose_config("partition.cofed.typo=1")


def test_sweep_over_a_nested_key():
    """A multirun's sweep override (key=a,b) over a nested key: each job's composition has the
    value."""
    (sweep,) = OverridesParser.create().parse_overrides(["partition.cofed.min_classes=2,3"])
    values = list(sweep.sweep_iterator())
    assert values == [2, 3]
    for v in values:
        cfg = compose_config("partition=cofed", f"{sweep.key_or_group}={v}")
        assert cfg.partition.cofed.min_classes == v


def _conf_with(tmp_path, rel: str, text: str):
    """A copy of conf/ with one more YAML."""
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    (conf / rel).write_text(text)
    return conf


YAML_OLD = """# @package _global_
defaults:
  - override /partition: cofed
partition:
  cofed_min_classes: 3
"""


def test_old_key_in_a_yaml_is_one_line(tmp_path):
    conf = _conf_with(tmp_path, "experiment/old_keys.yaml", YAML_OLD)
    register_configs()
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        node = compose("config", overrides=["+experiment=old_keys"])
    with pytest.raises(ConfigError) as e:
        as_config(node)
    assert str(e.value) == "partition.cofed_min_classes moved to partition.cofed.min_classes"
    # A group option's YAML (keys at its top level).
    conf2 = _conf_with(
        tmp_path / "b", "systems/old.yaml", "defaults:\n  - base_systems\nhwn_noise_w: 1e-9\n"
    )
    with initialize_config_dir(config_dir=str(conf2), version_base="1.3"):
        node = compose("config", overrides=["systems=old"])
    with pytest.raises(ConfigError, match=r"^systems\.hwn_noise_w moved to systems\.hwn\.noise_w$"):
        as_config(node)


def test_old_key_in_a_tuned_entry_is_one_line():
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"partition": {"alpha": 0.5}, "tuned": [
        {"where": {"partition.alpha": 0.5}, "set": {"partition.ada_zeta": 0.6}}]})  # fmt: skip
    with pytest.raises(
        ConfigError, match=r"^tuned\[0\]: partition\.ada_zeta moved to partition\.ada\.zeta$"
    ):
        apply_tuned(cfg, {}, set())


def _cli(tmp_path, *args: str, conf=None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if conf is not None:
        env["FEDJAX_SEMI_CONF"] = str(conf)
    return subprocess.run(
        [sys.executable, "-m", "fedjax_semi.cli", *SMALL, f"out_dir={tmp_path / 'run'}", *args],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env,
    )  # fmt: skip


def _one_error_line(r: subprocess.CompletedProcess) -> str:
    assert r.returncode != 0
    lines = (r.stderr + r.stdout).strip().splitlines()
    assert len(lines) == 1, r.stderr + r.stdout
    assert lines[0].startswith("fedjax-semi: error: ")
    return lines[0].removeprefix("fedjax-semi: error: ")


@pytest.mark.slow  # make test-slow: the fast suite must stay under 12 minutes
def test_old_keys_through_the_real_cli(tmp_path):
    # On the command line (a multirun sweep too): refused before Hydra makes any directory.
    line = _one_error_line(_cli(tmp_path, "partition.cofed_min_classes=3"))
    assert line == "partition.cofed_min_classes moved to partition.cofed.min_classes"
    line = _one_error_line(_cli(tmp_path, "-m", "systems.hwn_noise_w=1e-9,1e-8"))
    assert line == "systems.hwn_noise_w moved to systems.hwn.noise_w"
    assert not (tmp_path / "run").exists() and not (tmp_path / "multirun").exists()
    # In a YAML: the composed config is refused before any data loads, no run directory left.
    conf = _conf_with(tmp_path / "c", "experiment/old_keys.yaml", YAML_OLD)
    line = _one_error_line(_cli(tmp_path, "+experiment=old_keys", conf=conf))
    assert line == "partition.cofed_min_classes moved to partition.cofed.min_classes"
    assert not (tmp_path / "run").exists()


def test_hardware_schema_defaults_are_the_cpu_presets():
    """HardwareConfig's defaults are what `hardware=cpu` (the default group) composes to, so a
    Config built in Python runs like the command line's default (and the defaults cannot drift
    from the preset a later benchmark retunes)."""
    from fedjax_semi.config import HardwareConfig

    composed = compose_config(small=False).hardware
    assert composed.name == "cpu"
    assert dataclasses.asdict(composed) == dataclasses.asdict(HardwareConfig())
