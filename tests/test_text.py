"""Tests for fedjax_semi.data.text: tokenizer, vocabulary, CSV/IMDB loaders, and a federated
run of the text model on a tiny synthetic DBPedia-format corpus."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from conftest import compose_config
from fedjax_semi import experiment
from fedjax_semi.data.registry import DatasetNotFoundError
from fedjax_semi.data.text import (
    PAD,
    UNK,
    build_vocab,
    encode,
    load_ag_news,
    load_dbpedia,
    load_imdb,
    tokenize,
)


def _write_csv(path: Path, rows: list[tuple[int, str, str]]) -> None:
    """The official CSV release format: no header, class unquoted, text fields quoted."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        csv.writer(f, quoting=csv.QUOTE_NONNUMERIC).writerows(rows)


# ----------------------------------------------------------------------------- tokenizer


def test_tokenize_lowercases_and_splits_on_non_alphanumerics() -> None:
    assert tokenize("Don't PANIC: 42 'towels',\tcafé!<br />x_y") == [
        "don't",
        "panic",
        "42",
        "towels",
        "café",
        "br",
        "x",
        "y",
    ]
    assert tokenize("") == [] and tokenize(" ,.; ") == []


def test_vocab_order_truncation_and_special_ids() -> None:
    docs = [["b", "a", "c"], ["a", "b", "d"], ["a", "c", "e"]]
    # a:3, b:2, c:2, d:1, e:1 -> frequency first, ties alphabetical.
    assert build_vocab(docs, 100) == [PAD, UNK, "a", "b", "c", "d", "e"]
    assert build_vocab(docs, 5) == [PAD, UNK, "a", "b", "c"]
    # Input order does not matter (deterministic).
    assert build_vocab(docs[::-1], 5) == build_vocab(docs, 5)
    assert build_vocab([], 3) == [PAD, UNK]
    with pytest.raises(ValueError, match=r"dataset\.vocab_size"):
        build_vocab(docs, 2)


def test_encode_truncates_pads_and_maps_unknown() -> None:
    vocab = [PAD, UNK, "the", "cat"]
    x = encode(["The cat sat", "", "cat cat cat cat the"], vocab, seq_len=4)
    assert x.dtype == np.int32 and x.shape == (3, 4)
    np.testing.assert_array_equal(x, [[2, 3, 1, 0], [0, 0, 0, 0], [3, 3, 3, 3]])
    with pytest.raises(ValueError, match=r"dataset\.seq_len"):
        encode(["x"], vocab, seq_len=0)


# ----------------------------------------------------------------------------- loaders

TRAIN_ROWS = [
    (1, 'Abbott, "Ltd"', " Abbott of Farnham, a coachbuilder. Abbott"),
    (3, "Zebra", ' The zebra is "striped", really striped'),
    (2, "Cat", " cat cat; the cat"),
]
TEST_ROWS = [(3, "Quagga", " an extinct zebra, unknownword")]


def test_load_dbpedia_csv_with_quotes_and_commas(tmp_path: Path) -> None:
    _write_csv(tmp_path / "dbpedia" / "dbpedia_csv" / "train.csv", TRAIN_ROWS)
    _write_csv(tmp_path / "dbpedia" / "dbpedia_csv" / "test.csv", TEST_ROWS)
    ds = load_dbpedia(str(tmp_path), vocab_size=6, seq_len=5)
    assert ds.name == "dbpedia" and ds.kind == "tokens" and ds.num_classes == 14
    assert ds.x_train.shape == (3, 5) and ds.x_test.shape == (1, 5)
    assert ds.x_train.dtype == ds.x_test.dtype == ds.y_train.dtype == np.int32
    np.testing.assert_array_equal(ds.y_train, [0, 2, 1])  # 1-based classes shifted
    np.testing.assert_array_equal(ds.y_test, [2])
    # Counts over train only: cat 4, abbott 3, then striped, the, zebra 2 each -> the 4 most
    # frequent words, ties alphabetical (zebra is cut).
    vocab = ds.side["vocab"]
    assert vocab == [PAD, UNK, "cat", "abbott", "striped", "the"]
    assert ds.vocab_size == len(vocab) == 6
    assert ds.mean == (0.0,) and ds.std == (1.0,)
    # Title and content joined, then truncated to 5 (ltd, of, farnham unknown).
    np.testing.assert_array_equal(ds.x_train[0], [3, 1, 3, 1, 1])
    np.testing.assert_array_equal(ds.x_train[2], [2, 2, 2, 5, 2])
    np.testing.assert_array_equal(ds.x_test[0], [1, 1, 1, 1, 1])  # zebra was cut
    assert not ds.x_train.flags.writeable


def test_load_ag_news_files_directly_in_dir(tmp_path: Path) -> None:
    _write_csv(tmp_path / "train.csv", [(4, "Wall St.", "Stocks, \\ rose"), (1, "War", "news")])
    _write_csv(tmp_path / "test.csv", [(2, "Cup", "final")])
    ds = load_ag_news(str(tmp_path), vocab_size=100, seq_len=3)
    assert ds.name == "ag_news" and ds.num_classes == 4
    np.testing.assert_array_equal(ds.y_train, [3, 0])
    assert ds.x_train.shape == (2, 3)
    words = [ds.side["vocab"][i] for i in ds.x_train[0]]
    assert words == ["wall", "st", "stocks"]


