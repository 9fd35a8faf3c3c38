"""Unit-scaled embedding layer."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .. import functional as U
from ..parameter import Parameter

__all__ = ["Embedding"]


class Embedding(nn.Embedding):
    """Unit-scaled :class:`torch.nn.Embedding`.

    The table is ``N(0, 1)`` (torch's default) and tagged ``mup_type="weight"``;
    its gradient is rescaled by :func:`unit_scaling.functional.embedding`.
    ``max_norm``, ``scale_grad_by_freq`` and ``sparse`` are not supported.

    Example::

        >>> emb = Embedding(256, 64)
        >>> emb(torch.tensor([[1, 2, 3]])).shape
        torch.Size([1, 3, 64])
    """

    weight: Parameter

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: int | None = None,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            num_embeddings, embedding_dim, padding_idx, device=device, dtype=dtype
        )
        self.weight = Parameter(self.weight.data, mup_type="weight")

    def forward(self, input: Tensor) -> Tensor:
        return U.embedding(input, self.weight, self.padding_idx)
