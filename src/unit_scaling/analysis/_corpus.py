"""The text the analysis views draw their example batches from."""

from __future__ import annotations

from ..data import Corpus

__all__ = ["analysis_corpus"]


def analysis_corpus() -> Corpus:
    """A 1 MiB slice of the bundled corpus: plenty for analysis batches, and
    quick to read.

    Example::

        >>> analysis_corpus().get_batch("train", 2, 8).shape
        torch.Size([2, 9])
    """
    return Corpus(max_bytes=2**20)
