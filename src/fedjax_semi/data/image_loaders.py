"""The image datasets' loaders: find the files, read them with :mod:`.images` or the IDX
codec, check them and return a read-only :class:`~fedjax_semi.data.dataset.ArrayDataset`.

Images are ``uint8 [N, H, W, C]`` (grayscale images get ``C = 1``) and labels ``int32 [N]``.
No jax here: the data layer stays importable and testable without an accelerator.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from fedjax_semi.data import images
from fedjax_semi.data.dataset import ArrayDataset, DatasetNotFoundError
from fedjax_semi.data.formats import read_idx
from fedjax_semi.data.lookup import IDX_FILES, locate_files, locate_idx
from fedjax_semi.errors import bad

__all__ = [
    "TFDS_PREFIX",
    "load_cifar10",
    "load_cifar100",
    "load_digits",
    "load_fashion_mnist",
    "load_femnist",
    "load_kannada_crops",
    "load_mnist",
    "load_stl10",
    "load_svhn",
    "load_tfds",
    "make_image_dataset",
]

# load_dataset("tfds:NAME") reads a dataset prepared by tensorflow-datasets.
TFDS_PREFIX = "tfds:"


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


def make_image_dataset(
    name: str,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    num_classes: int,
    side: dict[str, Any] | None = None,
) -> ArrayDataset:
    """The read-only image dataset of checked ``uint8 [N, H, W, C]`` images and ``int`` labels
    in ``[0, num_classes)``, with exact per-channel statistics of ``x_train / 255``."""
    for split, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
        if x.ndim != 4 or x.dtype != np.uint8:
            raise ValueError(f"{name}/{split}: images must be uint8 [N,H,W,C], got {x.shape}")
        if len(x) != len(y):
            raise ValueError(f"{name}/{split}: {len(x)} images but {len(y)} labels")
        if len(y) and (y.min() < 0 or y.max() >= num_classes):
            raise ValueError(f"{name}/{split}: labels outside [0, {num_classes})")
    mean, std = _channel_stats(x_train)
    arrays = [np.ascontiguousarray(a) for a in (x_train, y_train, x_test, y_test)]
    side = dict(side or {})
    for a in [*arrays, *(v for v in side.values() if isinstance(v, np.ndarray))]:
        if a.flags.writeable:
            a.setflags(write=False)  # shared through the in-process cache
    return ArrayDataset(name, *arrays, num_classes=num_classes, mean=mean, std=std, side=side)


def _load_idx_dataset(name: str, data_dir: str | None) -> ArrayDataset:
    files = locate_idx(name, data_dir)
    parts: dict[str, np.ndarray] = {}
    for split, (img, lab) in IDX_FILES.items():
        x = read_idx(files[img])
        if x.ndim == 3:  # IDX stores grayscale as [N, H, W]
            x = x[..., None]
        parts[f"x_{split}"] = x.astype(np.uint8, copy=False)
        parts[f"y_{split}"] = read_idx(files[lab]).astype(np.int32).reshape(-1)
    return make_image_dataset(name, num_classes=10, **parts)


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
    images, target = _sklearn_digits()
    x = np.round(images.astype(np.float64) * 255.0 / 16.0).astype(np.uint8)[..., None]
    y = target.astype(np.int32)
    rng = np.random.default_rng(0)
    test_mask = np.zeros(len(y), dtype=bool)
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        test_mask[idx[: int(round(0.2 * len(idx)))]] = True
    return make_image_dataset(
        "digits", x[~test_mask], y[~test_mask], x[test_mask], y[test_mask], 10
    )


def _sklearn_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits file read as its `load_digits` reads it (images [1797, 8, 8], target
    [1797]), without importing scikit-learn: the import alone costs about 2 s, in every process
    of the tests that load digits."""
    import gzip
    import importlib.util

    spec = importlib.util.find_spec("sklearn")  # finds the package without running it
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
    if not path.exists():  # another layout of scikit-learn: its own loader
        from sklearn.datasets import load_digits as sk_load_digits

        bunch = sk_load_digits()
        return bunch.images, bunch.target
    with gzip.open(path, "rt") as f:
        data = np.loadtxt(f, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)


