"""A built-in byte-level text corpus that needs no download.

The corpus is the Python standard library's own ``.py`` source, read from
``sysconfig.get_paths()["stdlib"]``, which every Python installation has. Tokens
are raw bytes, so the vocabulary is ``VOCAB_SIZE = 256`` and no tokenizer is needed.

Determinism:

* files are read in sorted order of their ``/``-separated path relative to the
  standard library root, and only the first ``max_bytes`` bytes are kept;
* each file belongs to exactly one split, chosen by a stable hash (SHA-256) of its
  relative path, so no file is in both ``"train"`` and ``"validation"``;
* batches come from a ``torch.Generator`` (or an integer seed), so a fixed seed
  gives the same batches on every machine.

The *contents* depend on the Python version (and, slightly, on the distribution,
which may patch a few modules): two machines with the same Python build get the same
tokens. Directories that distributions often split out or that hold third-party
code (``site-packages``, ``test``, ``tkinter``, ``idlelib``, ...) are skipped.

Loading is lazy (on first access to a split) and cached in-process, so building
several :class:`Corpus` objects with the same settings reads the files once.

Example::

    >>> from unit_scaling.data import Corpus, decode
    >>> corpus = Corpus()
    >>> batch = corpus.get_batch("train", batch_size=8, seq_len=64, generator=0)
    >>> inputs, targets = batch[:, :-1], batch[:, 1:]
    >>> inputs.shape, targets.shape
    (torch.Size([8, 64]), torch.Size([8, 64]))
    >>> text = decode(batch[0])  # a snippet of standard-library source
"""

from __future__ import annotations

import functools
import hashlib
import os
import sysconfig
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor

__all__ = [
    "DEFAULT_MAX_BYTES",
    "SPLITS",
    "VOCAB_SIZE",
    "Corpus",
    "batches",
    "decode",
    "encode",
    "get_batch",
]

VOCAB_SIZE = 256
"""Tokens are bytes: the vocabulary has 256 entries."""
SPLITS = ("train", "validation")
"""The corpus's splits, as :meth:`Corpus.get_batch` names them."""
DEFAULT_MAX_BYTES = 4 * 2**20
"""How many bytes of source a :class:`Corpus` reads by default (4 MiB)."""

# Third-party code, generated per-machine files, tests with odd encodings, and
# packages that distributions ship separately: skipping them keeps the corpus the
# same across installations of one Python version.
_SKIPPED_DIRS = frozenset(
    {
        "__pycache__",
        "site-packages",
        "dist-packages",
        "test",
        "tests",
        "idle_test",
        "idlelib",
        "tkinter",
        "turtledemo",
        "lib2to3",
        "distutils",
        "ensurepip",
        "lib-dynload",
    }
)
_SKIPPED_FILE_PREFIXES = ("_sysconfigdata",)


class _Splits(NamedTuple):
    train: Tensor
    validation: Tensor
    train_files: tuple[str, ...]
    validation_files: tuple[str, ...]


