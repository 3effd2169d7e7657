"""Where datasets live on disk: search directories, the files each dataset needs, and the
not-found message that says where it looked and how to get the data.

Datasets are looked up on disk, never downloaded implicitly (see :func:`search_dirs`);
``python -m fedjax_semi.data.fetch ensure fashion_mnist`` installs or fetches one.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from fedjax_semi.data.dataset import DatasetNotFoundError

__all__ = [
    "ENV_VAR",
    "FILE_SPECS",
    "IDX_FILES",
    "FileSpec",
    "cache_root",
    "locate_files",
    "locate_idx",
    "search_dirs",
]

ENV_VAR = "FEDJAX_SEMI_DATA"
FASHION_MNIST_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
MNIST_URL = "https://yann.lecun.com/exdb/mnist/"
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR100_URL = "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"
SVHN_URL = "http://ufldl.stanford.edu/housenumbers/"
STL10_URL = "https://ai.stanford.edu/~acoates/stl10/stl10_binary.tar.gz"
FEMNIST_URL = "https://github.com/TalwalkarLab/leaf (data/femnist; run its preprocess.sh)"
CHARS74K_URL = "http://www.ee.surrey.ac.uk/CVSSP/demos/chars74k/"
DEBIAN_FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
DEBIAN_FASHION_MNIST_PACKAGE = "dataset-fashion-mnist"

# Split -> (images file, labels file); identical names for MNIST and Fashion-MNIST.
IDX_FILES: dict[str, tuple[str, str]] = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


@dataclasses.dataclass(frozen=True)
class FileSpec:
    """What a file-based dataset needs on disk, for lookup and not-found messages.

    Attributes:
      files: required glob patterns relative to the dataset directory, all of which must
        match (e.g. ``"data_batch_1"`` or ``"train/*.json"``).
      optional: files used when present (listed in messages only).
      subdirs: folders of the official archive also searched inside each directory, so
        both ``DIR/data_batch_1`` and ``DIR/cifar-10-batches-py/data_batch_1`` work.
      source: the official source (URL and what to do with it).
    """

    files: tuple[str, ...]
    optional: tuple[str, ...] = ()
    subdirs: tuple[str, ...] = ()
    source: str = ""


FILE_SPECS: dict[str, FileSpec] = {
    "cifar10": FileSpec(
        files=tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",),
        subdirs=("cifar-10-batches-py",),
        source=f"download {CIFAR10_URL} and extract it",
    ),
    "cifar100": FileSpec(
        files=("train", "test"),
        subdirs=("cifar-100-python",),
        source=f"download {CIFAR100_URL} and extract it",
    ),
    "svhn": FileSpec(
        files=("train_32x32.mat", "test_32x32.mat"),
        optional=("extra_32x32.mat",),
        subdirs=("housenumbers",),
        source=f"download train_32x32.mat and test_32x32.mat (format 2) from {SVHN_URL}",
    ),
    "stl10": FileSpec(
        files=("train_X.bin", "train_y.bin", "test_X.bin", "test_y.bin"),
        optional=("unlabeled_X.bin",),
        subdirs=("stl10_binary",),
        source=f"download {STL10_URL} and extract it",
    ),
    "femnist": FileSpec(
        files=("train/*.json", "test/*.json"),
        subdirs=("data", "femnist/data"),
        source=f"generate the LEAF json splits with {FEMNIST_URL}",
    ),
    # Chars74K's KannadaHnd.tgz unpacks to Kannada/Hnd/{Img,Trg}/SampleNNN/ (NNN = class,
    # images imgNNN-MMM.png); only the PNG bitmaps under Img/ are read.
    "kannada": FileSpec(
        files=("Sample*/*.png",),
        subdirs=("Img", "Hnd/Img", "Kannada/Hnd/Img"),
        source=f"download KannadaHnd.tgz from {CHARS74K_URL} and extract it",
    ),
}


def cache_root() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/fedjax_semi``: where downloads go, searched last."""
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
    dirs.append(cache_root() / name)
    if name == "fashion_mnist":
        dirs.append(DEBIAN_FASHION_MNIST_DIR)
    return dirs


def _expected_files(name: str) -> str:
    spec = FILE_SPECS.get(name)
    if spec is not None:
        where = "all in one directory"
        if spec.subdirs:
            where += f", either directly or in its {' or '.join(s + '/' for s in spec.subdirs)}"
        opt = f"; optional: {', '.join(spec.optional)}" if spec.optional else ""
        return f"Expected files ({where}): {', '.join(spec.files)}{opt}.\n"
    if name not in ("fashion_mnist", "mnist"):
        return ""
    bases = [b for pair in IDX_FILES.values() for b in pair]
    return f"Expected files (plain or .gz): {', '.join(bases)}.\n"


def _how_to_get(name: str) -> str:
    spec = FILE_SPECS.get(name)
    if spec is not None:
        return (
            f"To get it: {spec.source} (official source) into a directory and set "
            f"${ENV_VAR} to it (or pass data_dir / dataset.data_dir)."
        )
    if name == "fashion_mnist":
        return (
            "To get it: `apt-get install dataset-fashion-mnist` (Debian/Ubuntu), or "
            "`python -m fedjax_semi.data.fetch ensure fashion_mnist`, or download the four "
            f".gz files from {FASHION_MNIST_URL} into a directory and set ${ENV_VAR} to it "
            "(or pass data_dir)."
        )
    if name == "mnist":
        return (
            f"To get it: download the four .gz files from {MNIST_URL} into a directory and set "
            f"${ENV_VAR} to it (or pass data_dir)."
        )
    return ""  # other modules' datasets word their own instructions


def _find_file(directory: Path, base: str) -> Path | None:
    for candidate in (directory / base, directory / f"{base}.gz"):
        if candidate.is_file():
            return candidate
    return None


def locate_idx(name: str, data_dir: str | None) -> dict[str, Path]:
    """Returns file base name -> path, all four from the first directory holding them."""
    dirs = search_dirs(name, data_dir)
    bases = [b for pair in IDX_FILES.values() for b in pair]
    for d in dirs:
        found = {b: _find_file(d, b) for b in bases}
        if all(found.values()):
            return found  # type: ignore[return-value]
    raise _not_found(
        name,
        dirs,
        f"Expected files (plain or .gz, all in one directory): {', '.join(bases)}.\n",
    )


def _not_found(name: str, dirs: list[Path], expected: str | None = None) -> DatasetNotFoundError:
    """The error for dataset ``name`` missing from ``dirs``: where, which files, source."""
    looked = "\n".join(f"  - {d}{'' if d.is_dir() else ' (missing)'}" for d in dirs)
    err = DatasetNotFoundError(
        f"dataset {name!r} not found. Looked in:\n{looked}\n"
        f"{_expected_files(name) if expected is None else expected}{_how_to_get(name)}"
    )
    err.looked_in = tuple(dirs)
    return err


def _has(directory: Path, pattern: str) -> bool:
    # Files only: CIFAR-100's "train" must not match e.g. a LEAF "train/" folder.
    return directory.is_dir() and any(p.is_file() for p in directory.glob(pattern))


def locate_files(name: str, data_dir: str | None) -> Path:
    """The first directory (or official subfolder of one) holding all of ``FILE_SPECS[name]``.

    Raises:
      DatasetNotFoundError: naming the directories searched, the files and the source.
    """
    spec = FILE_SPECS[name]
    dirs = search_dirs(name, data_dir)
    for d in dirs:
        for candidate in (d, *(d / s for s in spec.subdirs)):
            if all(_has(candidate, pattern) for pattern in spec.files):
                return candidate
    raise _not_found(name, dirs)
