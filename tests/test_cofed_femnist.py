"""CoFED's FEMNIST setup (paper Sec. 5.3) on fixtures: the cofed partition's writers variant
(the top writers by sample count, a random 40/60 split of each, Y_i = all or the present
classes) on a LEAF json fixture, and the cofed_femnist preset composed by Hydra and built on
that fixture with Kannada crops (Chars74K's PNG layout) as its public set."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import compose_config
from fedjax_semi import experiment
from fedjax_semi.config import validate
from fedjax_semi.data.registry import load_dataset
from fedjax_semi.errors import ConfigError
from partition_helpers import DEFAULTS, build, check_paper_invariants
from test_image_loaders import write_chars74k_kannada, write_leaf_file

pytestmark = pytest.mark.usefixtures("isolated_data_env")

# Writer -> samples (train + test split); LEAF order f0000.. is not the size order.
SIZES = {"f0000_01": 12, "f0001_02": 30, "f0002_03": 20, "f0003_04": 25, "f0004_05": 8}
TOP = [1, 3, 2, 0]  # by sample count, most first


def write_femnist(root: Path) -> Path:
    """LEAF's femnist/data/{train,test} with SIZES' writers, 75% of each in train; labels from a
    few classes per writer, so the present label spaces differ."""
    rng = np.random.default_rng(0)
    train, test = {}, {}
    for w, (user, n) in enumerate(SIZES.items()):
        x = rng.random((n, 784)).astype(np.float32)
        y = [int(v) for v in rng.choice([w, 10 + w, 36 + w, 61], n)]
        cut = int(0.75 * n)
        train[user], test[user] = (x[:cut], y[:cut]), (x[cut:], y[cut:])
    data = root / "femnist" / "data"
    write_leaf_file(data / "train" / "all_data_0_niid_0_keep_0_train_9.json", train)
    write_leaf_file(data / "test" / "all_data_0_niid_0_keep_0_test_9.json", test)
    return root / "femnist"


@pytest.fixture
def femnist(tmp_path):
    return load_dataset("femnist", data_dir=str(write_femnist(tmp_path)))


def writers_partition(ds, **knobs):
    args = {**DEFAULTS, "scheme": "cofed", "variant": "writers", "public_fraction": 0.0}
    return build(ds, **{**args, "num_clients": 4, "min_client_size": 1, **knobs})


@pytest.mark.parametrize("space", ["all", "present"])
def test_writers_partition(femnist, space):
    p = writers_partition(femnist, label_space=space)
    check_paper_invariants(p, femnist)  # private and test rows disjoint across participants
    writer = np.concatenate([femnist.side["writer_train"], femnist.side["writer_test"]])
    y = np.concatenate([femnist.y_train, femnist.y_test])
    np.testing.assert_array_equal(p.assignments["writer"], TOP)
    spaces = p.assignments["label_space"]
    assert spaces.shape == (4, 62)
    dropped = 0
    for i, w in enumerate(TOP):
        own, test = p.clients["labeled"][i], p.clients["test"][i]
        n = list(SIZES.values())[w]
        assert len(own) == round(0.4 * n)
        assert (writer[own] == w).all() and (writer[test] == w).all()
        present = np.zeros(62, bool)
        present[y[own]] = True
        if space == "all":
            assert spaces[i].all() and len(own) + len(test) == n
        else:  # Y_i = the classes of D_i; test rows of other classes dropped
            np.testing.assert_array_equal(spaces[i], present)
            assert present[y[test]].all()
            dropped += n - len(own) - len(test)
    assert p.meta["test_dropped"] == dropped
    np.testing.assert_array_equal(
        p.server["test_global"], np.sort(np.concatenate(p.clients["test"]))
    )
    assert len(p.server["public"]) == 0
    np.testing.assert_array_equal(p.assignments["label_map"], np.tile(np.arange(62), (4, 1)))
    # The split is seeded: the same seed gives the same partition, another seed another one.
    again = writers_partition(femnist, label_space=space)
    np.testing.assert_array_equal(
        np.concatenate(again.clients["labeled"]), np.concatenate(p.clients["labeled"])
    )
    other = writers_partition(femnist, label_space=space, seed=1)
    assert not np.array_equal(
        np.concatenate(other.clients["labeled"]), np.concatenate(p.clients["labeled"])
    )


def test_writers_public_set_from_the_other_writers(femnist):
    p = writers_partition(femnist, num_clients=3, public_fraction=0.1)
    pub = p.server["public"]
    n_train = len(femnist.y_train)
    assert len(pub) == round(0.1 * n_train) and pub.max() < n_train
    outside = ~np.isin(femnist.side["writer_train"][pub], TOP[:3])
    assert outside.all()  # writers 0 (12 samples) and 4 (8): no participant's row is public


@pytest.mark.parametrize(
    ("knobs", "key"),
    [
        ({"num_clients": 6}, "num_clients=6"),
        ({"train_share": 1.0}, "partition.cofed.train_share=1.0"),
        ({"label_space": "seen"}, "partition.cofed.label_space='seen'"),
        ({"public_fraction": 0.5}, "partition.cofed.public_fraction=0.5"),
    ],
)
def test_writers_bad_input_one_line(femnist, knobs, key):
    with pytest.raises(ValueError) as e:
        writers_partition(femnist, **knobs)
    assert str(e.value).startswith(key) and "\n" not in str(e.value)


def test_writers_need_per_sample_writers():
    digits = load_dataset("digits")
    with pytest.raises(ValueError, match=r"^partition\.cofed\.variant='writers'.*femnist"):
        writers_partition(digits)


@pytest.mark.slow  # 12 s; test_experiments composes and validates the preset in make test
def test_cofed_femnist_preset_builds_on_fixtures(tmp_path):
    leaf = write_femnist(tmp_path / "leaf")
    write_chars74k_kannada(tmp_path / "chars74k")
    overrides = [
        "+experiment=cofed_femnist",
        f"dataset.data_dir={leaf}",
        f"dataset.server_pool_dir={tmp_path / 'chars74k'}",
        "num_clients=4",
        "clients_per_round=4",
        "partition.min_client_size=1",
        "algorithm.table1_models=2",
        "progress=false",
        "save_partition=false",
    ]
    cfg = compose_config(*overrides, small=False)
    p, a = cfg.partition, cfg.algorithm
    assert (p.scheme, p.cofed.variant, p.cofed.train_share, p.cofed.public_fraction) == (
        "cofed", "writers", 0.4, 0.0
    )  # fmt: skip
    assert (p.cofed.label_space, a.label_space, a.alpha) == ("all", "all", 0.01)
    assert cfg.dataset.server_pool == "kannada" and cfg.paper[0]["rel_acc"] == 1.156
    exp = experiment.build(cfg)
    np.testing.assert_array_equal(exp.partition.assignments["writer"], TOP)
    public = np.asarray(exp.fed.server["public"])
    assert len(public) == 50_000  # load_kannada_crops' default: the paper's ~50,000
    assert exp.fed.x.shape[1:] == (28, 28, 1) and (np.asarray(exp.fed.eval_y)[public] == -1).all()
    import jax

    state = exp.alg.init(jax.random.PRNGKey(0), exp.fed)
    assert np.asarray(state.Y).all()  # every participant owns all 62 classes
    # The two label-space knobs must agree (one line naming the algorithm's).
    with pytest.raises(ConfigError, match=r"^algorithm\.label_space='present'.*'all'"):
        validate(compose_config(*overrides, "algorithm.label_space=present", small=False))
    with pytest.raises((ConfigError, ValueError)) as e:
        compose_config(*overrides, "algorithm.label_space=seen", small=False)
    assert "algorithm.label_space='seen'" in str(e.value) and "\n" not in str(e.value)


def changed_keys(base_name: str, name: str) -> dict:
    """The dotted keys whose composed value differs between two experiment presets."""
    from omegaconf import OmegaConf

    from conftest import compose_hydra

    def flat(preset: str) -> dict:
        node = OmegaConf.to_container(compose_hydra(f"+experiment={preset}", small=False))
        out = {}
        todo = list(node.items())
        while todo:  # nested groups (partition.cofed.*) flattened to their dotted keys
            key, v = todo.pop()
            if isinstance(v, dict) and v:
                todo += [(f"{key}.{k}", w) for k, w in v.items()]
            else:
                out[key] = v
        return out

    base, other = flat(base_name), flat(name)
    return {k: other[k] for k in other if base.get(k) != other[k]}


@pytest.mark.parametrize(
    "base, hard",
    [
        ("cofed_fmnist", "cofed_fmnist_hard"),
        # Table 2's baselines on the harder stand-in: the same partition, so the same private sets.
        ("cofed_fmnist_pfedavg", "cofed_fmnist_hard_pfedavg"),
        ("cofed_fmnist_fedmd", "cofed_fmnist_hard_fedmd"),
    ],
)
def test_cofed_fmnist_hard_changes_only_the_data(base, hard):
    """The harder stand-in: the paper's 6-8 classes, 10 images a class, 2,000 public rows."""
    assert changed_keys(base, hard) == {
        "partition.cofed.min_classes": 6,
        "partition.cofed.max_classes": 8,
        "partition.cofed.samples_per_class": 10,
        "partition.cofed.public_fraction": 0.1112,
    }


def test_cofed_fmnist_ood_changes_only_the_public_set(femnist):
    changed = changed_keys("cofed_fmnist", "cofed_fmnist_ood")
    assert changed == {
        "dataset.server_pool": "digits",
        "dataset.server_pool_size": 1000,
        "partition.cofed.public_fraction": 0.0,
    }
    # The public set: 1,000 of the 8x8 digits, upsampled to the task's 28x28x1.
    cfg = compose_config("+experiment=cofed_fmnist_ood", small=False)
    images, labels = experiment.server_pool(cfg, femnist, first_label=10)
    public = images["public"]
    assert public.shape == (1000, 28, 28, 1) and public.dtype == np.uint8
    assert labels == {}  # an unlabeled pool: CoFED's public set
