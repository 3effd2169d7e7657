"""Readers for the official on-disk formats of image datasets, into plain numpy arrays.

Pure format readers: each takes file paths and returns arrays, with no lookup, caching or
registry logic (that lives in :mod:`.lookup`, :mod:`.image_loaders` and :mod:`.registry`).
Images are returned as ``uint8 [N, H, W, C]`` and labels as ``int32 [N]``.

Formats:
  * CIFAR-10/100 "python version": pickled dicts with bytes keys, ``b"data"`` ``uint8
    [N, 3072]`` (each row is the 1024 red, then green, then blue values of a 32x32 image,
    row-major), ``b"labels"`` (CIFAR-10) or ``b"fine_labels"``/``b"coarse_labels"``.
  * SVHN cropped digits: MATLAB ``.mat`` with ``X uint8 [32, 32, 3, N]`` and
    ``y [N, 1]`` where digit 0 is stored as label 10.
  * STL-10 binary: raw ``uint8`` files, images ``[N, 3, 96, 96]`` in column-major
    (Fortran) order per channel, labels ``1..10``.
  * LEAF (FEMNIST): JSON files ``{"users", "num_samples", "user_data": {user: {"x", "y"}}}``
    with ``x`` a list of flattened 28x28 images of floats in ``[0, 1]``.
  * PNG (Chars74K's hand-drawn bitmaps): any PNG mode, read with Pillow as 8-bit grayscale,
    transparent pixels composited on white.
  * TFDS: datasets already prepared by tensorflow-datasets in ``array_record`` format,
    read with ``tfds.data_source`` (no TensorFlow needed, never downloads).
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "read_cifar_batch",
    "read_leaf_dir",
    "read_png_gray",
    "read_stl10_images",
    "read_stl10_labels",
    "read_svhn_mat",
    "read_tfds",
]

STL10_SIZE = 96


def read_cifar_batch(path: str | Path) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Reads one CIFAR-10/100 python pickle batch (e.g. ``data_batch_1`` or ``train``).

    The files are pickles, so only read them from a trusted source (the official archive).

    Returns:
      ``(x, labels)``: ``x`` is ``uint8 [N, 32, 32, 3]``; ``labels`` maps each label key
      present (``"labels"``, ``"fine_labels"``, ``"coarse_labels"``) to ``int32 [N]``.

    Raises:
      ValueError: if the file is not a CIFAR batch (missing ``data`` or wrong size).
    """
    path = Path(path)
    with open(path, "rb") as f:
        # encoding="bytes": the official files were pickled by Python 2 (bytes keys).
        raw = pickle.load(f, encoding="bytes")  # official format: trusted files only
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: not a CIFAR batch (a pickled {type(raw).__name__})")
    # Accept str keys too, for batches re-pickled by Python 3 tools.
    batch = {k.decode() if isinstance(k, bytes) else k: v for k, v in raw.items()}
    if "data" not in batch:
        raise ValueError(f"{path}: not a CIFAR batch (no 'data' key; keys {sorted(batch)})")
    data = np.asarray(batch["data"], dtype=np.uint8)
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise ValueError(f"{path}: CIFAR 'data' must be [N, 3072], got {data.shape}")
    # Rows are CHW (all red, all green, all blue), each channel row-major.
    x = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    labels = {
        key: np.asarray(batch[key], dtype=np.int32).reshape(-1)
        for key in ("labels", "fine_labels", "coarse_labels")
        if key in batch
    }
    for key, y in labels.items():
        if len(y) != len(x):
            raise ValueError(f"{path}: {len(x)} images but {len(y)} {key}")
    return np.ascontiguousarray(x), labels


