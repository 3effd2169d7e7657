"""Making a dataset available locally, on request only: ``apt-get install`` or a download.

Entry point of ``make data``: ``python -m fedjax_semi.data.fetch ensure fashion_mnist``.
Loading never calls this; a missing dataset ends in a message saying how to get it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from fedjax_semi.data.formats import read_idx
from fedjax_semi.data.lookup import (
    DEBIAN_FASHION_MNIST_PACKAGE,
    FASHION_MNIST_URL,
    IDX_FILES,
    cache_root,
)
from fedjax_semi.data.registry import DATASETS, DatasetNotFoundError, dataset_names, locate

__all__ = ["ensure", "fetch_fashion_mnist"]


def fetch_fashion_mnist(dest: Path | None = None) -> Path:
    """Downloads the four official Fashion-MNIST ``.gz`` files into ``dest``.

    ``dest`` defaults to ``${XDG_CACHE_HOME:-~/.cache}/fedjax_semi/fashion_mnist``, which
    :func:`~fedjax_semi.data.lookup.search_dirs` searches. Each file is written atomically
    and validated as IDX.

    Returns:
      The directory holding the files.

    Raises:
      ConnectionError: if the files cannot be downloaded (e.g. no network).
    """
    dest = Path(dest) if dest is not None else cache_root() / "fashion_mnist"
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
    return locate(name)


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
            f"usage: python -m fedjax_semi.data.fetch ensure NAME  (NAME in {dataset_names()})",
            file=sys.stderr,
        )
        return 2
    return ensure(argv[1])


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
