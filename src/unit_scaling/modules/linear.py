"""Unit-scaled linear layers (the convolutions are in :mod:`.conv`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .. import functional as U
from ..constraints import validate_constraint
from ..parameter import MupType, Parameter
from ._base import KeepsTags, check_sizes

__all__ = ["Linear", "LinearReadout"]


class Linear(KeepsTags, nn.Linear):
    """Unit-scaled :class:`torch.nn.Linear`: ``y = U.linear(x, W, b)``.

    The weight is initialised ``N(0, 1)`` (the scale lives in the op, not the
    weight) and tagged ``mup_type="weight"``; the bias, off by default, is zero and
    tagged ``"bias"``.

    Args:
        in_features, out_features, bias, device, dtype: as for ``nn.Linear``.
        constraint: see :func:`unit_scaling.functional.linear`.
        weight_mup_type: the u-μP role of the weight.

    Example::

        >>> layer = Linear(256, 512)
        >>> layer(torch.randn(8, 256)).shape
        torch.Size([8, 512])
    """

    weight: Parameter

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        device: Any = None,
        dtype: torch.dtype | None = None,
        constraint: str | None = "to_output_scale",
        weight_mup_type: MupType = "weight",
    ) -> None:
        validate_constraint(constraint)
        check_sizes(
            type(self).__name__, in_features=in_features, out_features=out_features
        )
        super().__init__(in_features, out_features, bias, device, dtype)
        self.weight = Parameter(self.weight.data, mup_type=weight_mup_type)
        if self.bias is not None:
            self.bias = Parameter(self.bias.data, mup_type="bias")
        self.constraint = constraint

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, input: Tensor) -> Tensor:
        return U.linear(input, self.weight, self.bias, self.constraint)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, constraint={self.constraint!r}"


class LinearReadout(Linear):
    """Unit-scaled final (readout) layer: ``y = U.linear_readout(x, W, b)``.

    Scales the output by ``1 / fan_in`` (μP's readout rule), is unconstrained by
    default, and tags its weight ``mup_type="output"``.

    Example::

        >>> head = LinearReadout(256, 1000)
        >>> head.weight.mup_type
        'output'
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        device: Any = None,
        dtype: torch.dtype | None = None,
        constraint: str | None = None,
        weight_mup_type: MupType = "output",
    ) -> None:
        super().__init__(
            in_features, out_features, bias, device, dtype, constraint, weight_mup_type
        )

    def forward(self, input: Tensor) -> Tensor:
        return U.linear_readout(input, self.weight, self.bias, self.constraint)
