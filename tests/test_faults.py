"""Faults end clearly and lose nothing: bad partition files, damaged or half-written checkpoints,
and resuming with settings that would change the results."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from conftest import SMALL, compose_config
from fedjax_semi import experiment
from fedjax_semi.config import ConfigError
from fedjax_semi.results.rundir import Checkpointer, CheckpointWarning

# One tiny run shared by the tests: checkpoints after rounds 2 and 4, its partition saved.
TINY = ("algorithm=fedavg", "rounds=4", "checkpoint_every=2", "save_partition=true")


def rows(path: Path) -> list[dict]:
    out = [json.loads(line) for line in path.read_text().splitlines()]
    for r in out:
        r.pop("wall_time")
    return out


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fedjax_semi.cli", *SMALL, *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def one_error_line(r: subprocess.CompletedProcess) -> str:
    """The CLI failed with exit 2 and one `fedjax-semi: error:` line, no traceback."""
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("fedjax-semi: error:")]
    assert len(errors) == 1, r.stderr
    return errors[0]


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("base")
    experiment.run(experiment.build(compose_config(*TINY)), out)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["2", "4"]
    return out


@pytest.fixture
def run_dir(base_run, tmp_path) -> Path:
    """A fresh copy of the shared run, to damage."""
    return Path(shutil.copytree(base_run, tmp_path / "run"))


def resume(out: Path, *over: str) -> dict:
    return experiment.run(experiment.build(compose_config(*TINY, "resume=true", *over)), out)


def template():
    """The structure a checkpoint of the tiny run restores into."""
    return experiment.build(compose_config(*TINY)).runner().template()


def write_junk(path: Path) -> None:
    path.write_bytes(np.random.default_rng(0).integers(0, 256, path.stat().st_size, np.uint8))


# ------------------------------------------------------------------------- partition.file


def rewrite_npz(src: Path, dst: Path, edit) -> Path:
    with np.load(src) as z:
        arrays = {k: z[k] for k in z.files}
    edit(arrays)
    with open(dst, "wb") as f:
        np.savez_compressed(f, **arrays)
    return dst


def drop_test_role(a: dict) -> None:
    header = json.loads(str(a["header"]))
    header["roles"].remove("test")
    a["header"] = np.array(json.dumps(header))
    del a["clients/test/values"], a["clients/test/offsets"]


def damaged_partition(kind: str, good: Path, tmp: Path) -> Path:
    data, p = good.read_bytes(), tmp / f"{kind}.npz"
    if kind == "missing":
        return tmp / "nonexistent" / "p.npz"
    if kind == "truncated":
        p.write_bytes(data[: len(data) // 2])
    elif kind == "empty":
        p.write_bytes(b"")
    elif kind == "junk":
        p.write_bytes(np.random.default_rng(0).integers(0, 256, len(data), np.uint8).tobytes())
    elif kind == "junk_inside":  # a zip archive with junk over its members' data
        junk = np.random.default_rng(0).integers(0, 256, 300, np.uint8).tobytes()
        p.write_bytes(data[:200] + junk + data[500:])
    elif kind == "out_of_range":

        def shift(a):
            a["clients/labeled/values"] = a["clients/labeled/values"] + 100_000

        rewrite_npz(good, p, shift)
    elif kind == "missing_role":
        rewrite_npz(good, p, drop_test_role)
    return p


PARTITION_FAULTS = [
    ("missing", "no such file"),
    ("truncated", "damaged or truncated .npz"),
    ("empty", "the file is empty"),
    ("junk", "not a .npz archive"),
    ("junk_inside", "damaged or truncated .npz"),
    ("out_of_range", r"clients/labeled has indices \d+\.\.\d+, outside \[0, 1797\)"),
    ("missing_role", r"it lacks the roles \['test'\]"),
]


@pytest.mark.parametrize("kind,why", PARTITION_FAULTS, ids=[k for k, _ in PARTITION_FAULTS])
def test_bad_partition_file_fails_before_any_work(kind, why, base_run, tmp_path):
    path = damaged_partition(kind, base_run / "partition.npz", tmp_path)
    cfg = compose_config(*TINY, f"partition.file={path}")
    with pytest.raises(ConfigError, match=rf"^partition\.file='{path}' is not allowed: {why}"):
        experiment.build(cfg)


def test_partition_file_of_other_num_clients(base_run):
    path = base_run / "partition.npz"
    cfg = compose_config(*TINY, f"partition.file={path}", "num_clients=10")
    with pytest.raises(ConfigError, match="partition.file=.* it holds 12 clients, num_clients=10"):
        experiment.build(cfg)
    # The file itself is fine: with num_clients=12 it gives the run's partition.
    exp = experiment.build(compose_config(*TINY, f"partition.file={path}"))
    assert exp.partition.num_clients == 12


def test_cli_missing_partition_file_is_one_line(tmp_path):
    r = cli(f"out_dir={tmp_path}", "partition.file=/nonexistent/p.npz")
    line = one_error_line(r)
    assert "partition.file='/nonexistent/p.npz'" in line and "no such file" in line
    assert not (tmp_path / "metrics.jsonl").exists()


# ------------------------------------------------------------------------- checkpoints


def test_junk_in_latest_checkpoint_falls_back_to_the_previous_one(run_dir, base_run):
    """Junk bytes in the newest checkpoint's files, plus what a writer killed mid-save leaves
    (an Orbax temporary directory, a partial metrics line): resume warns, restores round 2,
    redoes rounds 3-4 and ends with the uninterrupted run's metrics."""
    ckpts = run_dir / "checkpoints"
    for f in (ckpts / "4").rglob("*"):
        if f.is_file():
            write_junk(f)
    tmp = ckpts / "6.orbax-checkpoint-tmp-1700000000000000"
    (tmp / "default").mkdir(parents=True)
    (tmp / "default" / "_METADATA").write_text('{"tree_metadata": {')
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write('{"round": 5, "train_lo')
    with pytest.warns(CheckpointWarning, match=r"round 4\) cannot be restored.*from round 2"):
        resume(run_dir)
    assert rows(run_dir / "metrics.jsonl") == rows(base_run / "metrics.jsonl")
    # The damaged one is set aside, the intact one kept, round 4 saved anew, the tmp dir gone.
    assert sorted(p.name for p in ckpts.iterdir()) == ["2", "4", "4.corrupt"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", CheckpointWarning)
        step, _ = Checkpointer(ckpts).restore_latest(template())
    assert step == 4


def test_step_directory_missing_its_files_is_skipped(run_dir):
    """A step directory without its files (a copy or a file system that lost them)."""
    shutil.rmtree(run_dir / "checkpoints" / "4" / "default")
    with pytest.warns(CheckpointWarning, match=r"checkpoints/4 \(round 4\) cannot be restored"):
        step, state = Checkpointer(run_dir / "checkpoints").restore_latest(template())
    assert step == 2 and int(state.round) == 2


def test_close_leaves_no_orbax_thread_running(tmp_path, monkeypatch):
    # The manager's removal of temporary directories runs in a thread started when it opens;
    # close() must wait for it, or a run that ends on an error right after a restore (the test
    # below) has that thread fail during interpreter shutdown and print a traceback. A slow
    # removal makes the race certain.
    from orbax.checkpoint._src.path import temporary_paths

    done = []

    async def slow_cleanup(*args, **kwargs):
        await asyncio.sleep(0.5)
        done.append(True)

    monkeypatch.setattr(temporary_paths, "cleanup_temporary_paths", slow_cleanup)
    Checkpointer(tmp_path / "checkpoints").close()
    assert done == [True]


def test_all_checkpoints_damaged_is_one_clear_error(run_dir):
    log = (run_dir / "metrics.jsonl").read_text()
    for f in (run_dir / "checkpoints").rglob("*"):
        if f.is_file():
            write_junk(f)
    r = cli(*TINY, f"out_dir={run_dir}", "resume=true")
    line = one_error_line(r)
    assert f"no intact checkpoint in {run_dir / 'checkpoints'}: rounds [2, 4]" in line, line
    assert "[absl]" not in r.stderr  # Orbax's own error lines are not shown besides
    assert (run_dir / "metrics.jsonl").read_text() == log  # nothing lost
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["2", "4"]


# ------------------------------------------------------------------------- resume settings


def test_resume_with_changed_settings_is_refused(run_dir):
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    over = ("seed=1", "algorithm=local", "algorithm.lr=0.2", "partition.alpha=0.3")
    with pytest.raises(ConfigError) as e:
        resume(run_dir, *over)
    msg = str(e.value)
    assert msg.startswith("resume=True is not allowed:") and "\n" not in msg
    changes = ("algorithm.name: 'fedavg' -> 'local'", "algorithm.lr: 0.1 -> 0.2")
    for change in (*changes, "partition.alpha: 0.5 -> 0.3", "seed: 0 -> 1"):
        assert change in msg, msg
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before


def test_resume_extending_rounds_is_accepted(run_dir, base_run):
    """rounds, hardware.*, stop.* and eval_every may change on resume."""
    over = ("rounds=5", "hardware.chunk=2", "stop.patience=50", "eval_every=2")
    summary = resume(run_dir, *over)
    assert summary["rounds_completed"] == 5
    got = rows(run_dir / "metrics.jsonl")
    assert got[:4] == rows(base_run / "metrics.jsonl") and got[4]["round"] == 5
    assert json.loads((run_dir / "run_config.json").read_text())["rounds"] == 5