def _source_files(root: Path) -> list[str]:
    """Relative ``/``-separated paths of the ``.py`` files under ``root``, sorted."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [
            d
            for d in dirnames
            if d not in _SKIPPED_DIRS and not d.startswith("config-")
        ]
        for name in filenames:
            if name.endswith(".py") and not name.startswith(_SKIPPED_FILE_PREFIXES):
                found.append(Path(dirpath, name).relative_to(root).as_posix())
    return sorted(found)


def _is_validation(relative_path: str, validation_fraction: float) -> bool:
    # A cryptographic hash is stable across processes and platforms (unlike hash()).
    digest = hashlib.sha256(relative_path.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < validation_fraction


@functools.lru_cache(maxsize=8)
def _load(root: Path, max_bytes: int, validation_fraction: float) -> _Splits:
    files = _source_files(root)
    if not files:
        raise ValueError(f"no .py files found under {str(root)!r}")
    budget = {"validation": round(max_bytes * validation_fraction)}
    budget["train"] = max_bytes - budget["validation"]
    chunks: dict[str, list[bytes]] = {"train": [], "validation": []}
    names: dict[str, list[str]] = {"train": [], "validation": []}
    for relative_path in files:
        split = (
            "validation"
            if _is_validation(relative_path, validation_fraction)
            else "train"
        )
        if budget[split] <= 0:
            if budget["train"] <= 0 and budget["validation"] <= 0:
                break
            continue
        with open(root / relative_path, "rb") as f:
            content = f.read(budget[split])
        budget[split] -= len(content)
        chunks[split].append(content)
        names[split].append(relative_path)

    def as_tensor(parts: list[bytes]) -> Tensor:
        joined = bytearray(b"".join(parts))
        if not joined:
            return torch.empty(0, dtype=torch.uint8, device="cpu")
        # clone: the tensor owns its memory instead of borrowing the bytearray's
        return torch.frombuffer(joined, dtype=torch.uint8).clone()

    return _Splits(
        as_tensor(chunks["train"]),
        as_tensor(chunks["validation"]),
        tuple(names["train"]),
        tuple(names["validation"]),
    )


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")


def _check_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")


def _as_generator(generator: torch.Generator | int | None) -> torch.Generator | None:
    if isinstance(generator, int) and not isinstance(generator, bool):
        return torch.Generator(device="cpu").manual_seed(generator)
    if generator is None or isinstance(generator, torch.Generator):
        return generator
    raise TypeError(
        "generator must be a torch.Generator, an int seed or None, "
        f"got {type(generator).__name__}"
    )


class Corpus:
    """Byte tokens of the Python standard library's source, split by file.

    Args:
        max_bytes: total number of bytes (tokens) to read, shared between the splits
            in proportion to ``validation_fraction``. Default: 4 MiB.
        validation_fraction: the fraction of files (and of ``max_bytes``) held out
            for validation, strictly between 0 and 1. Default: 0.1.
        root: directory to read ``.py`` files from. Default: the standard library.

    Both splits are 1-D ``torch.uint8`` tensors, loaded on first use and cached per
    process (shared by every :class:`Corpus` with the same arguments: do not modify
    them in place).

    Example::

        >>> corpus = Corpus(max_bytes=2**20)
        >>> corpus.train.dtype, corpus.train.numel() + corpus.validation.numel()
        (torch.uint8, 1048576)
    """

    def __init__(
        self,
        max_bytes: int = DEFAULT_MAX_BYTES,
        validation_fraction: float = 0.1,
        root: str | os.PathLike[str] | None = None,
    ) -> None:
        _check_positive("max_bytes", max_bytes)
        if not 0 < validation_fraction < 1:
            raise ValueError(
                "validation_fraction must be strictly between 0 and 1, "
                f"got {validation_fraction}"
            )
        self.max_bytes = max_bytes
        self.validation_fraction = float(validation_fraction)
        self.root = Path(sysconfig.get_paths()["stdlib"] if root is None else root)

    def __repr__(self) -> str:
        return (
            f"Corpus(max_bytes={self.max_bytes}, "
            f"validation_fraction={self.validation_fraction}, root={str(self.root)!r})"
        )

    def _splits(self) -> _Splits:
        return _load(self.root, self.max_bytes, self.validation_fraction)

    @property
    def train(self) -> Tensor:
        """The training tokens, a 1-D ``torch.uint8`` tensor."""
        return self._splits().train

    @property
    def validation(self) -> Tensor:
        """The validation tokens, a 1-D ``torch.uint8`` tensor."""
        return self._splits().validation

    def tokens(self, split: str) -> Tensor:
        """The tokens of ``split`` (``"train"`` or ``"validation"``)."""
        _check_split(split)
        return self.train if split == "train" else self.validation

    def files(self, split: str) -> tuple[str, ...]:
        """Relative paths of the files read into ``split``, in reading order."""
        _check_split(split)
        splits = self._splits()
        return splits.train_files if split == "train" else splits.validation_files

    def get_batch(
        self,
        split: str,
        batch_size: int,
        seq_len: int,
        generator: torch.Generator | int | None = None,
        *,
        device: torch.device | str | None = None,
    ) -> Tensor:
        """Sample ``batch_size`` random windows of ``seq_len + 1`` tokens.

        One tensor holds both the inputs and the next-token targets: for
        ``batch = get_batch(...)``, the inputs are ``batch[:, :-1]`` and the targets
        ``batch[:, 1:]`` (each of shape ``[batch_size, seq_len]``).

        Args:
            split: ``"train"`` or ``"validation"``.
            batch_size: number of windows.
            seq_len: number of input tokens per window (the window holds one more).
            generator: a ``torch.Generator``, an integer seed, or ``None`` for
                torch's global random number generator.
            device: where to put the batch. Default: CPU.

        Returns:
            A ``torch.long`` tensor of shape ``[batch_size, seq_len + 1]`` with
            values in ``[0, VOCAB_SIZE)``.

        Example::

            >>> batch = Corpus().get_batch("validation", 4, 32, generator=1)
            >>> batch.shape, batch.dtype
            (torch.Size([4, 33]), torch.int64)
        """
        _check_split(split)
        _check_positive("batch_size", batch_size)
        _check_positive("seq_len", seq_len)
        data = self.tokens(split)
        if data.numel() < seq_len + 1:
            raise ValueError(
                f"seq_len={seq_len} is too long for the {split!r} split "
                f"({data.numel()} tokens; a window needs seq_len + 1): "
                "use a shorter seq_len or a larger max_bytes"
            )
        starts = torch.randint(
            data.numel() - seq_len,
            (batch_size,),
            generator=_as_generator(generator),
            device=data.device,
        )
        windows = data[starts[:, None] + torch.arange(seq_len + 1, device=data.device)]
        return windows.to(device=device, dtype=torch.long)

    def batches(
        self,
        split: str,
        batch_size: int,
        seq_len: int,
        seed: int = 0,
        *,
        device: torch.device | str | None = None,
    ) -> Iterator[Tensor]:
        """An endless, deterministic stream of :meth:`get_batch` results.

        The stream owns one generator seeded with ``seed``, so two streams with the
        same arguments yield the same batches in the same order.

        Example::

            >>> stream = Corpus().batches("train", batch_size=2, seq_len=16, seed=0)
            >>> next(stream).shape
            torch.Size([2, 17])
        """
        _check_split(split)
        _check_positive("batch_size", batch_size)
        _check_positive("seq_len", seq_len)
        generator = torch.Generator(device="cpu").manual_seed(seed)
        return self._stream(split, batch_size, seq_len, generator, device)

    def _stream(
        self,
        split: str,
        batch_size: int,
        seq_len: int,
        generator: torch.Generator,
        device: torch.device | str | None,
    ) -> Iterator[Tensor]:
        while True:
            yield self.get_batch(split, batch_size, seq_len, generator, device=device)


@functools.lru_cache(maxsize=1)
def _default_corpus() -> Corpus:
    return Corpus()


def get_batch(
    split: str,
    batch_size: int,
    seq_len: int,
    generator: torch.Generator | int | None = None,
    *,
    device: torch.device | str | None = None,
) -> Tensor:
    """:meth:`Corpus.get_batch` on the default :class:`Corpus`.

    Example::

        >>> get_batch("train", 2, 8, generator=0).shape
        torch.Size([2, 9])
    """
    return _default_corpus().get_batch(
        split, batch_size, seq_len, generator, device=device
    )


def batches(
    split: str,
    batch_size: int,
    seq_len: int,
    seed: int = 0,
    *,
    device: torch.device | str | None = None,
) -> Iterator[Tensor]:
    """:meth:`Corpus.batches` on the default :class:`Corpus`.

    Example::

        >>> batch = next(batches("train", 2, 8))
        >>> inputs, targets = batch[:, :-1], batch[:, 1:]
    """
    return _default_corpus().batches(split, batch_size, seq_len, seed, device=device)


def encode(text: str) -> Tensor:
    """The UTF-8 bytes of ``text`` as a 1-D ``torch.long`` tensor of tokens.

    Example::

        >>> encode("hi")
        tensor([104, 105])
    """
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long, device="cpu")


def decode(tokens: Tensor | Sequence[int]) -> str:
    """Turn a 1-D sequence of byte tokens back into text.

    Invalid UTF-8 (e.g. a window that starts inside a multi-byte character) is
    replaced with ``U+FFFD`` rather than raising.

    Example::

        >>> decode(encode("print('hi')"))
        "print('hi')"
    """
    if isinstance(tokens, Tensor) and tokens.dim() != 1:
        raise ValueError(
            f"decode expects a 1-D sequence of tokens, got shape {tuple(tokens.shape)}"
            "; decode one row at a time, e.g. decode(batch[0])"
        )
    values = tokens.tolist() if isinstance(tokens, Tensor) else list(tokens)
    if any(not isinstance(v, int) or not 0 <= v < VOCAB_SIZE for v in values):
        raise ValueError(f"tokens must be byte values in [0, {VOCAB_SIZE})")
    return bytes(values).decode("utf-8", errors="replace")
