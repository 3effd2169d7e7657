"""Image classification data sources, loaded into plain numpy arrays.

Every dataset is returned as an :class:`ArrayDataset` with images ``uint8 [N, H, W, C]``
(grayscale images get ``C = 1``) and labels ``int32 [N]``. No jax here: the data layer
stays importable and testable without an accelerator.

Datasets are looked up on disk, never downloaded implicitly (see :func:`search_dirs`);
``python -m fedjax_semi.data.sources ensure fashion_mnist`` installs or fetches one.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import inspect
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "DATASETS",
    "ArrayDataset",
    "DatasetNotFoundError",
    "clear_cache",
    "dataset_names",
    "ensure",
    "fetch_fashion_mnist",
    "load_dataset",
    "read_idx",
    "search_dirs",
    "write_idx",
]

ENV_VAR = "FEDJAX_SEMI_DATA"
FASHION_MNIST_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
MNIST_URL = "https://yann.lecun.com/exdb/mnist/"
DEBIAN_FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
DEBIAN_FASHION_MNIST_PACKAGE = "dataset-fashion-mnist"

# Split -> (images file, labels file); identical names for MNIST and Fashion-MNIST.
IDX_FILES: dict[str, tuple[str, str]] = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


@dataclasses.dataclass(frozen=True, eq=False)
class ArrayDataset:
    """An in-memory image classification dataset with an official train/test split.

    ``eq=False`` because field-wise ``==`` on arrays is ambiguous; identity equality and
    hashing also make the object usable as a cache key. Arrays are read-only since loaded
    datasets are cached and shared between callers.

    Attributes:
      name: registry name, e.g. ``"fashion_mnist"``.
      x_train: ``uint8 [N, H, W, C]`` training images.
      y_train: ``int32 [N]`` training labels in ``[0, num_classes)``.
      x_test: ``uint8 [M, H, W, C]`` test images.
      y_test: ``int32 [M]`` test labels.
      num_classes: number of classes.
      mean: per-channel mean of ``x_train / 255`` (length ``C``).
      std: per-channel standard deviation of ``x_train / 255`` (length ``C``).
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    # Input kind for the model: "image" (uint8 [N,H,W,C]), "tokens" (int32 [N,L]) or
    # "features" (float32 [N,D]).
    kind: str = "image"
    vocab_size: int | None = None  # tokens: size of the vocabulary (ids < vocab_size)
    # Extra per-sample or per-dataset arrays, e.g. "y_train_coarse" (CIFAR-100 superclasses),
    # "writer_train" (FEMNIST writer id per sample), "x_unlabeled" (STL-10).
    extra: dict = dataclasses.field(default_factory=dict)


class DatasetNotFoundError(FileNotFoundError):
    """Raised when a dataset's files are not found in any searched directory."""


# ----------------------------------------------------------------------------- IDX format

# IDX type code -> big-endian numpy dtype (http://yann.lecun.com/exdb/mnist/, "IDX format").
_IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_IDX_CODES: dict[tuple[str, int], int] = {(d.kind, d.itemsize): c for c, d in _IDX_DTYPES.items()}


def _open(path: Path, mode: str):
    # gzip is chosen by suffix, matching how the official files are distributed.
    return gzip.open(path, mode) if path.suffix == ".gz" else open(path, mode)  # noqa: SIM115


def read_idx(path: str | Path) -> np.ndarray:
    """Reads an IDX file (plain or ``.gz``).

    Returns:
      An array with the shape stored in the header and the native-endian version of its
      dtype (``uint8``, ``int8``, ``int16``, ``int32``, ``float32`` or ``float64``).

    Raises:
      ValueError: if the header is malformed or the payload size does not match it.
    """
    path = Path(path)
    with _open(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ValueError(f"{path}: not an IDX file (bad magic number {data[:4]!r})")
    code, ndim = data[2], data[3]
    if code not in _IDX_DTYPES:
        raise ValueError(f"{path}: unknown IDX data type 0x{code:02X}")
    header_len = 4 + 4 * ndim
    if len(data) < header_len:
        raise ValueError(f"{path}: truncated IDX header")
    shape = tuple(int(d) for d in np.frombuffer(data, ">u4", count=ndim, offset=4))
    dtype = _IDX_DTYPES[code]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) - header_len != expected:
        raise ValueError(
            f"{path}: IDX payload has {len(data) - header_len} bytes, header {shape} of "
            f"{dtype.name} needs {expected}"
        )
    arr = np.frombuffer(data, dtype, offset=header_len).reshape(shape)
    # Copy into native byte order so downstream code never sees '>' dtypes.
    return arr.astype(dtype.newbyteorder("="))