def test_csv_label_out_of_range(tmp_path: Path) -> None:
    _write_csv(tmp_path / "train.csv", [(5, "t", "c")])
    _write_csv(tmp_path / "test.csv", [(1, "t", "c")])
    with pytest.raises(ValueError, match=r"train\.csv:1: class 5 outside 1\.\.4"):
        load_ag_news(str(tmp_path))


def test_load_imdb_folder_layout(tmp_path: Path) -> None:
    reviews = {
        ("train", "pos"): {"1_9.txt": "Great film!<br /><br />Loved it", "0_10.txt": "great"},
        ("train", "neg"): {"5_1.txt": "Awful.<br />Boring"},
        ("test", "pos"): {"3_8.txt": "great fun"},
        ("test", "neg"): {"2_2.txt": "boring plot"},
        ("train", "unsup"): {"0_0.txt": "great boring"},
    }
    for (split, lab), files in reviews.items():
        d = tmp_path / "aclImdb" / split / lab
        d.mkdir(parents=True)
        for fname, text in files.items():
            (d / fname).write_text(text, encoding="utf-8")
    ds = load_imdb(str(tmp_path), vocab_size=50, seq_len=4)
    assert ds.name == "imdb" and ds.num_classes == 2 and ds.kind == "tokens"
    np.testing.assert_array_equal(ds.y_train, [0, 1, 1])  # neg first, then sorted pos
    np.testing.assert_array_equal(ds.y_test, [0, 1])
    vocab = ds.side["vocab"]
    decoded = [[vocab[i] for i in row if i] for row in ds.x_train]
    # "<br />" stripped; pos files sorted by name: 0_10.txt before 1_9.txt.
    assert decoded == [["awful", "boring"], ["great"], ["great", "film", "loved", "it"]]
    assert ds.side["x_unlabeled"].shape == (1, 4)
    # The aclImdb folder itself is accepted too.
    again = load_imdb(str(tmp_path / "aclImdb"), vocab_size=50, seq_len=4)
    np.testing.assert_array_equal(again.x_train, ds.x_train)


@pytest.mark.parametrize(
    ("loader", "name", "expect"),
    [
        (load_dbpedia, "dbpedia", "dbpedia_csv"),
        (load_ag_news, "ag_news", "ag_news_csv"),
        (load_imdb, "imdb", "aclImdb_v1"),
    ],
)
def test_not_found_message(tmp_path: Path, loader, name: str, expect: str) -> None:
    with pytest.raises(DatasetNotFoundError) as err:
        loader(str(tmp_path))
    msg = str(err.value)
    assert f"dataset {name!r} not found" in msg and str(tmp_path / name) in msg
    assert expect in msg and "FEDJAX_SEMI_DATA" in msg


def test_loader_validates_sizes(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"dataset\.vocab_size"):
        load_dbpedia(str(tmp_path), vocab_size=2)
    with pytest.raises(ValueError, match=r"dataset\.seq_len"):
        load_imdb(str(tmp_path), seq_len=0)


# ----------------------------------------------------------------------------- end to end


def _synthetic_dbpedia(root: Path, num_train: int = 400, num_test: int = 100) -> None:
    """4 classes; each word is one of the class's 6 indicative words (p = 0.5) or one of
    30 shared noise words. Deterministic (fixed numpy seed)."""
    rng = np.random.default_rng(0)
    topic = {c: [f"topic{c}w{i}" for i in range(6)] for c in range(4)}
    noise = [f"noise{i}" for i in range(30)]

    def rows(n: int) -> list[tuple[int, str, str]]:
        out = []
        for _ in range(n):
            c = int(rng.integers(4))
            words = [
                str(rng.choice(topic[c])) if rng.random() < 0.5 else str(rng.choice(noise))
                for _ in range(14)
            ]
            out.append((c + 1, " ".join(words[:2]).title(), ", ".join(words[2:])))
        return out

    _write_csv(root / "train.csv", rows(num_train))
    _write_csv(root / "test.csv", rows(num_test))


def test_text_model_federated_training_end_to_end(tmp_path: Path) -> None:
    _synthetic_dbpedia(tmp_path / "data")
    ds = load_dbpedia(str(tmp_path / "data"), vocab_size=200, seq_len=16)
    assert ds.x_train.shape == (400, 16) and ds.vocab_size == 2 + 4 * 6 + 30
    cfg = compose_config(
        "algorithm=fedavg_sl",
        "model=text",
        "model.hidden=[32]",
        "model.embed_dim=32",
        "partition=iid",
        "num_clients=8",
        "clients_per_round=4",
        "rounds=5",
        # 3 local epochs of 4 steps: ~60 SGD steps in all, past the initial plateau while
        # the 10 classes absent from the corpus are pushed down.
        "algorithm.lr=1.0",
        "algorithm.local_epochs=3",
    )
    exp = experiment.build(cfg, dataset=ds)
    assert exp.model.input_kind == "tokens" and exp.model.input_shape == (16,)
    summary = experiment.run(exp, tmp_path / "run")
    assert summary["rounds_completed"] == 5
    assert summary["final"]["accuracy"] > 0.6  # chance is 0.25
