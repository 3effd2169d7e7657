"""File codecs shared by the loaders: the IDX format of MNIST and Fashion-MNIST.

The per-family readers (CIFAR pickles, SVHN .mat, STL-10, LEAF, CSV, Adult) live in
:mod:`~fedjax_semi.data.images`, :mod:`~fedjax_semi.data.text` and
:mod:`~fedjax_semi.data.tabular`.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

__all__ = ["read_idx", "write_idx"]

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
