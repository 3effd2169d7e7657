"""Methods from another installed package (entry points + Hydra's search path), the registry's
agreement with the algorithm options, refused runs that leave no directory, and the dropout
messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from conftest import SMALL, compose_config, compose_hydra
from fedjax_semi.config import ConfigError, SettingReplaced, model_dropout

PLUGIN = """
from fedjax_semi.algorithms.fedavg import FedAvgConfig, FedAvgFamily
from fedjax_semi.algorithms.registry import register


@register("fedavg_twice", FedAvgConfig)
def fedavg_twice(cfg, **kw):
    return FedAvgFamily(cfg, name="fedavg_twice", **kw)
"""

SEARCH_PATH_PLUGIN = """
from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class FedavgTwiceSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        search_path.append(provider="fedavg_twice_plugin", path="pkg://fedavg_twice_plugin.conf")
"""

YAML = """defaults:
  - /schema/algorithm/fedavg_twice@_here_
name: fedavg_twice
lr: 0.1
batch_size: 16
"""


def write_dist(root: Path, name: str, entry_points: str) -> None:
    """A `<name>.dist-info` folder: what importlib.metadata reads of an installed package."""
    info = root / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[fedjax_semi.methods]\n{entry_points}\n")


def write_plugin(root: Path, with_yaml: bool) -> Path:
    """The out-of-tree package: its method, and (with_yaml) its YAML and SearchPathPlugin."""
    pkg = root / "fedavg_twice_plugin"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(PLUGIN)
    write_dist(root, "fedavg_twice_plugin", "fedavg_twice = fedavg_twice_plugin")
    if with_yaml:
        (pkg / "conf" / "algorithm").mkdir(parents=True)
        (pkg / "conf" / "__init__.py").write_text("")
        (pkg / "conf" / "algorithm" / "fedavg_twice.yaml").write_text(YAML)
        hp = root / "hydra_plugins" / "fedavg_twice_searchpath"  # no hydra_plugins/__init__.py
        hp.mkdir(parents=True)
        (hp / "__init__.py").write_text(SEARCH_PATH_PLUGIN)
    return root


def cli(cwd: Path, *args: str, path: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "fedjax_semi.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env=env,
    )


def error_line(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("fedjax-semi: error:")]
    assert len(errors) == 1, r.stderr
    return errors[0]


def test_a_method_of_another_package_runs_through_the_cli(tmp_path):
    root = write_plugin(tmp_path / "site", with_yaml=True)
    out, work = tmp_path / "out", tmp_path / "work"
    work.mkdir()
    args = ("algorithm=fedavg_twice", "rounds=1", f"out_dir={out}")
    r = cli(work, *SMALL, *args, path=root)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and 0 <= rows[0]["accuracy"] <= 1
    assert "fedavg_twice: 1 rounds" in r.stdout


def test_registry_and_options_differ_in_one_line_and_the_refused_run_creates_nothing(tmp_path):
    """The plugin's method has no YAML on the search path; a stray YAML (through
    hydra.searchpath) names no method. Hydra makes the run directory (.hydra/, cli.log) before
    the task; the refused run removes it: the working directory stays as it was."""
    root = write_plugin(tmp_path / "site", with_yaml=False)
    extra = tmp_path / "extra" / "algorithm"
    extra.mkdir(parents=True)
    (extra / "ghost.yaml").write_text(
        "defaults:\n  - /schema/algorithm/fedavg@_here_\nname: ghost\n"
    )
    work = tmp_path / "work"
    (work / "outputs" / "earlier").mkdir(parents=True)  # another run's folder stays
    (work / "outputs" / "earlier" / "cli.log").write_text("")
    r = cli(work, *SMALL, f"hydra.searchpath=[file://{extra.parent}]", path=root)
    line = error_line(r)
    assert "without an algorithm/<name>.yaml: ['fedavg_twice']" in line
    assert "naming no registered method: ['ghost (name: ghost)']" in line
    left = sorted(str(p.relative_to(work)) for p in work.rglob("*"))
    assert left == ["outputs", "outputs/earlier", "outputs/earlier/cli.log"]


def test_a_plugin_that_fails_to_load_is_one_line(tmp_path, monkeypatch, capsys):
    from fedjax_semi import cli
    from fedjax_semi.algorithms import registry

    write_dist(tmp_path, "broken_plugin", "broken = no_such_module_xyz")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry._Plugins, "loaded", False)  # as in a fresh process
    monkeypatch.setattr(registry._Plugins, "failure", None)
    monkeypatch.setattr(sys, "argv", ["fedjax-semi", *SMALL])
    with pytest.raises(SystemExit) as exit_:
        cli.main()  # fails while storing the schemas, before Hydra starts
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedjax-semi: error: ")
    assert "broken = no_such_module_xyz" in err[0] and "fedjax_semi.methods" in err[0]
    assert "ModuleNotFoundError: No module named 'no_such_module_xyz'" in err[0]
    with pytest.raises(registry.PluginError):  # and on every later read of the registry
        registry.algorithm_names()


def test_model_dropout_replacing_model_dropout_is_said():
    cfg = compose_config("algorithm=um_pfssl")  # its YAML sets algorithm.model_dropout: 0.5
    assert cfg.model.dropout == 0.0
    with pytest.warns(SettingReplaced) as got:
        assert model_dropout(cfg) == 0.5
    assert str(got[0].message).startswith(
        "model.dropout=0.0 is replaced by algorithm.model_dropout=0.5"
    )
    with warnings.catch_warnings():  # nothing replaced: nothing said
        warnings.simplefilter("error")
        assert model_dropout(compose_config("algorithm=um_pfssl", "model.dropout=0.5")) == 0.5
        assert model_dropout(compose_config("algorithm=fedavg", "model.dropout=0.25")) == 0.25
    with pytest.raises(ConfigError, match=r"model.dropout=0.3 .*algorithm.model_dropout=0.5"):
        model_dropout(compose_config("algorithm=um_pfssl", "model.dropout=0.3"))


@pytest.mark.parametrize("value", ["1.5", "-0.1"])
def test_a_bad_algorithm_model_dropout_is_named(value, tmp_path, capsys):
    from fedjax_semi.cli import _task

    cfg = compose_hydra(
        "algorithm=um_pfssl", f"algorithm.model_dropout={value}", f"out_dir={tmp_path}"
    )
    with pytest.raises(SystemExit):
        _task(cfg)
    err = capsys.readouterr().err
    assert err.startswith(f"fedjax-semi: error: algorithm.model_dropout={float(value)} is not")
