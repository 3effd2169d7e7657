"""Tabular data sources: UCI Adult (census income) as standardized float features.

:func:`load_adult` returns an :class:`~fedjax_semi.data.dataset.ArrayDataset` with
``kind="features"``: ``x float32 [N, D]`` (numeric columns standardized with training
statistics, categorical columns one-hot with categories from the training split) and
labels ``int32 [N]`` (``>50K`` = 1). :func:`read_adult_rows` and :class:`AdultEncoding` expose
the raw rows and the encoding (CoFED's synthetic public rows are drawn raw, then encoded). No
jax here, like the rest of the data layer.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from fedjax_semi.data.dataset import ArrayDataset, DatasetNotFoundError
from fedjax_semi.data.lookup import ENV_VAR, search_dirs

__all__ = ["ADULT_COLUMNS", "ADULT_NUMERIC", "AdultEncoding", "load_adult", "read_adult_rows"]

ADULT_URL = "https://archive.ics.uci.edu/dataset/2/adult"
# The 14 feature columns of adult.data / adult.test, in file order (adult.names).
ADULT_COLUMNS = (
    "age",
    "workclass",
    "fnlwgt",
    "education",
    "education-num",
    "marital-status",
    "occupation",
    "relationship",
    "race",
    "sex",
    "capital-gain",
    "capital-loss",
    "hours-per-week",
    "native-country",
)
ADULT_NUMERIC = frozenset(
    {"age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week"}
)


def _read_adult(path: Path) -> tuple[list[list[str]], np.ndarray]:
    """One UCI Adult file -> (rows of 14 stripped string fields, int32 labels).

    Skips blank lines and ``|`` comment lines (``adult.test`` starts with
    ``|1x3 Cross validator``); accepts labels with or without the trailing ``.`` of
    ``adult.test``. ``"?"`` (missing) is kept as a value of its own.
    """
    rows: list[list[str]] = []
    labels: list[int] = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            line = line.strip()
            if not line or line.startswith("|"):
                continue
            fields = [v.strip() for v in line.split(",")]
            if len(fields) != len(ADULT_COLUMNS) + 1:
                raise ValueError(
                    f"{path}:{line_no}: {len(fields)} fields, expected {len(ADULT_COLUMNS) + 1}"
                )
            label = fields[-1].rstrip(".")
            if label not in ("<=50K", ">50K"):
                raise ValueError(f"{path}:{line_no}: unknown income label {fields[-1]!r}")
            rows.append(fields[:-1])
            labels.append(int(label == ">50K"))
    return rows, np.asarray(labels, dtype=np.int32)


def _locate_adult(data_dir: str | None) -> Path:
    dirs = search_dirs("adult", data_dir)
    for d in dirs:
        if (d / "adult.data").is_file() and (d / "adult.test").is_file():
            return d
    looked = "\n".join(f"  - {d}{'' if d.is_dir() else ' (missing)'}" for d in dirs)
    err = DatasetNotFoundError(
        f"dataset 'adult' not found. Looked in:\n{looked}\n"
        "Expected files (both in one directory): adult.data, adult.test.\n"
        f"To get it: download them from the UCI Adult dataset ({ADULT_URL}) into a "
        f"directory and set ${ENV_VAR} to it (or pass data_dir)."
    )
    err.looked_in = tuple(dirs)
    raise err


@dataclasses.dataclass(frozen=True, eq=False)
class AdultEncoding:
    """How the 14 raw columns become ``D`` float features, fitted on the training rows only.

    A numeric column becomes one feature ``(v - mean) / std`` with the training mean and
    population std (std 0 -> 1). A categorical column becomes one indicator per training
    category (sorted, named ``"column=value"``); a value never seen in training encodes as all
    zeros. Columns keep file order.

    Attributes:
      stats: numeric column -> (mean, std) of the training rows.
      categories: categorical column -> its sorted training categories (``str [n_cat]``).
      names: the ``D`` feature names, in column order.
    """

    stats: dict[str, tuple[float, float]]
    categories: dict[str, np.ndarray]
    names: tuple[str, ...]

    @classmethod
    def fit(cls, train_rows: list[list[str]]) -> AdultEncoding:
        """The encoding of ``train_rows`` (14 string fields each)."""
        if not len(train_rows):
            raise ValueError("adult: the training file has no rows")
        cols = np.asarray(train_rows, dtype=str).reshape(-1, len(ADULT_COLUMNS)).T  # [14, N]
        stats: dict[str, tuple[float, float]] = {}
        categories: dict[str, np.ndarray] = {}
        names: list[str] = []
        for col, values in zip(ADULT_COLUMNS, cols, strict=True):
            if col in ADULT_NUMERIC:
                a = values.astype(np.float64)
                std = a.std()
                stats[col] = (a.mean(), std if std > 0 else 1.0)  # a constant column stays finite
                names.append(col)
            else:
                categories[col] = np.unique(values)  # sorted
                names += [f"{col}={c}" for c in categories[col].tolist()]
        return cls(stats, categories, tuple(names))

    @property
    def numeric_features(self) -> np.ndarray:
        """``int [6]``: the feature indices of the numeric columns."""
        return np.asarray([i for i, n in enumerate(self.names) if n in ADULT_NUMERIC], np.int64)

    def transform(self, rows: list[list[str]] | np.ndarray) -> np.ndarray:
        """Rows of 14 string fields ``[N, 14]`` -> ``float32 [N, D]``."""
        cols = np.asarray(rows, dtype=str).reshape(-1, len(ADULT_COLUMNS)).T  # [14, N]
        parts: list[np.ndarray] = []
        for col, values in zip(ADULT_COLUMNS, cols, strict=True):
            if col in ADULT_NUMERIC:
                mean, std = self.stats[col]
                parts.append(((values.astype(np.float64) - mean) / std)[:, None])
            else:
                # Comparing against every category leaves unseen values all zeros.
                cats = self.categories[col]
                parts.append((values[:, None] == cats[None, :]).astype(np.float64))
        return np.concatenate(parts, axis=1).astype(np.float32)


def _encode_adult(
    train_rows: list[list[str]], test_rows: list[list[str]]
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Rows -> ``(x_train float32 [N, D], x_test float32 [M, D], feature_names [D])`` with the
    :class:`AdultEncoding` of the training rows."""
    enc = AdultEncoding.fit(train_rows)
    return enc.transform(train_rows), enc.transform(test_rows), list(enc.names)


