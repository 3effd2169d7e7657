"""Experiment presets compose with real Hydra, validate, and carry the paper's numbers."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from conftest import compose_config, compose_hydra
from fedjax_semi.cli import CONF_DIR
from fedjax_semi.config import validate
from fedjax_semi.results.report import _paper_value
from fedjax_semi.store import as_config

PRESETS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))


# The two presets sweeping every UM-pFSSL row compose one config per row (the slowest here):
# make test-slow; the fast suite composes seven of the record's eleven rows with their tuned
# values (test_tuned_apply.py) and checks the paper-scale one's paper rows below.
SLOW_PRESETS = ("um_pfssl_table1", "um_pfssl_table1_record")


def swept(name: str) -> list[tuple[str, str]]:
    """(key, value) of every value the preset's Hydra sweep sets (Optuna's search spaces, e.g.
    tag(log, interval(0.005, 0.2)): their bounds)."""
    raw = yaml.safe_load(Path(CONF_DIR / "experiment" / f"{name}.yaml").read_text())
    out = []
    for key, values in (raw.get("hydra", {}).get("sweeper", {}).get("params", {}) or {}).items():
        inner = re.findall(r"\(([^()]*)\)", str(values))
        out += [(key, v.strip()) for v in (inner[-1] if inner else str(values)).split(",")]
    return out


def is_group(key: str) -> bool:
    """Whether a swept key is a config group (a directory of conf/), composed anew per value."""
    return (CONF_DIR / key).is_dir()


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_PRESETS else n for n in PRESETS]
)
def test_preset_composes_and_validates(name):
    """The preset, and every swept value (seed too) set on the composed node as Hydra's override
    sets it; a swept config group is composed again in the test below."""
    node = compose_hydra(f"+experiment={name}", small=False)
    validate(as_config(node))
    for key, v in swept(name):
        if is_group(key):
            continue
        swept_node = copy.deepcopy(node)
        OmegaConf.update(swept_node, key, yaml.safe_load(v), merge=False)
        validate(as_config(swept_node))


# A compose costs about 0.5 s: the presets of record (`*_record*`, what the tables run) compose
# every swept config-group value in the fast suite; the others (the older CPU presets and the
# paper-scale ones: about 30 s of composes) in make test-slow.
GROUP_SWEEPS = [
    n if "record" in n and n not in SLOW_PRESETS else pytest.param(n, marks=pytest.mark.slow)
    for n in PRESETS
    if any(is_group(k) for k, _ in swept(n))
]


@pytest.mark.parametrize("name", GROUP_SWEEPS)
def test_every_swept_config_group_value_composes(name):
    for key, v in swept(name):
        if is_group(key):
            validate(compose_config(f"+experiment={name}", f"{key}={v}", small=False))


def test_table1_carries_every_paper_number():
    cfg = compose_config("+experiment=um_pfssl_table1", small=False)
    assert len(cfg.paper) == 40
    as_dict = {"algorithm": {"name": "um_pfssl"}, "partition": {"alpha": 0.5}}
    assert _paper_value(cfg.paper, as_dict, "personal_acc") == pytest.approx(0.7838)
    assert cfg.algorithm.lr == 1e-4 and cfg.rounds == 200 and cfg.num_clients == 100


def test_dofed_table1_carries_every_paper_number():
    """Spec dofed_spp.md 5.1: 5 methods x 3 datasets x 2 partitions, classification / labeling."""
    image = compose_config("+experiment=dofed_spp_table1", small=False)
    text = compose_config("+experiment=dofed_spp_table1_dbpedia", small=False)
    assert len(image.paper) == 20 and len(text.paper) == 10
    cfg = {
        "algorithm": {"name": "dofed_spp"},
        "dataset": {"name": "cifar100"},
        "partition": {"scheme": "normal"},
    }
    assert _paper_value(image.paper, cfg, "personal_acc") == pytest.approx(0.68)
    assert _paper_value(image.paper, cfg, "pl_acc") == pytest.approx(0.85)
    assert image.num_clients == 25 and image.stop.plateau == 0.01 and image.model.conv_kernel == 3
    assert text.algorithm.lr == 5.0 and text.dataset.vocab_size == 200002
