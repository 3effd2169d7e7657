"""A generated UCI Adult fixture in the real file format, for tests that need more rows than
test_tabular's four hand-written ones (same format: ", " separated fields, "?" for missing,
adult.test with its "|1x3 Cross validator" first line and labels with a trailing ".").

The income label follows a noisy logistic rule of education, age, hours and marital status, so
small models learn something from a few dozen rows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

WORKCLASS = ("Private", "Self-emp-not-inc", "Local-gov", "State-gov", "?")
EDUCATION = (("HS-grad", 9), ("Some-college", 10), ("Bachelors", 13), ("Masters", 14), ("11th", 7))
MARITAL = ("Married-civ-spouse", "Never-married", "Divorced")
OCCUPATION = ("Adm-clerical", "Exec-managerial", "Craft-repair", "Sales", "?")
RELATIONSHIP = ("Husband", "Not-in-family", "Own-child", "Wife")
RACE = ("White", "Black", "Asian-Pac-Islander")
SEX = ("Male", "Female")
COUNTRY = ("United-States", "Mexico", "?")


def adult_lines(n: int, rng: np.random.Generator, *, test: bool) -> list[str]:
    """n rows of adult.data (or adult.test: labels end in ".") as text lines."""
    lines = []
    for _ in range(n):
        age = int(rng.integers(17, 80))
        edu, edu_num = EDUCATION[rng.integers(len(EDUCATION))]
        marital = MARITAL[rng.integers(len(MARITAL))]
        hours = int(rng.integers(10, 70))
        gain = int(rng.choice([0, 0, 0, 0, 2174, 7688, 15024]))
        loss = int(rng.choice([0, 0, 0, 0, 0, 1902]))
        logit = 0.5 * (edu_num - 10) + 0.05 * (age - 40) + 0.05 * (hours - 40) - 0.5
        logit += 1.5 * (marital == "Married-civ-spouse") + 2.0 * (gain > 5000)
        rich = rng.random() < 1 / (1 + np.exp(-logit))
        label = ">50K" if rich else "<=50K"
        fields = [
            age,
            WORKCLASS[rng.integers(len(WORKCLASS))],
            int(rng.integers(20000, 400000)),
            edu,
            edu_num,
            marital,
            OCCUPATION[rng.integers(len(OCCUPATION))],
            RELATIONSHIP[rng.integers(len(RELATIONSHIP))],
            RACE[rng.integers(len(RACE))],
            SEX[rng.integers(len(SEX))],
            gain,
            loss,
            hours,
            COUNTRY[rng.integers(len(COUNTRY))],
            label + ("." if test else ""),
        ]
        lines.append(", ".join(map(str, fields)))
    return lines


def write_adult_fixture(root: Path, n_train: int = 400, n_test: int = 200, seed: int = 0) -> Path:
    """adult.data (n_train rows) and adult.test (n_test rows) under root; returns root."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    train = adult_lines(n_train, rng, test=False)
    test = adult_lines(n_test, rng, test=True)
    (root / "adult.data").write_text("\n".join(train) + "\n\n")
    (root / "adult.test").write_text("|1x3 Cross validator\n" + "\n".join(test) + "\n")
    return root
