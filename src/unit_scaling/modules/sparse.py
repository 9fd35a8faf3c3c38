"""Unit-scaled embedding layer."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .. import functional as U
from ..functional._checks import reject_unsupported
from ..parameter import Parameter
from ._base import KeepsTags, check_sizes

__all__ = ["Embedding"]


class Embedding(KeepsTags, nn.Embedding):
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
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        sparse: bool = False,
        _weight: Tensor | None = None,
        _freeze: bool = False,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        reject_unsupported(
            "Embedding",
            max_norm=(max_norm, None),
            norm_type=(norm_type, 2.0),
            scale_grad_by_freq=(scale_grad_by_freq, False),
            sparse=(sparse, False),
        )
        check_sizes(
            "Embedding", num_embeddings=num_embeddings, embedding_dim=embedding_dim
        )
        super().__init__(
            num_embeddings,
            embedding_dim,
            padding_idx,
            _weight=_weight,
            _freeze=_freeze,
            device=device,
            dtype=dtype,
        )
        self.weight = Parameter(
            self.weight.data, mup_type="weight", requires_grad=not _freeze
        )

    def forward(self, input: Tensor) -> Tensor:
        return U.embedding(input, self.weight, self.padding_idx)
