"""Text classification data sources: DBPedia-14, AG News and IMDB as padded token ids.

Every loader returns an :class:`~fedjax_semi.data.dataset.ArrayDataset` with
``kind="tokens"``: ``x int32 [N, seq_len]`` (id 0 = padding, 1 = unknown word) and labels
``int32 [N]``. The vocabulary is built from the training split only, so the test split
never leaks into it. No jax here, like the rest of the data layer.

Datasets are looked up on disk (see :func:`~fedjax_semi.data.lookup.search_dirs`), never
downloaded.
"""

from __future__ import annotations

import collections
import csv
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from fedjax_semi.data.dataset import ArrayDataset, DatasetNotFoundError
from fedjax_semi.data.lookup import ENV_VAR, search_dirs

__all__ = [
    "PAD",
    "PAD_ID",
    "UNK",
    "UNK_ID",
    "build_vocab",
    "encode",
    "load_ag_news",
    "load_dbpedia",
    "load_imdb",
    "tokenize",
]

PAD, UNK = "<pad>", "<unk>"
PAD_ID, UNK_ID = 0, 1

# A word is a run of Unicode letters/digits, with apostrophes kept only inside it
# ("don't" stays one word, quotes around a word are dropped). `[^\W_]` = \w minus "_".
_WORD_RE = re.compile(r"[^\W_]+(?:'[^\W_]+)*")

DBPEDIA_URL = "https://s3.amazonaws.com/fast-ai-nlp/dbpedia_csv.tgz"
AG_NEWS_URL = "https://s3.amazonaws.com/fast-ai-nlp/ag_news_csv.tgz"
IMDB_URL = "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz"
# Zhang, Zhao & LeCun (2015), "Character-level Convolutional Networks for Text
# Classification": the CSV releases of DBPedia-14 and AG News.
_ZHANG_2015 = "the CSV release of Zhang, Zhao & LeCun (2015), e.g. {url}"


# ----------------------------------------------------------------------------- tokenizer


def tokenize(text: str) -> list[str]:
    """Deterministic word-level tokenizer.

    Lowercases ``text`` and returns its words in order: maximal runs of Unicode letters and
    digits, joined across internal apostrophes. Everything else (whitespace, punctuation,
    ``_``, HTML leftovers) separates words and is dropped.

    >>> tokenize("Don't PANIC: 42 'towels', café!")
    ["don't", 'panic', '42', 'towels', 'café']
    """
    return _WORD_RE.findall(text.lower())


def build_vocab(token_lists: Iterable[Sequence[str]], vocab_size: int) -> list[str]:
    """Vocabulary from tokenized (training) texts.

    Returns:
      ``vocab``: list of words where the index is the id: ``[PAD, UNK, w_2, w_3, ...]``,
      words by descending frequency, ties broken alphabetically (so the result never
      depends on input order beyond counts), truncated to ``vocab_size`` entries in total.
      Shorter than ``vocab_size`` when the texts have fewer distinct words.

    Raises:
      ValueError: ``vocab_size < 3`` (config key ``dataset.vocab_size``).
    """
    _check_vocab_size(vocab_size)
    counts = collections.Counter(w for tokens in token_lists for w in tokens)
    words = sorted(counts, key=lambda w: (-counts[w], w))
    return [PAD, UNK, *words[: vocab_size - 2]]


def _encode_tokens(
    token_lists: Sequence[Sequence[str]], index: dict[str, int], seq_len: int
) -> np.ndarray:
    """Token lists -> ``int32 [N, seq_len]``: truncated at ``seq_len``, right-padded with 0."""
    out = np.full((len(token_lists), seq_len), PAD_ID, dtype=np.int32)
    for i, tokens in enumerate(token_lists):
        ids = [index.get(w, UNK_ID) for w in tokens[:seq_len]]
        out[i, : len(ids)] = ids
    return out


def encode(texts: Sequence[str], vocab: Sequence[str], seq_len: int) -> np.ndarray:
    """Tokenizes and encodes ``texts``.

    Args:
      texts: ``N`` raw strings.
      vocab: from :func:`build_vocab` (index = id).
      seq_len: output length (>= 1).

    Returns:
      ``int32 [N, seq_len]``: word ids (unknown words -> ``UNK_ID``), the first ``seq_len``
      words of each text, right-padded with ``PAD_ID``.
    """
    _check_seq_len(seq_len)
    index = {w: i for i, w in enumerate(vocab)}
    return _encode_tokens([tokenize(t) for t in texts], index, seq_len)


