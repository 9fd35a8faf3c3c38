"""Unit-scaled linear and convolution layers."""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor, nn

from .. import functional as U
from ..constraints import validate_constraint
from ..parameter import MupType, Parameter, _KeepsTags

__all__ = ["Conv1d", "Linear", "LinearReadout"]


class Linear(_KeepsTags, nn.Linear):
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


class Conv1d(_KeepsTags, nn.Conv1d):
    """Unit-scaled :class:`torch.nn.Conv1d`: ``y = U.conv1d(x, W, b, ...)``.

    Weight ``N(0, 1)`` tagged ``"weight"``; bias (off by default) zero, ``"bias"``.
    Only ``padding_mode="zeros"`` is supported.

    Example::

        >>> conv = Conv1d(16, 32, kernel_size=3, padding=1)
        >>> conv(torch.randn(4, 16, 100)).shape
        torch.Size([4, 32, 100])
    """

    weight: Parameter

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        padding: int | str = 0,
        dilation: int = 1,
        groups: int = 1,
        bias: bool = False,
        padding_mode: Literal["zeros"] = "zeros",
        device: Any = None,
        dtype: torch.dtype | None = None,
        constraint: str | None = "to_output_scale",
    ) -> None:
        if padding_mode != "zeros":
            raise ValueError(
                f"Conv1d: padding_mode={padding_mode!r} has not been implemented; "
                "only 'zeros' is supported"
            )
        validate_constraint(constraint)
        super().__init__(
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding,
            dilation,
            groups,
            bias,
            padding_mode,
            device,
            dtype,
        )
        self.weight = Parameter(self.weight.data, mup_type="weight")
        if self.bias is not None:
            self.bias = Parameter(self.bias.data, mup_type="bias")
        self.constraint = constraint

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, input: Tensor) -> Tensor:
        return U.conv1d(
            input,
            self.weight,
            self.bias,
            self.stride,
            self.padding,
            self.dilation,
            self.groups,
            constraint=self.constraint,
        )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, constraint={self.constraint!r}"  # type: ignore[no-untyped-call]
