"""Unit-scaled linear layers (the convolutions are in :mod:`.conv`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .. import functional as U
from ..parameter import MupType, Parameter
from ._base import CallsFunction, WeightAndBias, check_sizes

__all__ = ["Linear", "LinearReadout"]


class Linear(WeightAndBias, CallsFunction, nn.Linear):
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
    _function: staticmethod[..., Tensor] = staticmethod(U.linear)
    _arguments = ("weight", "bias", "constraint")
    _keywords = ()

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
        check_sizes(
            type(self).__name__, in_features=in_features, out_features=out_features
        )
        super().__init__(constraint, in_features, out_features, bias, device, dtype)
        self._tag_weight_and_bias(weight_mup_type)


class LinearReadout(Linear):
    """Unit-scaled final (readout) layer: ``y = U.linear_readout(x, W, b)``.

    Scales the output by ``1 / fan_in`` (μP's readout rule), is unconstrained by
    default, and tags its weight ``mup_type="output"``.

    Example::

        >>> head = LinearReadout(256, 1000)
        >>> head.weight.mup_type
        'output'
    """

    _function = staticmethod(U.linear_readout)

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