def _check_vocab_size(vocab_size: int) -> None:
    if vocab_size < 3:
        raise ValueError(
            f"invalid dataset.vocab_size={vocab_size!r}; allowed: an integer >= 3 "
            "(ids 0 and 1 are padding and unknown)"
        )


def _check_seq_len(seq_len: int) -> None:
    if seq_len < 1:
        raise ValueError(f"invalid dataset.seq_len={seq_len!r}; allowed: an integer >= 1")


# ----------------------------------------------------------------------------- assembly


def _make_text_dataset(
    name: str,
    train: tuple[list[str], np.ndarray],
    test: tuple[list[str], np.ndarray],
    num_classes: int,
    vocab_size: int,
    seq_len: int,
    unlabeled: list[str] | None = None,
) -> ArrayDataset:
    """(texts, labels) per split -> a read-only tokens dataset; vocabulary from train only."""
    train_tokens = [tokenize(t) for t in train[0]]
    vocab = build_vocab(train_tokens, vocab_size)
    index = {w: i for i, w in enumerate(vocab)}
    x_train = _encode_tokens(train_tokens, index, seq_len)
    x_test = _encode_tokens([tokenize(t) for t in test[0]], index, seq_len)
    arrays = [x_train, train[1].astype(np.int32), x_test, test[1].astype(np.int32)]
    side: dict = {"vocab": vocab}
    if unlabeled is not None:
        side["x_unlabeled"] = _encode_tokens([tokenize(t) for t in unlabeled], index, seq_len)
        arrays.append(side["x_unlabeled"])
    for a in arrays:
        a.setflags(write=False)  # shared through the in-process cache of load_dataset
    return ArrayDataset(
        name,
        *arrays[:4],
        num_classes=num_classes,
        mean=(0.0,),
        std=(1.0,),
        kind="tokens",
        vocab_size=len(vocab),
        side=side,
    )


def _not_found(name: str, dirs: list[Path], expected: str, source: str) -> DatasetNotFoundError:
    looked = "\n".join(f"  - {d}{'' if d.is_dir() else ' (missing)'}" for d in dirs)
    err = DatasetNotFoundError(
        f"dataset {name!r} not found. Looked in:\n{looked}\n"
        f"Expected files: {expected}.\n"
        f"To get it: download {source}, extract it into a directory and set ${ENV_VAR} to "
        "that directory (or pass data_dir)."
    )
    err.looked_in = tuple(dirs)
    return err


# ----------------------------------------------------------------------------- CSV releases


def _locate_csv(name: str, subdir: str, data_dir: str | None, source: str) -> Path:
    """The directory holding ``train.csv`` and ``test.csv`` (directly or in ``subdir/``)."""
    dirs = search_dirs(name, data_dir)
    for d in dirs:
        for cand in (d, d / subdir):
            if (cand / "train.csv").is_file() and (cand / "test.csv").is_file():
                return cand
    raise _not_found(
        name, dirs, f"train.csv and test.csv, directly in one of these or in {subdir}/", source
    )


def _read_label_csv(path: Path, num_classes: int) -> tuple[list[str], np.ndarray]:
    """Rows ``class (1-based), title, body`` without header -> (texts, 0-based labels).

    The text is ``title + " " + body``; extra columns (none in the official files) are
    appended the same way.
    """
    texts: list[str] = []
    labels: list[int] = []
    with open(path, encoding="utf-8", newline="") as f:
        for line, row in enumerate(csv.reader(f), start=1):
            if not row:
                continue
            try:
                label = int(row[0]) - 1
            except ValueError:
                raise ValueError(f"{path}:{line}: class {row[0]!r} is not an integer") from None
            if not 0 <= label < num_classes:
                raise ValueError(f"{path}:{line}: class {label + 1} outside 1..{num_classes}")
            texts.append(" ".join(row[1:]))
            labels.append(label)
    return texts, np.asarray(labels, dtype=np.int32)


