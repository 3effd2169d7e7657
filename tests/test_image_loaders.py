"""Image dataset loaders on tiny fixtures written in the real on-disk formats.

CIFAR python pickles (bytes keys), SVHN MATLAB files (scipy.io.savemat), STL-10 raw
column-major binaries, LEAF json, Chars74K's PNG folders (Pillow) and a TFDS array_record
dataset built in tmp_path.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from fedjax_semi.data import images, registry
from fedjax_semi.data.registry import FILE_SPECS, DatasetNotFoundError, load_dataset
from fedjax_semi.errors import ConfigError

pytestmark = pytest.mark.usefixtures("isolated_data_env")


# ----------------------------------------------------------------------------- writers


def _cifar_rows(x: np.ndarray) -> np.ndarray:
    """``uint8 [N, 32, 32, 3]`` -> the official ``[N, 3072]`` rows (R plane, G, B; row-major)."""
    return x.transpose(0, 3, 1, 2).reshape(len(x), 3072)


def _pickle(path: Path, obj: dict) -> None:
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)  # the official files are protocol-2 pickles


def write_cifar10(directory: Path, n: int = 4, n_test: int = 3, seed: int = 0) -> dict:
    """Writes ``data_batch_1..5`` (``n`` images each) and ``test_batch``; returns the arrays."""
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    xs, ys = [], []
    for i in range(1, 6):
        x = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
        y = [int(v) for v in rng.integers(0, 10, n)]
        _pickle(
            directory / f"data_batch_{i}",
            {
                b"batch_label": f"training batch {i} of 5".encode(),
                b"labels": y,
                b"data": _cifar_rows(x),
                b"filenames": [f"img_{i}_{j}.png".encode() for j in range(n)],
            },
        )
        xs.append(x)
        ys += y
    x_test = rng.integers(0, 256, (n_test, 32, 32, 3), dtype=np.uint8)
    y_test = list(range(n_test))
    _pickle(
        directory / "test_batch",
        {b"batch_label": b"testing batch 1 of 1", b"labels": y_test, b"data": _cifar_rows(x_test)},
    )
    return {"x_train": np.concatenate(xs), "y_train": ys, "x_test": x_test, "y_test": y_test}


def write_cifar100(directory: Path, n: int = 6, n_test: int = 4, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    out = {}
    for split, size in (("train", n), ("test", n_test)):
        x = rng.integers(0, 256, (size, 32, 32, 3), dtype=np.uint8)
        fine = [int(v) for v in rng.integers(0, 100, size)]
        coarse = [f // 5 for f in fine]
        _pickle(
            directory / split,
            {
                b"filenames": [b"f.png"] * size,
                b"batch_label": f"{split} batch".encode(),
                b"fine_labels": fine,
                b"coarse_labels": coarse,
                b"data": _cifar_rows(x),
            },
        )
        out[split] = (x, fine, coarse)
    _pickle(directory / "meta", {b"fine_label_names": [b"apple"], b"coarse_label_names": [b"x"]})
    return out


def write_svhn_mat(path: Path, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Writes an SVHN format-2 file; returns ``(x [N,32,32,3], stored labels [N] in 1..10)``."""
    from scipy.io import savemat

    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    y = (np.arange(n) % 10 + 1).astype(np.uint8)  # 1..10; 10 is digit 0
    savemat(path, {"X": x.transpose(1, 2, 3, 0), "y": y[:, None]})
    return x, y


def write_stl_bin(path: Path, n: int, seed: int) -> np.ndarray:
    """Writes raw STL-10 images; returns the raw ``[N, C, W, H]`` array written."""
    raw = np.random.default_rng(seed).integers(0, 256, (n, 3, 96, 96), dtype=np.uint8)
    raw.tofile(path)
    return raw