def load_cifar10(data_dir: str | None = None) -> ArrayDataset:
    """CIFAR-10 from the official python batches: 50000/10000 ``uint8 [N, 32, 32, 3]``,
    10 classes (files ``data_batch_1..5``, ``test_batch``)."""
    d = locate_files("cifar10", data_dir)
    xs, ys = [], []
    for i in range(1, 6):
        x, labels = images.read_cifar_batch(d / f"data_batch_{i}")
        xs.append(x)
        ys.append(labels["labels"])
    x_test, labels = images.read_cifar_batch(d / "test_batch")
    return make_image_dataset(
        "cifar10", np.concatenate(xs), np.concatenate(ys), x_test, labels["labels"], 10
    )


def load_cifar100(data_dir: str | None = None) -> ArrayDataset:
    """CIFAR-100 from the official python files ``train``/``test``: 50000/10000 images
    ``uint8 [N, 32, 32, 3]``; ``y`` = the 100 fine labels.

    ``side["y_train_coarse"]``, ``side["y_test_coarse"]``: ``int32 [N]`` superclass
    (0..19) of each sample, e.g. to build CoFED-style tasks.
    """
    d = locate_files("cifar100", data_dir)
    x_train, train = images.read_cifar_batch(d / "train")
    x_test, test = images.read_cifar_batch(d / "test")
    for split, labels in (("train", train), ("test", test)):
        if "fine_labels" not in labels or "coarse_labels" not in labels:
            raise ValueError(f"{d / split}: CIFAR-100 needs fine_labels and coarse_labels")
    side = {"y_train_coarse": train["coarse_labels"], "y_test_coarse": test["coarse_labels"]}
    return make_image_dataset(
        "cifar100", x_train, train["fine_labels"], x_test, test["fine_labels"], 100, side
    )


def load_svhn(data_dir: str | None = None, include_extra: bool = True) -> ArrayDataset:
    """SVHN cropped digits (format 2): 73257/26032 images ``uint8 [N, 32, 32, 3]``,
    10 classes, label 10 of the files mapped to digit 0.

    When ``extra_32x32.mat`` sits beside the other files and ``include_extra``, its 531131
    samples go to ``side["x_extra"]`` / ``side["y_extra"]`` (not in the train split).
    """
    d = locate_files("svhn", data_dir)
    x_train, y_train = images.read_svhn_mat(d / "train_32x32.mat")
    x_test, y_test = images.read_svhn_mat(d / "test_32x32.mat")
    side: dict[str, np.ndarray] = {}
    if include_extra and (d / "extra_32x32.mat").is_file():
        side["x_extra"], side["y_extra"] = images.read_svhn_mat(d / "extra_32x32.mat")
    return make_image_dataset("svhn", x_train, y_train, x_test, y_test, 10, side)


def load_stl10(data_dir: str | None = None, unlabeled: bool = True) -> ArrayDataset:
    """STL-10 (binary version): 5000/8000 images ``uint8 [N, 96, 96, 3]``, 10 classes
    (labels 1..10 of the files mapped to 0..9).

    When ``unlabeled_X.bin`` is present and ``unlabeled``, ``side["x_unlabeled"]`` holds the
    100000 unlabeled images ``uint8 [U, 96, 96, 3]`` as a read-only memory map (2.7 GB).
    """
    d = locate_files("stl10", data_dir)
    x_train = images.read_stl10_images(d / "train_X.bin")
    y_train = images.read_stl10_labels(d / "train_y.bin")
    x_test = images.read_stl10_images(d / "test_X.bin")
    y_test = images.read_stl10_labels(d / "test_y.bin")
    side: dict[str, np.ndarray] = {}
    if unlabeled and (d / "unlabeled_X.bin").is_file():
        side["x_unlabeled"] = images.read_stl10_images(d / "unlabeled_X.bin", mmap=True)
    return make_image_dataset("stl10", x_train, y_train, x_test, y_test, 10, side)


def load_femnist(data_dir: str | None = None) -> ArrayDataset:
    """FEMNIST in LEAF's json format (``train/*.json``, ``test/*.json``): images
    ``uint8 [N, 28, 28, 1]`` (``round(x * 255)``; LEAF draws ink dark on a white 1.0
    background), 62 classes (10 digits, 26 upper, 26 lower case letters).

    Writers are the natural clients: ``side["writers"]`` is the ``str [W]`` array of LEAF
    user ids (train users first, in file order), and ``side["writer_train"]``,
    ``side["writer_test"]`` the ``int32 [N]`` index into it of each sample's writer.
    """
    d = locate_files("femnist", data_dir)
    x_train, y_train, users_train = images.read_leaf_dir(d / "train")
    x_test, y_test, users_test = images.read_leaf_dir(d / "test")
    index: dict[str, int] = {}
    for user in [*users_train, *users_test]:
        index.setdefault(user, len(index))
    side = {
        "writers": np.array(list(index), dtype=str),
        "writer_train": np.array([index[u] for u in users_train], dtype=np.int32),
        "writer_test": np.array([index[u] for u in users_test], dtype=np.int32),
    }
    return make_image_dataset("femnist", x_train, y_train, x_test, y_test, 62, side)