def read_adult_rows(
    data_dir: str | None = None,
) -> tuple[list[list[str]], np.ndarray, list[list[str]], np.ndarray]:
    """The raw files: ``(train_rows, y_train int32 [N], test_rows, y_test int32 [M])``, each row
    14 stripped string fields in :data:`ADULT_COLUMNS` order (``"?"`` kept as a value)."""
    root = _locate_adult(data_dir)
    train_rows, y_train = _read_adult(root / "adult.data")
    test_rows, y_test = _read_adult(root / "adult.test")
    return train_rows, y_train, test_rows, y_test


def load_adult(data_dir: str | None = None) -> ArrayDataset:
    """UCI Adult census income: 32561/16281 people, 2 classes (``>50K`` = 1).

    Reads ``adult.data`` and ``adult.test`` (comma-separated, 14 features + label). The 6
    numeric features are standardized and the 8 categorical ones one-hot encoded (see
    :func:`_encode_adult`; ``"?"`` is a category of its own): D = 108 on the official
    files. ``side["feature_names"]`` names the ``D`` columns.
    """
    train_rows, y_train, test_rows, y_test = read_adult_rows(data_dir)
    x_train, x_test, names = _encode_adult(train_rows, test_rows)
    arrays = [x_train, y_train, x_test, y_test]
    for a in arrays:
        a.setflags(write=False)  # shared through the in-process cache of load_dataset
    return ArrayDataset(
        "adult",
        *arrays,
        num_classes=2,
        mean=(0.0,),
        std=(1.0,),
        kind="features",
        side={"feature_names": names},
    )