def _load_csv_dataset(
    name: str,
    subdir: str,
    num_classes: int,
    source: str,
    data_dir: str | None,
    vocab_size: int,
    seq_len: int,
) -> ArrayDataset:
    _check_vocab_size(vocab_size)
    _check_seq_len(seq_len)
    root = _locate_csv(name, subdir, data_dir, source)
    train = _read_label_csv(root / "train.csv", num_classes)
    test = _read_label_csv(root / "test.csv", num_classes)
    return _make_text_dataset(name, train, test, num_classes, vocab_size, seq_len)


def load_dbpedia(
    data_dir: str | None = None, vocab_size: int = 20000, seq_len: int = 128
) -> ArrayDataset:
    """DBPedia-14 ontology classification: 560000/70000 texts, 14 classes.

    Files ``train.csv``/``test.csv`` (rows ``class (1..14), title, content``) directly in a
    searched directory or in its ``dbpedia_csv/``. Returns ``x int32 [N, seq_len]``; see
    the module docstring.
    """
    source = _ZHANG_2015.format(url=DBPEDIA_URL)
    return _load_csv_dataset("dbpedia", "dbpedia_csv", 14, source, data_dir, vocab_size, seq_len)


def load_ag_news(
    data_dir: str | None = None, vocab_size: int = 20000, seq_len: int = 128
) -> ArrayDataset:
    """AG News topic classification: 120000/7600 texts, 4 classes.

    Files ``train.csv``/``test.csv`` (rows ``class (1..4), title, description``) directly
    in a searched directory or in its ``ag_news_csv/``.
    """
    source = _ZHANG_2015.format(url=AG_NEWS_URL)
    return _load_csv_dataset("ag_news", "ag_news_csv", 4, source, data_dir, vocab_size, seq_len)


# ----------------------------------------------------------------------------- IMDB


def _is_imdb_root(d: Path) -> bool:
    return all((d / split / lab).is_dir() for split in ("train", "test") for lab in ("pos", "neg"))


def _read_review_dir(directory: Path) -> list[str]:
    """Texts of ``directory/*.txt`` in sorted file-name order, ``<br />`` turned into spaces."""
    return [
        p.read_text(encoding="utf-8").replace("<br />", " ")
        for p in sorted(directory.glob("*.txt"))
    ]


def _read_imdb_split(root: Path) -> tuple[list[str], np.ndarray]:
    """``root/{neg,pos}/*.txt`` -> (texts, labels): negatives (0) first, then positives (1)."""
    neg, pos = _read_review_dir(root / "neg"), _read_review_dir(root / "pos")
    labels = np.concatenate([np.zeros(len(neg), np.int32), np.ones(len(pos), np.int32)])
    return neg + pos, labels


def load_imdb(
    data_dir: str | None = None, vocab_size: int = 20000, seq_len: int = 128
) -> ArrayDataset:
    """IMDB movie-review sentiment (Maas et al. 2011): 25000/25000 reviews, 2 classes.

    Reads the ``aclImdb/{train,test}/{pos,neg}/*.txt`` layout (the ``aclImdb`` folder
    itself, or a searched directory containing it); label ``pos = 1``, ``neg = 0``. When
    ``aclImdb/train/unsup/`` exists its 50000 unlabeled reviews are encoded with the same
    vocabulary into ``side["x_unlabeled"]`` (``int32 [U, seq_len]``).
    """
    _check_vocab_size(vocab_size)
    _check_seq_len(seq_len)
    dirs = search_dirs("imdb", data_dir)
    root = next(
        (c for d in dirs for c in (d, d / "aclImdb") if _is_imdb_root(c)),
        None,
    )
    if root is None:
        raise _not_found(
            "imdb",
            dirs,
            "aclImdb/{train,test}/{pos,neg}/*.txt (the aclImdb folder in one of these, or "
            "one of these being it)",
            f"the Large Movie Review Dataset v1.0 from {IMDB_URL}",
        )
    unsup = root / "train" / "unsup"
    return _make_text_dataset(
        "imdb",
        _read_imdb_split(root / "train"),
        _read_imdb_split(root / "test"),
        num_classes=2,
        vocab_size=vocab_size,
        seq_len=seq_len,
        unlabeled=_read_review_dir(unsup) if unsup.is_dir() else None,
    )
