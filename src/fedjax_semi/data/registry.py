"""The dataset registry: name -> loader, ``load_dataset`` with its in-process cache, and
``locate`` (where a dataset is, without loading it).

The registry imports the loaders (:mod:`.image_loaders`, :mod:`.text`, :mod:`.tabular`,
:mod:`.npz`), never the other way round; they share :mod:`.dataset` and :mod:`.lookup`, whose
public names are re-exported here so callers outside the data layer need only this module.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from fedjax_semi.data import image_loaders, tabular, text
from fedjax_semi.data.dataset import ArrayDataset, DatasetNotFoundError
from fedjax_semi.data.image_loaders import TFDS_PREFIX, load_tfds
from fedjax_semi.data.lookup import (
    ENV_VAR,
    FILE_SPECS,
    FileSpec,
    locate_files,
    locate_idx,
    search_dirs,
)
from fedjax_semi.data.npz import NPZ_PREFIX, check_npz, load_npz, npz_path
from fedjax_semi.errors import bad

__all__ = [
    "DATASETS",
    "ENV_VAR",
    "FILE_SPECS",
    "LOCATORS",
    "NPZ_PREFIX",
    "TFDS_PREFIX",
    "ArrayDataset",
    "DatasetNotFoundError",
    "FileSpec",
    "clear_cache",
    "dataset_names",
    "is_known_dataset",
    "load_dataset",
    "locate",
    "search_dirs",
    "subsample",
]


def subsample(ds: ArrayDataset, fraction: float, seed: int) -> ArrayDataset:
    """The same dataset with a random `fraction` of each class kept in train and in test
    (at least one example per present class); normalization statistics are unchanged."""
    if fraction >= 1:
        return ds
    rng = np.random.default_rng([seed, 7919])

    def keep(y: np.ndarray) -> np.ndarray:
        picks = []
        for c in np.unique(y):
            members = np.flatnonzero(y == c)
            n = max(1, round(fraction * len(members)))
            picks.append(rng.choice(members, n, replace=False))
        return np.sort(np.concatenate(picks))

    tr, te = keep(ds.y_train), keep(ds.y_test)
    side = dict(ds.side)
    for key, rows in (("writer_train", tr), ("writer_test", te)):  # natural clients' ids
        if key in side:
            side[key] = side[key][rows]
    return dataclasses.replace(
        ds, x_train=ds.x_train[tr], y_train=ds.y_train[tr], x_test=ds.x_test[te],
        y_test=ds.y_test[te], side=side,
    )  # fmt: skip


DATASETS: dict[str, Callable[..., ArrayDataset]] = {
    "dbpedia": text.load_dbpedia,
    "ag_news": text.load_ag_news,
    "imdb": text.load_imdb,
    "adult": tabular.load_adult,
    "fashion_mnist": image_loaders.load_fashion_mnist,
    "mnist": image_loaders.load_mnist,
    "digits": image_loaders.load_digits,
    "cifar10": image_loaders.load_cifar10,
    "cifar100": image_loaders.load_cifar100,
    "svhn": image_loaders.load_svhn,
    "stl10": image_loaders.load_stl10,
    "femnist": image_loaders.load_femnist,
    "kannada": image_loaders.load_kannada_crops,  # Chars74K crops, CoFED's FEMNIST public set
}


def dataset_names() -> list[str]:
    """Names accepted by :func:`load_dataset` (sorted); ``tfds:NAME`` and ``npz:PATH`` are
    accepted too, see :func:`is_known_dataset`."""
    return sorted(DATASETS)


def is_known_dataset(name: str) -> bool:
    """Whether :func:`load_dataset` accepts ``name``: a registered name, ``tfds:NAME`` or
    ``npz:PATH``. An ``npz:`` name is checked here (:func:`~.npz.check_npz`: headers, labels
    and client ids only), so config validation refuses a bad file before any work.

    Raises:
      ConfigError: ``npz:PATH`` whose file is missing or not in the format, or a ``.npz``
        path without the prefix, in one line.
    """
    if name.startswith(NPZ_PREFIX):
        check_npz(name)
        return True
    if name.endswith(".npz") and name not in DATASETS:
        raise bad("dataset.name", name, f"{NPZ_PREFIX}{name} (your own .npz file, with the prefix)")
    return name in DATASETS or (name.startswith(TFDS_PREFIX) and len(name) > len(TFDS_PREFIX))


def _loader(name: str) -> Callable[..., ArrayDataset]:
    if name.startswith(TFDS_PREFIX):
        return functools.partial(load_tfds, name[len(TFDS_PREFIX) :])
    if name.startswith(NPZ_PREFIX):
        return functools.partial(load_npz, name)
    return DATASETS[name]


def _file_stamp(name: str) -> tuple[int, int] | None:
    """(mtime ns, size) of an ``npz:`` file, so a rewritten file is loaded again."""
    if not name.startswith(NPZ_PREFIX) or not npz_path(name).is_file():
        return None
    st = npz_path(name).stat()
    return st.st_mtime_ns, st.st_size


@functools.lru_cache(maxsize=8)
def _load_cached(name: str, data_dir: str | None, options: tuple, _env: tuple) -> ArrayDataset:
    # _env is only part of the cache key: lookup depends on these environment variables (and
    # an npz: file's stamp).
    return _loader(name)(data_dir, **dict(options))


def load_dataset(name: str, data_dir: str | None = None, **options: Any) -> ArrayDataset:
    """Loads dataset ``name`` (cached in-process per ``(name, data_dir, options)`` and
    environment). ``options`` (e.g. ``vocab_size``, ``seq_len`` of text datasets) reach the
    loaders that take them; the others ignore them.

    ``name`` is a registered name (:func:`dataset_names`), ``tfds:NAME`` for a dataset
    prepared by tensorflow-datasets (see :func:`load_tfds`) or ``npz:PATH`` for a user's
    ``.npz`` file (see :mod:`.npz`).

    Raises:
      ValueError: unknown ``name`` (config key ``dataset.name``); a ConfigError for an
        ``npz:`` file not in the format.
      DatasetNotFoundError: the files were not found; the message says where it looked
        and how to get them.
    """
    if not is_known_dataset(name):
        raise ValueError(
            f"dataset.name={name!r} is not a known dataset; allowed: {dataset_names()} "
            f"or {TFDS_PREFIX}NAME (a dataset prepared by tensorflow-datasets) or "
            f"{NPZ_PREFIX}PATH (your own .npz file)"
        )
    accepted = inspect.signature(_loader(name)).parameters
    opts = tuple(sorted((k, v) for k, v in options.items() if k in accepted))
    env = (
        *(os.environ.get(v) for v in (ENV_VAR, "XDG_CACHE_HOME", "HOME", "TFDS_DATA_DIR")),
        _file_stamp(name),
    )
    return _load_cached(name, str(data_dir) if data_dir else None, opts, env)


def clear_cache() -> None:
    """Drops in-process cached datasets."""
    _load_cached.cache_clear()


# Name -> f(data_dir) returning where the data is, without loading it; raises
# DatasetNotFoundError. Datasets without one are checked by loading them.
LOCATORS: dict[str, Callable[[str | None], str]] = {
    "digits": lambda data_dir: "bundled with scikit-learn",
    "mnist": lambda data_dir: str(next(iter(locate_idx("mnist", data_dir).values())).parent),
    "fashion_mnist": lambda data_dir: str(
        next(iter(locate_idx("fashion_mnist", data_dir).values())).parent
    ),
    **{name: functools.partial(lambda n, d: str(locate_files(n, d)), name) for name in FILE_SPECS},
}


def locate(name: str, data_dir: str | None = None) -> str:
    """Where dataset ``name`` is (a directory, or a note such as "bundled with ..."),
    checking its files without loading them when a locator is registered.

    Raises:
      ValueError: unknown ``name``.
      DatasetNotFoundError: not found; the message says where it looked.
    """
    if not is_known_dataset(name):
        raise ValueError(f"dataset.name={name!r} is not known; allowed: {dataset_names()}")
    if name.startswith(NPZ_PREFIX):
        return str(npz_path(name))  # checked by is_known_dataset
    if name in LOCATORS:
        return LOCATORS[name](data_dir)
    load_dataset(name, data_dir)
    return "loaded"