def write_leaf_file(path: Path, users: dict[str, tuple[np.ndarray, list[int]]]) -> None:
    """Writes one LEAF json file; ``users`` maps id -> (float x [n, 784] in [0, 1], y)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = {
        "users": list(users),
        "num_samples": [len(y) for _, y in users.values()],
        "user_data": {u: {"x": x.tolist(), "y": y} for u, (x, y) in users.items()},
    }
    path.write_text(json.dumps(blob))


# ----------------------------------------------------------------------------- CIFAR


@pytest.mark.parametrize("subdir", ["", "cifar-10-batches-py"])
def test_cifar10(tmp_path, subdir):
    arrays = write_cifar10(tmp_path / "data" / subdir)
    ds = load_dataset("cifar10", data_dir=str(tmp_path / "data"))
    assert ds.name == "cifar10" and ds.num_classes == 10
    assert ds.x_train.shape == (20, 32, 32, 3) and ds.x_train.dtype == np.uint8
    assert ds.x_test.shape == (3, 32, 32, 3)
    assert ds.y_train.dtype == np.int32 and ds.y_test.dtype == np.int32
    np.testing.assert_array_equal(ds.x_train, arrays["x_train"])
    np.testing.assert_array_equal(ds.y_train, arrays["y_train"])
    np.testing.assert_array_equal(ds.x_test, arrays["x_test"])
    np.testing.assert_array_equal(ds.y_test, arrays["y_test"])
    # One pixel straight from the raw row: channel c, row h, column w at 1024c + 32h + w.
    with open(tmp_path / "data" / subdir / "test_batch", "rb") as f:
        row = pickle.load(f, encoding="bytes")[b"data"][1]
    c, h, w = 2, 5, 17
    assert ds.x_test[1, h, w, c] == row[1024 * c + 32 * h + w]
    assert len(ds.mean) == 3 and len(ds.std) == 3


def test_cifar10_found_through_env_var_subfolder(tmp_path, monkeypatch):
    write_cifar10(tmp_path / "root" / "cifar-10-batches-py", n=2)
    monkeypatch.setenv("FEDJAX_SEMI_DATA", str(tmp_path / "root"))
    assert load_dataset("cifar10").x_train.shape[0] == 10
    assert registry.locate("cifar10") == str(tmp_path / "root" / "cifar-10-batches-py")


def test_cifar100_fine_and_coarse(tmp_path):
    written = write_cifar100(tmp_path / "c" / "cifar-100-python")
    ds = load_dataset("cifar100", data_dir=str(tmp_path / "c"))
    assert ds.num_classes == 100
    assert ds.x_train.shape == (6, 32, 32, 3) and ds.x_test.shape == (4, 32, 32, 3)
    np.testing.assert_array_equal(ds.x_train, written["train"][0])
    np.testing.assert_array_equal(ds.y_train, written["train"][1])
    np.testing.assert_array_equal(ds.y_test, written["test"][1])
    for split in ("train", "test"):
        coarse = ds.side[f"y_{split}_coarse"]
        assert coarse.dtype == np.int32 and coarse.shape == (len(written[split][1]),)
        np.testing.assert_array_equal(coarse, written[split][2])
        assert coarse.max() < 20
    assert not ds.side["y_train_coarse"].flags.writeable


# ----------------------------------------------------------------------------- SVHN


@pytest.mark.parametrize("with_extra", [False, True])
def test_svhn(tmp_path, with_extra):
    d = tmp_path / "svhn"
    d.mkdir()
    x_train, y_stored = write_svhn_mat(d / "train_32x32.mat", 12, seed=0)
    x_test, _ = write_svhn_mat(d / "test_32x32.mat", 5, seed=1)
    if with_extra:
        x_extra, _ = write_svhn_mat(d / "extra_32x32.mat", 3, seed=2)
    ds = load_dataset("svhn", data_dir=str(tmp_path))  # found in data_dir/svhn
    assert ds.x_train.shape == (12, 32, 32, 3) and ds.x_train.dtype == np.uint8
    assert ds.x_test.shape == (5, 32, 32, 3)
    np.testing.assert_array_equal(ds.x_train, x_train)
    np.testing.assert_array_equal(ds.x_test, x_test)
    assert ds.y_train.dtype == np.int32
    # Stored label 10 is digit 0; 1..9 stay.
    np.testing.assert_array_equal(ds.y_train, np.where(y_stored == 10, 0, y_stored))
    assert ds.y_train[9] == 0 and y_stored[9] == 10
    assert set(ds.y_train.tolist()) == set(range(10))
    if with_extra:
        np.testing.assert_array_equal(ds.side["x_extra"], x_extra)
        assert ds.side["y_extra"].tolist() == [1, 2, 3]
    else:
        assert "x_extra" not in ds.side


# ----------------------------------------------------------------------------- STL-10


def test_stl10_column_major_layout_and_labels(tmp_path):
    d = tmp_path / "stl10" / "stl10_binary"
    d.mkdir(parents=True)
    raw_train = write_stl_bin(d / "train_X.bin", 3, seed=0)
    raw_test = write_stl_bin(d / "test_X.bin", 2, seed=1)
    raw_unl = write_stl_bin(d / "unlabeled_X.bin", 2, seed=2)
    np.array([1, 10, 5], np.uint8).tofile(d / "train_y.bin")
    np.array([10, 1], np.uint8).tofile(d / "test_y.bin")
    ds = load_dataset("stl10", data_dir=str(tmp_path))
    assert ds.x_train.shape == (3, 96, 96, 3) and ds.x_train.dtype == np.uint8
    assert ds.x_test.shape == (2, 96, 96, 3)
    assert ds.y_train.tolist() == [0, 9, 4] and ds.y_test.tolist() == [9, 0]
    assert ds.y_train.dtype == np.int32
    # Column-major: byte c*96*96 + w*96 + h of an image is pixel (row h, column w, channel c).
    flat = np.fromfile(d / "train_X.bin", np.uint8)
    h, w, c = 7, 60, 2
    assert ds.x_train[0, h, w, c] == flat[c * 96 * 96 + w * 96 + h]
    assert ds.x_train[0, h, w, c] == raw_train[0, c, w, h]
    np.testing.assert_array_equal(ds.x_train, raw_train.transpose(0, 3, 2, 1))
    np.testing.assert_array_equal(ds.x_test, raw_test.transpose(0, 3, 2, 1))
    unl = ds.side["x_unlabeled"]
    assert unl.shape == (2, 96, 96, 3) and unl.dtype == np.uint8
    np.testing.assert_array_equal(unl, raw_unl.transpose(0, 3, 2, 1))


def test_stl10_without_unlabeled(tmp_path):
    d = tmp_path / "s"
    d.mkdir()
    write_stl_bin(d / "train_X.bin", 1, seed=0)
    write_stl_bin(d / "test_X.bin", 1, seed=1)
    np.array([3], np.uint8).tofile(d / "train_y.bin")
    np.array([4], np.uint8).tofile(d / "test_y.bin")
    ds = load_dataset("stl10", data_dir=str(d))
    assert "x_unlabeled" not in ds.side and ds.y_train.tolist() == [2]


# ----------------------------------------------------------------------------- FEMNIST


def test_femnist_leaf_json_and_writers(tmp_path):
    rng = np.random.default_rng(0)

    def imgs(n):
        return rng.random((n, 784)).astype(np.float32)

    root = tmp_path / "leaf" / "data"  # LEAF's own layout: femnist/data/{train,test}
    a_tr, b_tr, c_tr = imgs(3), imgs(2), imgs(4)
    write_leaf_file(
        root / "train" / "all_data_0_niid_0_keep_0_train_9.json",
        {"f0000_14": (a_tr, [0, 61, 5]), "f0001_41": (b_tr, [10, 36])},
    )
    write_leaf_file(
        root / "train" / "all_data_1_niid_0_keep_0_train_9.json", {"f0002_07": (c_tr, [1] * 4)}
    )
    a_te, c_te = imgs(1), imgs(2)
    write_leaf_file(
        root / "test" / "all_data_0_niid_0_keep_0_test_9.json",
        {"f0000_14": (a_te, [7]), "f0002_07": (c_te, [2, 3])},
    )
    ds = load_dataset("femnist", data_dir=str(tmp_path / "leaf"))
    assert ds.num_classes == 62
    assert ds.x_train.shape == (9, 28, 28, 1) and ds.x_train.dtype == np.uint8
    assert ds.x_test.shape == (3, 28, 28, 1)
    assert ds.y_train.tolist() == [0, 61, 5, 10, 36, 1, 1, 1, 1]
    assert ds.y_test.tolist() == [7, 2, 3]
    expected = np.round(np.concatenate([a_tr, b_tr, c_tr]) * 255).astype(np.uint8)
    np.testing.assert_array_equal(ds.x_train.reshape(9, 784), expected)
    assert ds.side["writers"].tolist() == ["f0000_14", "f0001_41", "f0002_07"]
    assert ds.side["writer_train"].dtype == np.int32
    assert ds.side["writer_train"].tolist() == [0, 0, 0, 1, 1, 2, 2, 2, 2]
    assert ds.side["writer_test"].tolist() == [0, 2, 2]


# ----------------------------------------------------------------------------- Chars74K Kannada

# A horizontal ramp, 40 wide and 20 high (light: its median is 158): every square crop of it is
# a ramp too, so its columns tell where a crop lay and how wide it was.
RAMP = np.tile(100 + 3 * np.arange(40), (20, 1)).astype(np.uint8)


def write_chars74k_kannada(root: Path) -> dict[str, int]:
    """KannadaHnd.tgz as unpacked: ``Kannada/Hnd/Img/SampleNNN/imgNNN-MMM.png`` (and the stroke
    files in ``Trg/``, which the loader ignores). Classes 1, 2 and 12, two images each, in
    grayscale, RGB and (one) dark-background modes. Returns {path below Img/: class - 1}."""
    from PIL import Image

    hnd = root / "Kannada" / "Hnd"
    written = {}
    for c in (1, 2, 12):
        for m in (1, 2):
            folder = hnd / "Img" / f"Sample{c:03d}"
            folder.mkdir(parents=True, exist_ok=True)
            if (c, m) == (2, 2):
                im = Image.fromarray(255 - RAMP)  # a dark background: the loader flips it
            elif m == 2:
                im = Image.fromarray(np.repeat(RAMP[..., None], 3, axis=2))  # RGB
            else:
                im = Image.fromarray(RAMP)
            im.save(folder / f"img{c:03d}-{m:03d}.png")
            written[f"Sample{c:03d}/img{c:03d}-{m:03d}.png"] = c - 1
        (hnd / "Trg" / f"Sample{c:03d}").mkdir(parents=True, exist_ok=True)
        (hnd / "Trg" / f"Sample{c:03d}" / f"img{c:03d}-001.m").write_text("% strokes\n")
    return written


def test_kannada_crops(tmp_path):
    written = write_chars74k_kannada(tmp_path / "chars74k")
    ds = load_dataset("kannada", data_dir=str(tmp_path / "chars74k"), crops=125)
    assert ds.x_train.shape == (125, 28, 28, 1) and ds.x_train.dtype == np.uint8
    assert ds.x_test.shape == (0, 28, 28, 1) and ds.y_test.shape == (0,)
    assert ds.num_classes == 12
    assert ds.side["files"].tolist() == sorted(written)
    src = ds.side["source"]
    assert sorted(np.bincount(src, minlength=6).tolist()) == [20] * 1 + [21] * 5
    np.testing.assert_array_equal(ds.y_train, [written[ds.side["files"][i]] for i in src])
    x = ds.x_train[..., 0].astype(np.int64)
    # Every crop is a piece of the light ramp, the dark-background image's included (flipped):
    # identical rows, columns rising left to right.
    assert (x == x[:, :1, :]).all()
    assert (np.diff(x[:, 0, :], axis=1) >= 0).all()
    # Square crops of 10..20 px (50-100% of the shorter side; smaller than 28 here, so the box
    # filter repeats pixels): the ramp rises 3 a pixel, a crop of side c spans 3 (c - 1).
    side = (x[:, 0, -1] - x[:, 0, 0]) / 3 + 1
    assert set(side) <= set(range(10, 21)) and len(set(side)) >= 8
    assert len(np.unique(x[:, 0, 0])) > 10  # at many positions
    assert x.min() >= 100  # the flipped image is 38..155 falling: none of it left as it was
    again = load_dataset("kannada", data_dir=str(tmp_path / "chars74k" / "Kannada"), crops=125)
    np.testing.assert_array_equal(again.x_train, ds.x_train)  # deterministic; found deeper too
    other = load_dataset("kannada", data_dir=str(tmp_path / "chars74k"), crops=125, seed=1)
    assert not np.array_equal(other.x_train, ds.x_train)
    with pytest.raises(ConfigError, match=r"^crops=0 is not allowed"):
        load_dataset("kannada", data_dir=str(tmp_path / "chars74k"), crops=0)


def test_png_transparent_background_reads_white(tmp_path):
    from PIL import Image

    rgba = np.zeros((6, 5, 4), np.uint8)  # transparent black
    rgba[2, :, 3] = 255  # one opaque black stroke
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    gray = images.read_png_gray(tmp_path / "a.png")
    assert gray.shape == (6, 5) and gray.dtype == np.uint8
    assert (gray[2] == 0).all() and (np.delete(gray, 2, axis=0) == 255).all()
    (tmp_path / "b.png").write_bytes(b"not a png")
    with pytest.raises(ValueError, match="b.png: not a readable PNG"):
        images.read_png_gray(tmp_path / "b.png")


# ----------------------------------------------------------------------------- not found

SOURCES = {
    "cifar10": "cifar-10-python.tar.gz",
    "cifar100": "cifar-100-python.tar.gz",
    "svhn": "ufldl.stanford.edu/housenumbers",
    "stl10": "stl10_binary.tar.gz",
    "femnist": "github.com/TalwalkarLab/leaf",
    "kannada": "KannadaHnd.tgz",
}


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_not_found_message(tmp_path, name):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset(name, data_dir=str(tmp_path / "empty"))
    msg = str(info.value)
    assert str(tmp_path / "empty" / name) in msg and str(tmp_path / "empty") in msg
    for f in FILE_SPECS[name].files:
        assert f in msg
    assert SOURCES[name] in msg and "FEDJAX_SEMI_DATA" in msg
    assert info.value.looked_in == (tmp_path / "empty" / name, tmp_path / "empty")


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_not_found_default_dirs(name):
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset(name)
    assert "xdg-cache" in str(info.value) and SOURCES[name] in str(info.value)


def test_missing_explicit_data_dir_names_config_key(tmp_path):
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset("cifar100", data_dir=str(tmp_path / "typo"))
    msg = str(info.value)
    assert "dataset.data_dir" in msg and "typo" in msg
    assert "cifar-100-python.tar.gz" in msg and "train, test" in msg


def test_partial_cifar10_not_accepted(tmp_path):
    write_cifar10(tmp_path / "d", n=1)
    (tmp_path / "d" / "test_batch").unlink()
    with pytest.raises(DatasetNotFoundError, match="test_batch"):
        load_dataset("cifar10", data_dir=str(tmp_path / "d"))


def test_corrupt_cifar_batch(tmp_path):
    write_cifar10(tmp_path / "d", n=1)
    _pickle(tmp_path / "d" / "test_batch", {b"labels": [1]})
    with pytest.raises(ValueError, match="not a CIFAR batch"):
        load_dataset("cifar10", data_dir=str(tmp_path / "d"))


# ----------------------------------------------------------------------------- TFDS


def test_tfds_name_validation():
    assert registry.is_known_dataset("tfds:mnist")
    assert not registry.is_known_dataset("tfds:") and not registry.is_known_dataset("nope")
    with pytest.raises(ValueError, match="tfds:NAME"):
        load_dataset("nope")


def test_tfds_missing_data_dir(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="dataset.data_dir"):
        load_dataset("tfds:mnist", data_dir=str(tmp_path / "nope"))


def test_tfds_array_record_round_trip(tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets")
    rng = np.random.default_rng(0)
    data = {
        "train": (rng.integers(0, 256, (7, 8, 8, 1), dtype=np.uint8), np.arange(7) % 3),
        "test": (rng.integers(0, 256, (4, 8, 8, 1), dtype=np.uint8), np.array([2, 1, 0, 2])),
    }

    class FedjaxSemiToy(tfds.core.GeneratorBasedBuilder):
        """8x8 grayscale images, 3 classes, from in-memory arrays."""

        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(
                builder=self,
                features=tfds.features.FeaturesDict(
                    {
                        "image": tfds.features.Tensor(shape=(8, 8, 1), dtype=np.uint8),
                        "label": tfds.features.ClassLabel(num_classes=3),
                    }
                ),
            )

        def _split_generators(self, dl_manager):
            del dl_manager  # nothing to download
            return {split: self._generate_examples(split) for split in data}

        def _generate_examples(self, split):
            x, y = data[split]
            for i in range(len(y)):
                yield i, {"image": x[i], "label": int(y[i])}

    builder = FedjaxSemiToy(data_dir=str(tmp_path / "tfds"), file_format="array_record")
    builder.download_and_prepare()
    ds = load_dataset("tfds:fedjax_semi_toy", data_dir=str(tmp_path / "tfds"))
    assert ds.name == "tfds:fedjax_semi_toy" and ds.num_classes == 3
    assert ds.x_train.shape == (7, 8, 8, 1) and ds.x_train.dtype == np.uint8
    assert ds.y_train.dtype == np.int32
    # Records come back in key order; compare as sets of (image, label) to not depend on it.
    for split in ("train", "test"):
        x, y = data[split]
        got_x, got_y = getattr(ds, f"x_{split}"), getattr(ds, f"y_{split}")
        order = np.lexsort(got_x.reshape(len(got_x), -1).T)
        want = np.lexsort(x.reshape(len(x), -1).T)
        np.testing.assert_array_equal(got_x[order], x[want])
        np.testing.assert_array_equal(got_y[order], y[want])
    with pytest.raises(DatasetNotFoundError, match="tfds:not_prepared_here") as info:
        load_dataset("tfds:not_prepared_here", data_dir=str(tmp_path / "tfds"))
    assert str(tmp_path / "tfds" / "not_prepared_here") in str(info.value)
    # A folder that is not a prepared dataset: TFDS's own error, worded as not found.
    (tmp_path / "tfds" / "half_done" / "1.0.0").mkdir(parents=True)
    with pytest.raises(DatasetNotFoundError, match="array_record"):
        load_dataset("tfds:half_done", data_dir=str(tmp_path / "tfds"))
