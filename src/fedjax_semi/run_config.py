"""What a run directory records of its settings: run_config.json, compared on resume=true, and
the per-seed Hydra configs of replicas."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

from fedjax_semi.errors import bad

if TYPE_CHECKING:  # the results tools read run_config.json without importing jax through Config
    from fedjax_semi.config import Config

# The settings a run was started with, compared on resume=true (written by every run, the
# replicas' too, and by runs started from Python; Hydra's .hydra/ is not in out_dir).
RUN_CONFIG = "run_config.json"

# Keys that only control the run (how it is resumed, logged and saved), never a number it
# writes: the report pools runs that differ in them. A key covers every key under it.
RUN_CONTROL_KEYS = frozenset(
    {
        "resume",
        "progress",
        "writers",  # where the metrics are written, not what they are
        "out_dir",
        "checkpoint_every",
        "save_partition",
        "objective",  # what the run reports to a sweeper
    }
)

# Keys that may differ between a run and its resumption: they say how far a run goes, when it
# stops, what it logs and how the work is laid out on the hardware, never what state a round
# produces. A key covers every key under it ("stop" is stop.*).
RESULT_NEUTRAL_KEYS = RUN_CONTROL_KEYS | {
    "rounds",  # extending a run is what resume is for
    "paper",  # reference numbers for the report
    "tuned",  # the tuner's entries: the values they set are compared under their own keys
    # Evaluations read the state and never change it; eval_every only changes which rows
    # carry accuracies (and so the evaluations a stop rule counts).
    "eval_every",
    "eval_every_time",
    "eval_initial",
    "stop",  # stopping rules decide how far to go, like rounds
    # Chunk sizes, devices, batch sizes and backend give the same numbers to float
    # tolerance by design (tested).
    "hardware",
}


def _covered(key: str, keys: frozenset) -> bool:
    parts = key.split(".")
    return any(".".join(parts[:i]) in keys for i in range(1, len(parts) + 1))


def run_control(key: str) -> bool:
    """Whether `key` (dotted) only controls the run (RUN_CONTROL_KEYS)."""
    return _covered(key, RUN_CONTROL_KEYS)


def result_neutral(key: str) -> bool:
    """Whether `key` (dotted) may change when a run is resumed (RESULT_NEUTRAL_KEYS)."""
    return _covered(key, RESULT_NEUTRAL_KEYS)


def flat_keys(tree: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            out.update(flat_keys(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_json(cfg: Config) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))


def check_resume(cfg: Config, out: Path) -> None:
    """resume=true on a run directory started with settings that change results (any key but
    RESULT_NEUTRAL_KEYS) fails with one line listing those keys, old -> new; nothing is
    written. Resuming such a run would splice two different experiments into one curve."""
    path = Path(out) / RUN_CONFIG
    if not cfg.resume or not path.exists():
        return
    try:
        old = flat_keys(json.loads(path.read_text()))
    except (OSError, ValueError) as e:
        raise bad(
            "resume",
            True,
            f"{path} cannot be read ({type(e).__name__}); delete it to resume without comparing "
            "settings, or set resume=false",
        ) from None
    new = flat_keys(config_json(cfg))
    # Keys only one side has (added or removed by a code update) cannot be compared.
    changed = [
        f"{k}: {old[k]!r} -> {new[k]!r}"
        for k in new
        if k in old and old[k] != new[k] and not result_neutral(k)
    ]
    if changed:
        raise bad(
            "resume",
            True,
            f"{out} holds a run started with other settings that change results ("
            + "; ".join(changed)
            + "); resume it with those (rounds, stop.*, eval_every and hardware.* may change) "
            "or use a new out_dir",
        )


def write_run_config(cfg: Config, out: Path) -> None:
    """out/run_config.json: the settings of this run (replaced atomically: a run killed while
    writing it leaves the old one)."""
    tmp = out / f"{RUN_CONFIG}.tmp"
    tmp.write_text(json.dumps(config_json(cfg), indent=1))
    tmp.replace(out / RUN_CONFIG)


def data_seed(cfg: Config) -> int:
    """The seed of the data: the partition, the subsample and the server pool (`data_seed`, or
    `seed` when that is null). Model init, sampling and dropout draw on `seed`."""
    return cfg.seed if cfg.data_seed is None else cfg.data_seed


def write_seed_config(cfg: Config, out: Path, seed: int) -> None:
    """out/seed_<seed>/.hydra/{config,overrides}.yaml: a replica's run directory reads like the
    run of `seed=<seed>` alone (its config, run as it is, gives the same numbers: the data seed
    is pinned), so fedjax-semi-report groups replicas as seeds of one setting."""
    import yaml
    from omegaconf import OmegaConf

    hydra_dir = out / f"seed_{seed}" / ".hydra"
    hydra_dir.mkdir(parents=True, exist_ok=True)
    alone = dataclasses.replace(cfg, seed=seed, data_seed=data_seed(cfg), replicas=1)
    config = OmegaConf.to_container(OmegaConf.structured(alone))
    (hydra_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    parent = out / ".hydra" / "overrides.yaml"
    overrides = (yaml.safe_load(parent.read_text()) or []) if parent.exists() else []
    overrides = [o for o in overrides if o.split("=")[0].lstrip("+~") not in ("seed", "replicas")]
    (hydra_dir / "overrides.yaml").write_text(yaml.safe_dump([*overrides, f"seed={seed}"]))
