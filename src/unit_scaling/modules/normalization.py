"""Unit-scaled normalisation layers."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .. import functional as U
from ..parameter import Parameter, _KeepsTags

__all__ = ["LayerNorm", "RMSNorm"]


def _tag_affine(module: nn.Module) -> None:
    """Re-tag a norm module's existing affine parameters in place."""
    weight, bias = getattr(module, "weight", None), getattr(module, "bias", None)
    if isinstance(weight, Tensor):
        module.weight = Parameter(weight.data, mup_type="norm")
    if isinstance(bias, Tensor):
        module.bias = Parameter(bias.data, mup_type="bias")


class LayerNorm(_KeepsTags, nn.LayerNorm):
    """Unit-scaled :class:`torch.nn.LayerNorm`: ``y = U.layer_norm(x, ...)``.

    The output of a norm is already unit-scaled; only the affine gradients are
    rescaled. Unlike torch, ``elementwise_affine`` defaults to ``False`` (u-μP
    removes trainable gains by default). Weight tagged ``"norm"``, bias ``"bias"``.

    Example::

        >>> LayerNorm(64)(torch.randn(8, 64)).std().item() > 0.99
        True
    """

    def __init__(
        self,
        normalized_shape: int | tuple[int, ...],
        eps: float = 1e-5,
        elementwise_affine: bool = False,
        bias: bool = True,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(normalized_shape, eps, elementwise_affine, bias, device, dtype)
        _tag_affine(self)

    def forward(self, input: Tensor) -> Tensor:
        return U.layer_norm(
            input, self.normalized_shape, self.weight, self.bias, self.eps
        )


class RMSNorm(_KeepsTags, nn.RMSNorm):
    """Unit-scaled :class:`torch.nn.RMSNorm`: ``y = U.rms_norm(x, ...)``.

    ``elementwise_affine`` defaults to ``False``; when on, the gain is tagged
    ``"norm"`` and its gradient rescaled.

    Example::

        >>> y = RMSNorm(64)(3 * torch.randn(8, 64))
        >>> round(y.pow(2).mean().sqrt().item(), 2)
        1.0
    """

    def __init__(
        self,
        normalized_shape: int | tuple[int, ...],
        eps: float | None = None,
        elementwise_affine: bool = False,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(normalized_shape, eps, elementwise_affine, device, dtype)
        _tag_affine(self)

    def forward(self, input: Tensor) -> Tensor:
        return U.rms_norm(input, self.normalized_shape, self.weight, self.eps)