def write_idx(path: str | Path, array: np.ndarray) -> None:
    """Writes ``array`` as an IDX file, gzip-compressed if ``path`` ends with ``.gz``.

    Supports the IDX dtypes ``uint8, int8, int16, int32, float32, float64`` (bool is
    written as uint8). Mainly used to build test fixtures in the real format.
    """
    arr = np.asarray(array)
    if arr.dtype == np.bool_:
        arr = arr.astype(np.uint8)
    code = _IDX_CODES.get((arr.dtype.kind, arr.dtype.itemsize))
    if code is None or arr.ndim > 255:
        raise ValueError(f"dtype {arr.dtype} / ndim {arr.ndim} cannot be stored as IDX")
    header = bytes([0, 0, code, arr.ndim]) + np.asarray(arr.shape, ">u4").tobytes()
    payload = np.ascontiguousarray(arr, dtype=_IDX_DTYPES[code]).tobytes()
    path = Path(path)
    with _open(path, "wb") as f:
        f.write(header + payload)


# ----------------------------------------------------------------------------- lookup


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fedjax_semi"


def search_dirs(name: str, data_dir: str | None = None) -> list[Path]:
    """Directories searched for dataset ``name``, in priority order.

    With a non-empty ``data_dir``: only ``data_dir/<name>`` and ``data_dir``. Otherwise
    ``$FEDJAX_SEMI_DATA/<name>``, ``$FEDJAX_SEMI_DATA``, ``${XDG_CACHE_HOME:-~/.cache}/
    fedjax_semi/<name>`` and, for ``fashion_mnist``, Debian's ``/usr/share/datasets/
    fashion-mnist`` (package ``dataset-fashion-mnist``).

    Raises:
      DatasetNotFoundError: if an explicitly given ``data_dir`` does not exist (a typo there
        should not silently fall back to other locations).
    """
    if data_dir:  # "" (an unset config value) means "not given"
        root = Path(data_dir).expanduser()
        if not root.is_dir():
            raise DatasetNotFoundError(
                f"dataset.data_dir={str(root)!r} does not exist or is not a directory "
                f"(dataset {name!r}).\n{_expected_files(name)}{_how_to_get(name)}"
            )
        return [root / name, root]
    dirs: list[Path] = []
    env = os.environ.get(ENV_VAR)
    if env:
        dirs += [Path(env).expanduser() / name, Path(env).expanduser()]
    dirs.append(_cache_root() / name)
    if name == "fashion_mnist":
        dirs.append(DEBIAN_FASHION_MNIST_DIR)
    return dirs


def _expected_files(name: str) -> str:
    if name not in ("fashion_mnist", "mnist"):
        return ""
    bases = [b for pair in IDX_FILES.values() for b in pair]
    return f"Expected files (plain or .gz): {', '.join(bases)}.\n"


def _how_to_get(name: str) -> str:
    if name == "fashion_mnist":
        return (
            "To get it: `apt-get install dataset-fashion-mnist` (Debian/Ubuntu), or "
            "`python -m fedjax_semi.data.sources ensure fashion_mnist`, or download the four "
            f".gz files from {FASHION_MNIST_URL} into a directory and set ${ENV_VAR} to it "
            "(or pass data_dir)."
        )
    return (
        f"To get it: download the four .gz files from {MNIST_URL} into a directory and set "
        f"${ENV_VAR} to it (or pass data_dir)."
    )


def _find_file(directory: Path, base: str) -> Path | None:
    for candidate in (directory / base, directory / f"{base}.gz"):
        if candidate.is_file():
            return candidate
    return None


def _locate_idx(name: str, data_dir: str | None) -> dict[str, Path]:
    """Returns file base name -> path, all four from the first directory holding them."""
    dirs = search_dirs(name, data_dir)
    bases = [b for pair in IDX_FILES.values() for b in pair]
    for d in dirs:
        found = {b: _find_file(d, b) for b in bases}
        if all(found.values()):
            return found  # type: ignore[return-value]
    looked = "\n".join(f"  - {d}{'' if d.is_dir() else ' (missing)'}" for d in dirs)
    raise DatasetNotFoundError(
        f"dataset {name!r} not found. Looked in:\n{looked}\n"
        f"Expected files (plain or .gz, all in one directory): {', '.join(bases)}.\n"
        f"{_how_to_get(name)}"
    )