def read_svhn_mat(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Reads an SVHN cropped-digits file (``train_32x32.mat``, ``test_32x32.mat``, ...).

    Returns:
      ``(x, y)``: ``uint8 [N, 32, 32, 3]`` and ``int32 [N]`` digits ``0..9`` (the files
      store digit 0 as label 10).
    """
    from scipy.io import loadmat  # only needed for SVHN

    path = Path(path)
    mat = loadmat(path)
    if "X" not in mat or "y" not in mat:
        raise ValueError(f"{path}: not an SVHN .mat file (needs variables X and y)")
    x_raw = np.asarray(mat["X"])
    if x_raw.ndim != 4 or x_raw.shape[2] != 3:
        raise ValueError(f"{path}: SVHN X must be [32, 32, 3, N], got {x_raw.shape}")
    x = np.ascontiguousarray(x_raw.transpose(3, 0, 1, 2), dtype=np.uint8)  # -> [N, H, W, C]
    y = np.asarray(mat["y"]).reshape(-1).astype(np.int32)
    if len(y) != len(x):
        raise ValueError(f"{path}: {len(x)} images but {len(y)} labels")
    y[y == 10] = 0
    return x, y


def read_stl10_images(path: str | Path, mmap: bool = False) -> np.ndarray:
    """Reads an STL-10 binary image file (``train_X.bin``, ``test_X.bin``, ``unlabeled_X.bin``).

    Each image is stored as 3 channels of 96x96 values in column-major order, i.e. the
    file is ``[N, C, W, H]`` in C order.

    Args:
      path: the ``.bin`` file.
      mmap: memory-map the file instead of reading it (for the 2.7 GB unlabeled split);
        the result is then a read-only strided view, not a contiguous copy.

    Returns:
      ``uint8 [N, 96, 96, 3]``.
    """
    path = Path(path)
    per_image = 3 * STL10_SIZE * STL10_SIZE
    size = path.stat().st_size
    if size % per_image:
        raise ValueError(f"{path}: {size} bytes is not a multiple of {per_image} (3x96x96)")
    n = size // per_image
    raw = np.memmap(path, np.uint8, mode="r") if mmap else np.fromfile(path, np.uint8)
    x = raw.reshape(n, 3, STL10_SIZE, STL10_SIZE).transpose(0, 3, 2, 1)  # [N,C,W,H]->[N,H,W,C]
    return x if mmap else np.ascontiguousarray(x)


def read_stl10_labels(path: str | Path) -> np.ndarray:
    """Reads an STL-10 label file (``uint8`` values ``1..10``) as ``int32 [N]`` ``0..9``."""
    y = np.fromfile(path, np.uint8).astype(np.int32)
    if len(y) and (y.min() < 1 or y.max() > 10):
        raise ValueError(f"{path}: STL-10 labels must be in 1..10")
    return y - 1


def read_leaf_dir(
    directory: str | Path, shape: tuple[int, ...] = (28, 28, 1)
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Reads every ``*.json`` file of one LEAF split directory (e.g. ``femnist/data/train``).

    Files are read in sorted name order; users in each file's ``"users"`` order.

    Args:
      directory: the split directory.
      shape: per-image shape; each flattened ``x`` row must have ``prod(shape)`` values.

    Returns:
      ``(x, y, users)``: ``x`` ``uint8 [N, *shape]`` (``round(x * 255)`` of the stored
      ``[0, 1]`` floats), ``y`` ``int32 [N]``, and ``users`` the writer id of each sample
      (``list[str]`` of length ``N``).
    """
    directory = Path(directory)
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    users: list[str] = []
    dim = int(np.prod(shape))
    for path in sorted(directory.glob("*.json")):
        with open(path) as f:
            blob = json.load(f)
        for user in blob["users"]:
            data = blob["user_data"][user]
            x = np.asarray(data["x"], dtype=np.float32).reshape(-1, dim)
            y = np.asarray(data["y"], dtype=np.int32).reshape(-1)
            if len(x) != len(y):
                raise ValueError(f"{path}: user {user!r} has {len(x)} images, {len(y)} labels")
            xs.append(np.round(np.clip(x, 0.0, 1.0) * 255.0).astype(np.uint8))
            ys.append(y)
            users.extend([user] * len(y))
    if not xs:
        return np.zeros((0, *shape), np.uint8), np.zeros(0, np.int32), users
    return np.concatenate(xs).reshape(-1, *shape), np.concatenate(ys), users


def read_png_gray(path: str | Path) -> np.ndarray:
    """Reads one PNG (any mode Pillow reads) as grayscale ``uint8 [H, W]``.

    Transparent pixels (RGBA, LA, or a palette with a transparent entry) are composited on a
    white background first, so a glyph drawn on a transparent canvas reads as ink on white.

    Raises:
      ValueError: the file is not an image Pillow can decode (naming the path).
    """
    from PIL import Image, UnidentifiedImageError  # Pillow comes with matplotlib

    try:
        with Image.open(path) as im:
            im.load()
            if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
                rgba = im.convert("RGBA")
                im = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
            return np.asarray(im.convert("L"), dtype=np.uint8)
    except (UnidentifiedImageError, OSError) as e:
        raise ValueError(f"{path}: not a readable PNG image ({type(e).__name__})") from None


def read_tfds(
    name: str, data_dir: str | None = None, chunk: int = 1024
) -> tuple[dict[str, np.ndarray], int]:
    """Reads the ``train`` and ``test`` splits of a prepared TFDS dataset into memory.

    Uses ``tfds.data_source(name, data_dir=data_dir, download=False)``, which needs the
    dataset prepared in ``array_record`` format and no TensorFlow; it never downloads.

    Args:
      name: the TFDS name, e.g. ``"mnist"`` or ``"mnist:3.0.1"``.
      data_dir: TFDS data directory; ``None`` uses TFDS's default (``$TFDS_DATA_DIR`` or
        ``~/tensorflow_datasets``).
      chunk: records decoded per batched read.

    Returns:
      ``(arrays, num_classes)``: ``arrays`` has ``x_train``/``x_test`` ``uint8 [N, H, W, C]``
      (a channel axis is added to 2-D images) and ``y_train``/``y_test`` ``int32 [N]``;
      ``num_classes`` from the ``label`` ClassLabel feature.

    Raises:
      ImportError: tensorflow-datasets is not installed.
      Exception: whatever TFDS raises for a dataset it cannot find or read.
    """
    import tensorflow_datasets as tfds  # optional dependency, extra "tfds"

    sources = tfds.data_source(name, data_dir=data_dir, download=False)
    missing = [s for s in ("train", "test") if s not in sources]
    if missing:
        raise ValueError(f"TFDS dataset {name!r} has no split(s) {missing}: {sorted(sources)}")
    out: dict[str, np.ndarray] = {}
    num_classes = 0
    for split in ("train", "test"):
        src = sources[split]
        features: Any = src.dataset_info.features
        if "image" not in features or "label" not in features:
            raise ValueError(
                f"TFDS dataset {name!r} needs features 'image' and 'label', has {list(features)}"
            )
        num_classes = int(features["label"].num_classes)
        images: list[np.ndarray] = []
        labels: list[int] = []
        for start in range(0, len(src), chunk):
            keys = list(range(start, min(start + chunk, len(src))))
            # __getitems__ decodes a batch in one call; fall back to one record at a time.
            records = (
                src.__getitems__(keys) if hasattr(src, "__getitems__") else [src[k] for k in keys]
            )
            for rec in records:
                images.append(np.asarray(rec["image"]))
                labels.append(int(rec["label"]))
        shape = tuple(features["image"].shape)
        x = np.stack(images) if images else np.zeros((0, *shape), np.uint8)
        if x.ndim == 3:  # 2-D (grayscale) images: add the channel axis
            x = x[..., None]
        if x.dtype != np.uint8:
            raise ValueError(f"TFDS dataset {name!r}: images must be uint8, got {x.dtype}")
        out[f"x_{split}"] = x
        out[f"y_{split}"] = np.asarray(labels, dtype=np.int32)
    return out, num_classes
