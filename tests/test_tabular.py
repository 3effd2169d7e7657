"""Tests for fedjax_semi.data.tabular: UCI Adult parsing, encoding and an MLP on features."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_semi.data.registry import DatasetNotFoundError
from fedjax_semi.data.tabular import load_adult
from fedjax_semi.models.zoo import make_model

# Real UCI format: ", " separated, "?" for missing, blank line at the end.
ADULT_DATA = """\
39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, Male, 2174, 0, 40, United-States, <=50K
50, Self-emp-not-inc, 83311, Bachelors, 13, Married-civ-spouse, Exec-managerial, Husband, White, Male, 0, 0, 13, United-States, <=50K
38, Private, 215646, HS-grad, 9, Divorced, Handlers-cleaners, Not-in-family, White, Male, 0, 0, 40, United-States, <=50K
52, ?, 209642, HS-grad, 9, Married-civ-spouse, ?, Husband, White, Male, 0, 0, 45, United-States, >50K

"""  # noqa: E501
# adult.test: a first comment line and labels with a trailing "."; row 0 has unseen
# categories (11th, Machine-op-inspct, Own-child, Black).
ADULT_TEST = """\
|1x3 Cross validator
25, Private, 226802, 11th, 7, Never-married, Machine-op-inspct, Own-child, Black, Male, 0, 0, 40, United-States, <=50K.
38, ?, 89814, HS-grad, 9, Married-civ-spouse, Farming-fishing, Husband, White, Male, 0, 0, 50, United-States, >50K.
"""  # noqa: E501

NUMERIC_TRAIN = {
    "age": [39, 50, 38, 52],
    "fnlwgt": [77516, 83311, 215646, 209642],
    "education-num": [13, 13, 9, 9],
    "capital-gain": [2174, 0, 0, 0],
    "capital-loss": [0, 0, 0, 0],
    "hours-per-week": [40, 13, 40, 45],
}


def _write(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "adult.data").write_text(ADULT_DATA)
    (root / "adult.test").write_text(ADULT_TEST)
    return root


def _std(col: str, v: float) -> float:
    a = np.asarray(NUMERIC_TRAIN[col], np.float64)
    s = a.std() if a.std() > 0 else 1.0  # capital-loss is constant in the fixture
    return (v - a.mean()) / s


def test_load_adult_encoding_by_hand(tmp_path: Path) -> None:
    ds = load_adult(str(_write(tmp_path / "adult")))
    assert ds.name == "adult" and ds.kind == "features" and ds.num_classes == 2
    assert ds.x_train.dtype == ds.x_test.dtype == np.float32
    assert ds.y_train.dtype == np.int32
    np.testing.assert_array_equal(ds.y_train, [0, 0, 0, 1])
    np.testing.assert_array_equal(ds.y_test, [0, 1])  # "." stripped, comment line skipped
    names = ds.side["feature_names"]
    assert names == [
        "age",
        "workclass=?",  # "?" is a category of its own ("?" sorts before letters)
        "workclass=Private",
        "workclass=Self-emp-not-inc",
        "workclass=State-gov",
        "fnlwgt",
        "education=Bachelors",
        "education=HS-grad",
        "education-num",
        "marital-status=Divorced",
        "marital-status=Married-civ-spouse",
        "marital-status=Never-married",
        "occupation=?",
        "occupation=Adm-clerical",
        "occupation=Exec-managerial",
        "occupation=Handlers-cleaners",
        "relationship=Husband",
        "relationship=Not-in-family",
        "race=White",
        "sex=Male",
        "capital-gain",
        "capital-loss",
        "hours-per-week",
        "native-country=United-States",
    ]
    assert ds.x_train.shape == (4, 24) and ds.x_test.shape == (2, 24)

    def expected(numeric: dict[str, float], cats: set[str]) -> np.ndarray:
        return np.asarray(
            [_std(n, numeric[n]) if n in numeric else float(n in cats) for n in names],
            np.float32,
        )

    # Train row 3: "?" workclass and occupation.
    want = expected(
        dict(zip(NUMERIC_TRAIN, [52, 209642, 9, 0, 0, 45], strict=True)),
        {
            "workclass=?",
            "education=HS-grad",
            "marital-status=Married-civ-spouse",
            "occupation=?",
            "relationship=Husband",
            "race=White",
            "sex=Male",
            "native-country=United-States",
        },
    )
    np.testing.assert_allclose(ds.x_train[3], want, rtol=1e-5, atol=1e-6)
    # Test row 0: unseen education/occupation/relationship/race -> all zeros in those groups;
    # numeric columns use the training mean/std.
    want = expected(
        dict(zip(NUMERIC_TRAIN, [25, 226802, 7, 0, 0, 40], strict=True)),
        {
            "workclass=Private",
            "marital-status=Never-married",
            "sex=Male",
            "native-country=United-States",
        },
    )
    np.testing.assert_allclose(ds.x_test[0], want, rtol=1e-5, atol=1e-6)
    # Standardized train columns: mean 0, std 1 (except the constant capital-loss = 0).
    num = [names.index(n) for n in NUMERIC_TRAIN if n != "capital-loss"]
    np.testing.assert_allclose(ds.x_train[:, num].mean(0), 0.0, atol=1e-6)
    np.testing.assert_allclose(ds.x_train[:, num].std(0), 1.0, atol=1e-5)
    np.testing.assert_array_equal(ds.x_train[:, names.index("capital-loss")], 0.0)
    assert not ds.x_train.flags.writeable


def test_adult_bad_label(tmp_path: Path) -> None:
    _write(tmp_path)
    (tmp_path / "adult.data").write_text(ADULT_DATA.replace(">50K", "rich"))
    with pytest.raises(ValueError, match=r"adult\.data:4: unknown income label 'rich'"):
        load_adult(str(tmp_path))


def test_adult_not_found(tmp_path: Path) -> None:
    (tmp_path / "adult.data").write_text(ADULT_DATA)  # adult.test missing
    with pytest.raises(DatasetNotFoundError) as err:
        load_adult(str(tmp_path))
    msg = str(err.value)
    assert "dataset 'adult' not found" in msg and str(tmp_path) in msg
    assert "adult.data, adult.test" in msg and "archive.ics.uci.edu" in msg


def test_mlp_on_features_trains_a_step(tmp_path: Path) -> None:
    ds = load_adult(str(_write(tmp_path)))
    d = ds.x_train.shape[1]
    model = make_model("mlp", (d,), 2, hidden=(8,), input_kind="features")
    assert model.input_kind == "features"
    x = jnp.asarray(ds.x_train)
    # Features pass through unchanged (no / 255).
    np.testing.assert_array_equal(model.preprocess(x), x)
    variables = model.init(jax.random.key(0))
    y = jnp.asarray(ds.y_train)

    def loss(v):
        logits, _ = model.apply(v, x, train=True)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    @jax.jit
    def step(v):
        value, g = jax.value_and_grad(loss)(v)
        return jax.tree_util.tree_map(lambda p, gp: p - 0.5 * gp, v, g), value

    v1, l0 = step(variables)
    _, l1 = step(v1)
    assert np.isfinite(float(l0)) and float(l1) < float(l0)
    with pytest.raises(ValueError, match=r"model\.name='cnn'.*kind 'features'.*mlp"):
        make_model("cnn", (d,), 2, input_kind="features")
