"""Metric writers (config `writers`): TensorBoard event files that TensorBoard's own reader reads
back as the values of metrics.jsonl, also after a resume that redoes rounds; no tensorboard/
with writers=[jsonl]; one clear line for a writer list that is not allowed."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import compose_config
from fedjax_semi import config, experiment
from fedjax_semi.results import writers

# eval_every=2: round 1 has no evaluation, so the eval/ tags must skip its step. Checkpoints
# after rounds 2 and 3, for the resume test.
OVERRIDES = ("algorithm=fedavg_pl", "rounds=3", "eval_every=2", "checkpoint_every=2")


@pytest.fixture(scope="module")
def built():
    return experiment.build(compose_config(*OVERRIDES))


@pytest.fixture(scope="module")
def run_dir(built, tmp_path_factory) -> Path:
    """The one run of the module, with the default writers."""
    assert built.cfg.writers == ["jsonl", "tensorboard"]
    out = tmp_path_factory.mktemp("run")
    experiment.run(built, out)
    return out


def read_scalars(logdir: Path) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} as TensorBoard itself reads the event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})  # 0: keep every event
    acc.Reload()
    out = {}
    for tag in acc.Tags()["scalars"]:
        events = acc.Scalars(tag)
        steps = [e.step for e in events]
        assert len(set(steps)) == len(steps), f"{tag}: a step written twice {steps}"
        out[tag] = {e.step: e.value for e in events}
    return out


def rows_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def assert_tensorboard_equals_jsonl(run_dir: Path) -> dict[str, dict[int, float]]:
    rows = rows_of(run_dir)
    # The evaluation's keys are those only the evaluated rounds (2, 3, ...) have.
    eval_keys = set(rows[1]) - set(rows[0])
    assert {"accuracy", "global_acc", "client_acc_p10"} <= eval_keys
    want: dict[str, dict[int, float]] = {}
    for row in rows:
        for tag, value in writers.scalar_tags(row, eval_keys):
            want.setdefault(tag, {})[row["round"]] = value
    assert {"train/loss", "eval/accuracy", "eval/personal_acc", "time/sim_time"} <= set(want)
    assert want["train/loss"] == {r["round"]: r["train_loss"] for r in rows}
    assert not any("cohort" in tag or tag.endswith("/round") for tag in want)
    got = read_scalars(run_dir / "tensorboard")
    assert set(got) == set(want)
    for tag, by_step in want.items():
        assert sorted(got[tag]) == sorted(by_step), tag
        steps = sorted(by_step)
        # TensorBoard keeps a scalar summary as a float32 (simple_value) while metrics.jsonl
        # keeps Python floats (float64): the values agree to float32 rounding, 2**-24 relative.
        np.testing.assert_allclose(
            [got[tag][s] for s in steps], [by_step[s] for s in steps], rtol=1e-6, err_msg=tag
        )
    return got


def test_tensorboard_scalars_equal_metrics_jsonl(run_dir):
    assert [r["round"] for r in rows_of(run_dir)] == [1, 2, 3]
    got = assert_tensorboard_equals_jsonl(run_dir)
    assert got["eval/accuracy"].keys() == {2, 3}


def resume(built, out: Path, **changes) -> None:
    cfg = dataclasses.replace(built.cfg, resume=True, **changes)
    experiment.run(dataclasses.replace(built, cfg=cfg), out)


def test_resume_redoes_rounds_in_the_event_files_without_doubling_them(built, run_dir, tmp_path):
    """Resumed from round 2 (the checkpoint of round 3 gone) and extended to round 4: round 3 is
    redone and its first events are purged from view (read_scalars refuses a doubled step)."""
    out = Path(shutil.copytree(run_dir, tmp_path / "run"))
    shutil.rmtree(out / "checkpoints" / "3")
    resume(built, out, rounds=4)
    assert [r["round"] for r in rows_of(out)] == [1, 2, 3, 4]
    got = assert_tensorboard_equals_jsonl(out)  # the redone round 3's wall time included
    assert got["train/loss"].keys() == {1, 2, 3, 4}


def test_jsonl_alone_writes_no_tensorboard_folder(built, run_dir, tmp_path):
    """A resume with nothing left to do (no round to compile) opens the writers as any run."""
    out = Path(shutil.copytree(run_dir, tmp_path / "run"))
    shutil.rmtree(out / "tensorboard")
    resume(built, out, writers=["jsonl"])
    assert [r["round"] for r in rows_of(out)] == [1, 2, 3]
    assert not (out / "tensorboard").exists()


@pytest.mark.parametrize(
    "value, needle",
    [
        ("[jsonl,tensorbord]", "a list of names from ['jsonl', 'tensorboard', 'mlflow']"),
        ("[tensorboard]", "a list with 'jsonl'"),
        ("[jsonl,jsonl]", "naming each writer once"),
    ],
)
def test_bad_writers_fail_with_one_line(value, needle):
    with pytest.raises(config.ConfigError) as e:
        experiment.build(compose_config(f"writers={value}"))
    msg = str(e.value)
    assert msg.startswith("writers=[") and needle in msg and "\n" not in msg


def test_mlflow_without_the_package_fails_with_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # find_spec then reports it missing
    with pytest.raises(config.ConfigError) as e:
        experiment.build(compose_config("writers=[jsonl,mlflow]"))
    assert str(e.value) == (
        "writers=['jsonl', 'mlflow'] is not allowed: 'mlflow' needs the mlflow package: "
        "pip install mlflow"
    )


def test_config_and_writers_name_the_same_writers():
    assert set(config.WRITERS) == set(writers.WRITERS)


def test_a_writer_started_within_the_same_second_keeps_the_earlier_file(tmp_path):
    """tensorboardX names event files by the second and the host: a resume that starts its
    writer in the second the last one started must not truncate that file (it did, and the
    resume test above failed whenever a run and its resume fell into one second)."""
    from fedjax_semi.engine.loop import Run

    first = Run([tmp_path], None, 2)
    tb = writers.TensorBoard()
    tb.start(first)
    tb.write(first, 1, {0: {"round": 1, "train_loss": 1.0}})
    tb.end(first, None)
    resumed = Run([tmp_path], None, 2, start=1, resumed=True)
    tb.start(resumed)  # at once: the same second, almost always
    tb.write(resumed, 2, {0: {"round": 2, "train_loss": 0.5}})
    tb.end(resumed, None)
    assert len(list((tmp_path / "tensorboard").glob("*tfevents*"))) == 2
    assert read_scalars(tmp_path / "tensorboard")["train/loss"] == {1: 1.0, 2: 0.5}