# CoFED's FEMNIST public set (its Sec. 5.3): random crops of Chars74K's handwritten Kannada.
KANNADA_CROPS = 50_000  # "about 50,000" public items
CROP_SIDE = 28  # FEMNIST's image side
CROP_MIN_SHARE = 0.5  # crop side: U{ceil(0.5 s) .. s} pixels, s = the shorter image side
_SAMPLE_DIR = re.compile(r"Sample(\d+)")


def _square_crops(img: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` random square crops of grayscale ``img uint8 [H, W]``, each resized to
    ``uint8 [count, CROP_SIDE, CROP_SIDE]`` by area averaging (Pillow's box filter).

    A crop's side is uniform over the integers ``ceil(0.5 s) .. s`` (``s = min(H, W)``), its
    top-left corner uniform over the positions that keep it inside the image."""
    from PIL import Image  # Pillow comes with matplotlib

    h, w = img.shape
    s = min(h, w)
    sides = rng.integers(max(1, math.ceil(CROP_MIN_SHARE * s)), s + 1, size=count)
    tops = (rng.random(count) * (h - sides + 1)).astype(np.int64)
    lefts = (rng.random(count) * (w - sides + 1)).astype(np.int64)
    pil = Image.fromarray(img)
    out = np.empty((count, CROP_SIDE, CROP_SIDE), np.uint8)
    for j, (c, t, left) in enumerate(zip(sides, tops, lefts, strict=True)):
        box = (int(left), int(t), int(left + c), int(t + c))
        out[j] = np.asarray(
            pil.resize((CROP_SIDE, CROP_SIDE), Image.Resampling.BOX, box=box), np.uint8
        )
    return out


def load_kannada_crops(
    data_dir: str | None = None, crops: int = KANNADA_CROPS, seed: int = 0
) -> ArrayDataset:
    """Random square crops of Chars74K's handwritten Kannada bitmaps: CoFED's public set for
    FEMNIST (its Sec. 5.3), ``x_train uint8 [crops, 28, 28, 1]``; the test split is empty.

    Reads the PNGs of ``KannadaHnd.tgz`` as unpacked: ``Kannada/Hnd/Img/SampleNNN/*.png``
    (``imgNNN-MMM.png``, class ``NNN``; ``data_dir`` may be the unpack root or any folder down
    to ``Img/``; the stroke files in ``Trg/`` are not read). Each image becomes grayscale and,
    when its median pixel is below 128 (a dark background), is inverted: every crop shows a
    dark glyph on a light background, as :func:`load_femnist`'s images (LEAF's ink on white).
    ``crops`` are spread over the images as evenly as possible (the ``crops % images`` extra
    ones on random images), each a square of ``50-100%`` of the image's shorter side at a random
    position, area-averaged down to 28x28. Deterministic given the files, ``crops`` and
    ``seed``.

    An unlabeled pool: ``y_train`` ``int32 [crops]`` is the source image's class (``NNN - 1``,
    ``num_classes`` = the highest class number), which no CoFED participant sees
    (``dataset.server_pool`` drops it). ``side["files"]``: ``str [F]`` the images' paths
    relative to the ``Img/`` folder, in sorted order; ``side["source"]``: ``int32 [crops]`` each
    crop's index into it.

    Raises:
      ConfigError: ``crops`` is not an integer >= 1.
      DatasetNotFoundError: no ``SampleNNN/*.png`` below any searched directory.
      ValueError: a PNG Pillow cannot decode, or a folder name without a class number.
    """
    if not (isinstance(crops, int | np.integer) and not isinstance(crops, bool) and crops >= 1):
        raise bad("crops", crops, "an integer >= 1 (number of 28x28 crops to make)")
    d = locate_files("kannada", data_dir)
    files = sorted(p for p in d.glob("Sample*/*.png") if p.is_file())
    classes = []
    for p in files:
        m = _SAMPLE_DIR.fullmatch(p.parent.name)
        if m is None:
            raise ValueError(f"{p.parent}: expected a folder SampleNNN (NNN = the class number)")
        classes.append(int(m.group(1)) - 1)
    rng = np.random.default_rng(seed)
    per_image = np.full(len(files), int(crops) // len(files), np.int64)
    per_image[rng.permutation(len(files))[: int(crops) % len(files)]] += 1
    xs, sources = [], []
    for i, (path, count) in enumerate(zip(files, per_image, strict=True)):
        if count == 0:
            continue
        img = images.read_png_gray(path)
        if np.median(img) < 128:  # a dark background: flip to FEMNIST's dark-on-light
            img = 255 - img
        xs.append(_square_crops(img, int(count), rng))
        sources.append(np.full(count, i, np.int32))
    source = np.concatenate(sources)
    x = np.concatenate(xs)[..., None]
    y = np.asarray(classes, np.int32)[source]
    empty_x = np.zeros((0, CROP_SIDE, CROP_SIDE, 1), np.uint8)
    side = {"files": np.array([p.relative_to(d).as_posix() for p in files]), "source": source}
    return make_image_dataset(
        "kannada", x, y, empty_x, np.zeros(0, np.int32), max(classes) + 1, side
    )


def tfds_data_dir(data_dir: str | None) -> Path:
    """The TFDS data directory: ``data_dir``, else ``$TFDS_DATA_DIR``, else TFDS's default
    ``~/tensorflow_datasets``."""
    chosen = data_dir or os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets"
    return Path(chosen).expanduser().absolute()


def _tfds_hint(tfds_name: str, root: Path) -> str:
    top = tfds_name.split(":")[0].split("/")[0]
    return (
        f"prepare it with `tfds build {tfds_name} --data_dir={root} --file_format=array_record` "
        f"(needs network and pip install 'fedjax-semi[tfds]'; or build it elsewhere and copy "
        f"its {top}/ folder into {root}); fedjax-semi never downloads"
    )


def load_tfds(tfds_name: str, data_dir: str | None = None) -> ArrayDataset:
    """A dataset already prepared by tensorflow-datasets in ``array_record`` format.

    Reads splits ``train``/``test`` with features ``image`` (uint8 ``[H, W, C]`` or
    ``[H, W]``) and ``label`` (ClassLabel) through ``tfds.data_source`` (no TensorFlow,
    ``download=False``). ``data_dir`` is the TFDS data directory (default: TFDS's own,
    ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``). The result is named ``tfds:NAME``.

    Raises:
      DatasetNotFoundError: tensorflow-datasets is missing, or the dataset is not prepared
        (or not readable) in the data directory; one line with the `tfds build` command.
    """
    name = TFDS_PREFIX + tfds_name
    root = tfds_data_dir(data_dir)
    if data_dir and not root.is_dir():
        raise DatasetNotFoundError(
            f"dataset.data_dir={str(root)!r} does not exist or is not a directory "
            f"(dataset {name!r}); {_tfds_hint(tfds_name, root)}"
        )
    # TFDS keeps NAME[/CONFIG]/VERSION/ under the data dir; checking NAME first gives a clear
    # message, needs no TFDS import and keeps TFDS from creating empty variant folders there.
    folder = root / tfds_name.split(":")[0].split("/")[0]
    if not folder.is_dir():
        err = DatasetNotFoundError(
            f"dataset.name={name!r}: not prepared in the TFDS data dir {str(root)!r} (no "
            f"folder {folder}); {_tfds_hint(tfds_name, root)}"
        )
        err.looked_in = (folder,)
        raise err
    data_dir = str(root)
    try:
        arrays, num_classes = images.read_tfds(tfds_name, data_dir)
    except ImportError as e:
        raise DatasetNotFoundError(
            f"dataset {name!r} needs tensorflow-datasets ({e}); install it with "
            "`pip install 'fedjax-semi[tfds]'`."
        ) from e
    except Exception as e:  # TFDS raises many types for "not prepared"
        raise DatasetNotFoundError(
            f"dataset.name={name!r}: not prepared in array_record format in {str(root)!r} "
            f"(tfds.data_source: {type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}); {_tfds_hint(tfds_name, root)}"
        ) from e
    return make_image_dataset(name, num_classes=num_classes, **arrays)
