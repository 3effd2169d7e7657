"""The in-memory dataset every loader returns, and the error for a dataset not on disk.

Kept apart from :mod:`fedjax_semi.data.registry` so that the loaders (images, text,
tabular) can build datasets without importing the registry, which imports them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

__all__ = ["ArrayDataset", "DatasetNotFoundError"]


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
    # Side arrays beside the train/test split, by name: other splits of the dataset
    # ("x_unlabeled" STL-10's and IMDB's unlabeled split, "x_extra"/"y_extra" SVHN's extra
    # split), per-example ids ("writer_train"/"writer_test" int32 [N]/[M], each example's index
    # into "writers" str [W]: FEMNIST's writers), per-example coarse labels ("y_train_coarse"/
    # "y_test_coarse" int32 [N]/[M]: CIFAR-100's superclasses) and per-dataset names ("vocab",
    # "feature_names", Kannada's "files"/"source"). Not fed to the models as such; the
    # partitions and the server pools read them.
    side: dict = dataclasses.field(default_factory=dict)


class DatasetNotFoundError(FileNotFoundError):
    """Raised when a dataset's files are not found in any searched directory.

    ``looked_in`` lists the directories searched (empty when not applicable).
    """

    looked_in: tuple[Path, ...] = ()