# ----------------------------------------------------------------------------- loaders


def _channel_stats(x: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Exact per-channel mean/std of ``x / 255`` for uint8 ``x [N, H, W, C]``.

    Uses a 256-bin histogram per channel: exact and avoids a float copy of the images.
    """
    values = np.arange(256, dtype=np.float64) / 255.0
    means, stds = [], []
    for c in range(x.shape[-1]):
        hist = np.bincount(x[..., c].ravel(), minlength=256).astype(np.float64)
        total = hist.sum()
        mean = float(hist @ values / total) if total else 0.0
        var = float(hist @ (values - mean) ** 2 / total) if total else 0.0
        means.append(mean)
        stds.append(var**0.5)
    return tuple(means), tuple(stds)


def _make(
    name: str,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    num_classes: int,
) -> ArrayDataset:
    for split, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
        if x.ndim != 4 or x.dtype != np.uint8:
            raise ValueError(f"{name}/{split}: images must be uint8 [N,H,W,C], got {x.shape}")
        if len(x) != len(y):
            raise ValueError(f"{name}/{split}: {len(x)} images but {len(y)} labels")
        if len(y) and (y.min() < 0 or y.max() >= num_classes):
            raise ValueError(f"{name}/{split}: labels outside [0, {num_classes})")
    mean, std = _channel_stats(x_train)
    arrays = [np.ascontiguousarray(a) for a in (x_train, y_train, x_test, y_test)]
    for a in arrays:
        a.setflags(write=False)  # shared through the in-process cache
    return ArrayDataset(name, *arrays, num_classes=num_classes, mean=mean, std=std)


def _load_idx_dataset(name: str, data_dir: str | None) -> ArrayDataset:
    files = _locate_idx(name, data_dir)
    parts: dict[str, np.ndarray] = {}
    for split, (img, lab) in IDX_FILES.items():
        x = read_idx(files[img])
        if x.ndim == 3:  # IDX stores grayscale as [N, H, W]
            x = x[..., None]
        parts[f"x_{split}"] = x.astype(np.uint8, copy=False)
        parts[f"y_{split}"] = read_idx(files[lab]).astype(np.int32).reshape(-1)
    return _make(name, num_classes=10, **parts)


def load_fashion_mnist(data_dir: str | None = None) -> ArrayDataset:
    """Fashion-MNIST: 60000/10000 images ``uint8 [N, 28, 28, 1]``, 10 classes."""
    return _load_idx_dataset("fashion_mnist", data_dir)


def load_mnist(data_dir: str | None = None) -> ArrayDataset:
    """MNIST: 60000/10000 images ``uint8 [N, 28, 28, 1]``, 10 classes."""
    return _load_idx_dataset("mnist", data_dir)


def load_digits(data_dir: str | None = None) -> ArrayDataset:
    """scikit-learn's bundled 8x8 digits (1797 images), a tiny real dataset for tests.

    Pixel values 0..16 are scaled to uint8 with ``round(v * 255 / 16)``; shape
    ``[N, 8, 8, 1]``. The split is a stratified 80/20 split with a fixed seed, so it never
    changes. ``data_dir`` is accepted for a uniform signature and ignored (bundled data).
    """
    del data_dir
    from sklearn.datasets import load_digits as sk_load_digits  # heavy import, only here

    bunch = sk_load_digits()
    x = np.round(bunch.images.astype(np.float64) * 255.0 / 16.0).astype(np.uint8)[..., None]
    y = bunch.target.astype(np.int32)
    rng = np.random.default_rng(0)
    test_mask = np.zeros(len(y), dtype=bool)
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        test_mask[idx[: int(round(0.2 * len(idx)))]] = True
    return _make("digits", x[~test_mask], y[~test_mask], x[test_mask], y[test_mask], 10)


DATASETS: dict[str, Callable[[str | None], ArrayDataset]] = {
    "fashion_mnist": load_fashion_mnist,
    "mnist": load_mnist,
    "digits": load_digits,
}


def dataset_names() -> list[str]:
    """Names accepted by :func:`load_dataset` (sorted)."""
    return sorted(DATASETS)


@functools.lru_cache(maxsize=8)
def _load_cached(
    name: str, data_dir: str | None, options: tuple, _env: tuple[str | None, ...]
) -> ArrayDataset:
    # _env is only part of the cache key: lookup depends on these environment variables.
    return DATASETS[name](data_dir, **dict(options))


def load_dataset(name: str, data_dir: str | None = None, **options: Any) -> ArrayDataset:
    """Loads dataset ``name`` (cached in-process per ``(name, data_dir, options)`` and
    environment). ``options`` (e.g. ``vocab_size``, ``seq_len`` of text datasets) reach the
    loaders that take them; the others ignore them.

    Raises:
      ValueError: unknown ``name`` (config key ``dataset.name``).
      DatasetNotFoundError: the files were not found; the message says where it looked
        and how to get them.
    """
    if name not in DATASETS:
        raise ValueError(
            f"dataset.name={name!r} is not a known dataset; allowed: {dataset_names()}"
        )
    accepted = inspect.signature(DATASETS[name]).parameters
    opts = tuple(sorted((k, v) for k, v in options.items() if k in accepted))
    env = (os.environ.get(ENV_VAR), os.environ.get("XDG_CACHE_HOME"), os.environ.get("HOME"))
    return _load_cached(name, str(data_dir) if data_dir else None, opts, env)


def clear_cache() -> None:
    """Drops in-process cached datasets."""
    _load_cached.cache_clear()


# ----------------------------------------------------------------------------- fetching


def fetch_fashion_mnist(dest: Path | None = None) -> Path:
    """Downloads the four official Fashion-MNIST ``.gz`` files into ``dest``.

    ``dest`` defaults to ``${XDG_CACHE_HOME:-~/.cache}/fedjax_semi/fashion_mnist``, which
    :func:`search_dirs` searches. Each file is written atomically and validated as IDX.

    Returns:
      The directory holding the files.

    Raises:
      ConnectionError: if the files cannot be downloaded (e.g. no network).
    """
    dest = Path(dest) if dest is not None else _cache_root() / "fashion_mnist"
    dest.mkdir(parents=True, exist_ok=True)
    for base in (b for pair in IDX_FILES.values() for b in pair):
        target = dest / f"{base}.gz"
        if target.is_file():
            continue
        url = f"{FASHION_MNIST_URL}{base}.gz"
        fd, tmp = tempfile.mkstemp(dir=dest, suffix=".part.gz")
        try:
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=30) as resp:
                shutil.copyfileobj(resp, out)
            read_idx(tmp)  # reject truncated or HTML error pages before publishing
            os.replace(tmp, target)
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise ConnectionError(
                f"could not download {url} into {dest}: {e}. If this machine is offline, "
                f"copy the files there by hand or use `apt-get install "
                f"{DEBIAN_FASHION_MNIST_PACKAGE}`."
            ) from e
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    return dest


def _where(name: str) -> str:
    if name == "digits":
        return "bundled with scikit-learn"
    files = _locate_idx(name, None)
    return str(next(iter(files.values())).parent)


def ensure(name: str) -> int:
    """Makes dataset ``name`` available locally; returns a process exit code.

    Order: already present -> done; ``apt-get install dataset-fashion-mnist`` when running
    as root with apt; download with :func:`fetch_fashion_mnist`. Prints where the data is,
    or one message on stderr saying where it looked and how to get it.
    """
    if name not in DATASETS:
        print(f"dataset.name={name!r} is not known; allowed: {dataset_names()}", file=sys.stderr)
        return 2
    try:
        print(f"{name}: found ({_where(name)})")
        return 0
    except DatasetNotFoundError as e:
        first_error = str(e)
    if name == "fashion_mnist":
        is_root = hasattr(os, "geteuid") and os.geteuid() == 0
        if shutil.which("apt-get") and is_root:
            try:
                subprocess.run(["apt-get", "update"], check=False)
                subprocess.run(
                    ["apt-get", "install", "-y", DEBIAN_FASHION_MNIST_PACKAGE], check=True
                )
                print(f"{name}: installed with apt ({_where(name)})")
                return 0
            except (subprocess.CalledProcessError, OSError, DatasetNotFoundError) as e:
                print(f"{name}: apt-get install failed ({e}); trying a download", file=sys.stderr)
        try:
            print(f"{name}: downloaded to {fetch_fashion_mnist()}")
            return 0
        except ConnectionError as e:
            print(f"{name}: download failed ({e})", file=sys.stderr)
    print(first_error, file=sys.stderr)
    return 1


def _main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "ensure":
        print(
            f"usage: python -m fedjax_semi.data.sources ensure NAME  (NAME in {dataset_names()})",
            file=sys.stderr,
        )
        return 2
    return ensure(argv[1])


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
