"""Tests for the built-in byte-level corpus."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from unit_scaling.data import (
    SPLITS,
    VOCAB_SIZE,
    Corpus,
    batches,
    decode,
    encode,
    get_batch,
)

SMALL = 2**18


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return Corpus(max_bytes=SMALL)


def test_splits_are_uint8_and_fill_the_budget(corpus: Corpus) -> None:
    assert VOCAB_SIZE == 256
    assert corpus.train.dtype == torch.uint8 and corpus.train.dim() == 1
    assert corpus.validation.dtype == torch.uint8 and corpus.validation.dim() == 1
    assert corpus.validation.numel() == round(SMALL * 0.1)
    assert corpus.train.numel() + corpus.validation.numel() == SMALL
    assert corpus.tokens("train") is corpus.train


def test_split_files_are_disjoint_sorted_and_python(corpus: Corpus) -> None:
    train, validation = corpus.files("train"), corpus.files("validation")
    assert train and validation
    assert not set(train) & set(validation)
    assert list(train) == sorted(train) and list(validation) == sorted(validation)
    for name in train + validation:
        assert name.endswith(".py")
        assert "site-packages" not in name.split("/")


def test_split_is_by_stable_path_hash_independent_of_budget() -> None:
    small, large = Corpus(max_bytes=2**16), Corpus(max_bytes=2**20)
    for split in SPLITS:
        other = {"train": "validation", "validation": "train"}[split]
        assert not set(small.files(split)) & set(large.files(other))


def test_corpus_is_deterministic_and_cached(corpus: Corpus) -> None:
    again = Corpus(max_bytes=SMALL)
    assert torch.equal(again.train, corpus.train)
    assert again.train is corpus.train  # read once per process
    a = corpus.get_batch("train", 4, 32, generator=123)
    b = again.get_batch("train", 4, 32, generator=torch.Generator().manual_seed(123))
    assert torch.equal(a, b)
    assert not torch.equal(a, corpus.get_batch("train", 4, 32, generator=124))


def test_custom_root_truncates_the_last_file(tmp_path: Path) -> None:
    for name in ("a.py", "b.py", "c.py", "notes.txt"):
        (tmp_path / name).write_bytes(name.encode() * 100)  # 400 bytes each
    (tmp_path / "site-packages").mkdir()
    (tmp_path / "site-packages" / "x.py").write_text("ignored")
    corpus = Corpus(max_bytes=1000, validation_fraction=0.5, root=tmp_path)
    # the path hash puts b.py in validation; each split's budget is 500 bytes
    assert corpus.files("train") == ("a.py", "c.py")
    assert corpus.files("validation") == ("b.py",)
    assert bytes(corpus.train.tolist()) == b"a.py" * 100 + b"c.py" * 25
    assert bytes(corpus.validation.tolist()) == b"b.py" * 100


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize(("batch_size", "seq_len"), [(1, 1), (3, 17), (8, 64)])
def test_batch_shape_dtype_range(
    corpus: Corpus, split: str, batch_size: int, seq_len: int
) -> None:
    batch = corpus.get_batch(split, batch_size, seq_len, generator=0)
    assert batch.shape == (batch_size, seq_len + 1)
    assert batch.dtype == torch.long
    assert int(batch.min()) >= 0 and int(batch.max()) < VOCAB_SIZE


def test_targets_are_inputs_shifted_by_one(corpus: Corpus) -> None:
    batch = corpus.get_batch("train", 4, 16, generator=0)
    inputs, targets = batch[:, :-1], batch[:, 1:]
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    # each row is a contiguous window of the split
    data = corpus.train.long()
    for row in batch:
        windows = data.unfold(0, row.numel(), 1)
        assert (windows == row).all(dim=1).any()


def test_batches_stream_is_deterministic(corpus: Corpus) -> None:
    first = list(itertools.islice(corpus.batches("validation", 2, 8, seed=5), 3))
    second = list(itertools.islice(corpus.batches("validation", 2, 8, seed=5), 3))
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(first[0], first[1])


def test_module_level_helpers_use_the_default_corpus() -> None:
    batch = get_batch("train", 2, 8, generator=0)
    assert torch.equal(batch, Corpus().get_batch("train", 2, 8, generator=0))
    assert torch.equal(next(batches("train", 2, 8, seed=0)), batch)


def test_device_argument(corpus: Corpus) -> None:
    assert corpus.get_batch("train", 1, 4, 0, device="cpu").device.type == "cpu"


def test_decode_round_trip() -> None:
    text = "def f(x):\n    return x * 2  # héllo ✓\n"
    tokens = encode(text)
    assert tokens.dtype == torch.long
    assert decode(tokens) == text
    assert decode(tokens.tolist()) == text
    assert decode(encode("")) == ""
    assert decode([0xFF]) == "\ufffd"  # invalid UTF-8 is replaced, not raised


def test_decode_of_a_batch_row_is_source(corpus: Corpus) -> None:
    # Each row is a window of the training text: decoded, it is found there
    # (trimmed of characters the window cut in half, decoded as U+FFFD).
    source = decode(corpus.train)
    for row in corpus.get_batch("train", 4, 200, generator=0):
        text = decode(row).strip("\ufffd")
        assert len(text) > 100
        assert text in source


def test_errors(corpus: Corpus, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown split 'test'"):
        corpus.get_batch("test", 1, 8)
    with pytest.raises(ValueError, match="unknown split"):
        corpus.files("valid")
    with pytest.raises(ValueError, match="batch_size must be positive"):
        corpus.get_batch("train", 0, 8)
    with pytest.raises(ValueError, match="seq_len must be positive"):
        corpus.get_batch("train", 1, -1)
    with pytest.raises(ValueError, match="seq_len must be positive"):
        corpus.batches("train", 1, 0)
    with pytest.raises(TypeError, match="seq_len must be an int"):
        corpus.get_batch("train", 1, 8.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="too long for the 'validation' split"):
        corpus.get_batch("validation", 1, corpus.validation.numel())
    with pytest.raises(TypeError, match="generator must be"):
        corpus.get_batch("train", 1, 8, generator="0")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_bytes must be positive"):
        Corpus(max_bytes=0)
    with pytest.raises(ValueError, match="validation_fraction"):
        Corpus(validation_fraction=1.0)
    with pytest.raises(ValueError, match=r"no \.py files"):
        _ = Corpus(root=tmp_path).train
    with pytest.raises(ValueError, match="1-D"):
        decode(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"byte values in \[0, 256\)"):
        decode([256])
