"""A joint search's grid laid out two-way (results/tune_grid.py), from the tuned.json that
fedjax-semi-tune writes over trial directories made here: every cell against the trials' own
values, the choice marked, and the ambiguous or unknown axis refused in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedjax_semi.results.tune_grid import grid_table, main
from test_tune import fake_trial
from tiny_table import make_conf, tune

LRS, EPOCHS = ("0.03", "0.3", "0.1"), ("1", "2")


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A tuned.json over lr x local_epochs, two seeds, random values; and those values (one
    tuner call for the module: it composes the app's config, seconds)."""
    tmp_path = tmp_path_factory.mktemp("tune_grid")
    conf = make_conf(tmp_path)
    rng = np.random.default_rng(0)
    values = {}
    for alg in ("fedavg", "local"):
        for lr in LRS:
            for e in EPOCHS:
                for seed in (0, 1):
                    v = values[alg, lr, e, seed] = float(rng.uniform(0.2, 0.9))
                    ov = [f"algorithm={alg}", f"seed={seed}", "partition.holdout=0.2",
                          f"algorithm.lr={lr}", f"algorithm.local_epochs={e}"]  # fmt: skip
                    fake_trial(tmp_path / "sweep", f"{alg}-{lr}-{e}-{seed}", ov, v)
    grid = ["--grid", f"algorithm.lr={','.join(LRS)}", "--grid", "algorithm.local_epochs=1,2"]
    assert tune(conf, tmp_path, "--seeds", "0,1", *grid) == 0
    md = (tmp_path / "sweep" / "tuned.md").read_text()
    return (tmp_path / "sweep" / "tuned.json").read_text(), values, md


def cells(text: str) -> dict[str, list[str]]:
    return {
        ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[2:-1]]
        for ln in text.splitlines()
        if ln.startswith("| ") and not ln.startswith("| lr")
    }


def test_every_cell_is_its_points_seeds_and_the_choice_is_marked(tuned, capsys):
    record, values = json.loads(tuned[0]), tuned[1]
    text = grid_table(record, "algorithm.lr", "algorithm.local_epochs",
                      row={"algorithm": "local"}, per_seed=True)  # fmt: skip
    assert text.startswith("algorithm=local\n")
    assert "| lr \\ local_epochs | 1 | 2 |" in text
    got = cells(text)
    assert list(got) == ["0.03", "0.1", "0.3"]  # numeric order, not the grid's or the text's
    means = {}
    for lr in LRS:
        for j, e in enumerate(EPOCHS):
            v = np.array([values["local", lr, e, s] for s in (0, 1)])
            means[lr, e] = v.mean()
            want = f"{v.mean():.3f} ± {v.std(ddof=1):.3f} ({v[0]:.3f} / {v[1]:.3f})"
            assert got[lr][j].strip("*[]") == want
    best = max(means, key=means.get)
    marked = [(lr, e) for lr in LRS for j, e in enumerate(EPOCHS) if got[lr][j].startswith("**[")]
    assert marked == [best]
    both = grid_table(record, "algorithm.lr", "algorithm.local_epochs", per_seed=True)
    assert both.count("| lr \\ local_epochs |") == 2  # one table per tuned row
    # The tuner writes the same two-way tables into tuned.md for a two-knob grid.
    assert "Two-way (seed values in brackets):\n\n" + both in tuned[2]


def test_a_third_axis_must_be_fixed_and_unknown_keys_are_named(tuned, tmp_path, capsys):
    record = json.loads(tuned[0])  # a copy: this test edits it
    with pytest.raises(ValueError, match="'algorithm.psi' is not in the grid"):
        grid_table(record, "algorithm.psi", "algorithm.lr")
    with pytest.raises(ValueError, match="--rows and --cols are both 'algorithm.lr'"):
        grid_table(record, "algorithm.lr", "algorithm.lr")
    # A third axis (beta): its two values would share each cell unless --at fixes one.
    entry = record["rows"][1]
    extra = [{**p, "point": {**p["point"], "algorithm.beta": "0.3"}} for p in entry["points"]]
    for p in entry["points"]:
        p["point"]["algorithm.beta"] = "0.1"
    entry["points"] += extra
    entry["grid"]["algorithm.beta"] = ["0.1", "0.3"]
    two = r"cell algorithm.lr=0.03, .*differ in \['algorithm.beta'\]"
    with pytest.raises(ValueError, match=two):
        grid_table(record, "algorithm.lr", "algorithm.local_epochs", row={"algorithm": "local"})
    one = grid_table(record, "algorithm.lr", "algorithm.local_epochs",
                     row={"algorithm": "local"}, at={"algorithm.beta": "0.3"})  # fmt: skip
    assert one.splitlines()[0] == "algorithm=local, algorithm.beta=0.3"
    assert len(cells(one)) == 3
    with pytest.raises(ValueError, match=r"--at algorithm.beta=0.30 is not allowed"):
        grid_table(record, "algorithm.lr", "algorithm.local_epochs",
                   row={"algorithm": "local"}, at={"algorithm.beta": "0.30"})  # fmt: skip
    f = tmp_path / "tuned.json"
    f.write_text(json.dumps(record))
    with pytest.raises(SystemExit):
        main([str(f), "--rows", "algorithm.lr", "--cols", "algorithm.local_epochs",
              "--row", "algorithm=fedprox"])  # fmt: skip
    assert "--row {'algorithm': 'fedprox'} matches no tuned row" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(f), "--rows", "algorithm.lr", "--cols", "x", "--at", "lr"])
    assert "--at='lr' is not allowed: write KEY=VALUE" in capsys.readouterr().err


def test_a_bad_at_is_named_and_a_diverged_seed_reads_as_the_tuners(tuned):
    record = json.loads(tuned[0])
    for at in ({"algorithm.local_epochs": "2.0"}, {"algorithm.psi": "1"}, {"algorithm.lr": "0.3"}):
        with pytest.raises(ValueError, match=f"--at {next(iter(at))}=.* is not allowed"):
            grid_table(record, "algorithm.lr", "algorithm.local_epochs", at=at)
    record["rows"][0]["points"][0]["values"] = [float("nan"), 0.5]
    text = grid_table(record, "algorithm.lr", "algorithm.local_epochs",
                      row={"algorithm": "fedavg"})  # fmt: skip
    assert "| diverged (NaN / 0.500) |" in text
