"""Unit-scaled embedding lookup."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..scale import scale_bwd
from ._checks import reject_unsupported

__all__ = ["embedding"]


def embedding(
    input: Tensor,
    weight: Tensor,
    padding_idx: int | None = None,
    max_norm: float | None = None,
    norm_type: float = 2.0,
    scale_grad_by_freq: bool = False,
    sparse: bool = False,
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.embedding`.

    .. math:: y = W[x], \\qquad \\beta_W = (V / L)^{1/2}

    for ``V = num_embeddings`` and ``L = input.numel()`` lookups. The output is the
    plain lookup (unit weights give unit outputs). Each row of the weight gradient
    sums the gradients of the lookups that hit it, on average ``L / V`` of them,
    hence ``beta_W``. The scale is applied to the weight (weight-sized, cheap).

    Args:
        input: integer indices of any shape.
        weight: ``(num_embeddings, embedding_dim)``.
        padding_idx: an index whose row gets no gradient, as in torch.
        max_norm, norm_type, scale_grad_by_freq, sparse: torch's arguments; only
            their defaults are supported (``norm_type`` only matters with
            ``max_norm``).

    Example::

        >>> y = U.embedding(torch.tensor([[0, 2], [1, 3]]), torch.randn(4, 8))
        >>> y.shape
        torch.Size([2, 2, 8])
    """
    if input.is_floating_point() or input.is_complex() or input.dtype == torch.bool:
        raise TypeError(
            f"U.embedding: input must hold integer indices (int64 or int32), got "
            f"dtype {input.dtype}; convert it with input.long()"
        )
    reject_unsupported(
        "embedding",
        max_norm=(max_norm, None),
        scale_grad_by_freq=(scale_grad_by_freq, False),
        sparse=(sparse, False),
    )
    if weight.dim() != 2:
        raise ValueError(
            "U.embedding: expected weight of shape (num_embeddings, embedding_dim), "
            f"got {tuple(weight.shape)}"
        )
    scale = (weight.shape[0] / max(input.numel(), 1)) ** 0.5
    return F.embedding(input, scale_bwd(weight, scale), padding_idx)
