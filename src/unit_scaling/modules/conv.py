"""Unit-scaled convolution layers: ``Conv{1,2,3}d`` and ``ConvTranspose{1,2,3}d``.

Each is its :mod:`torch.nn` counterpart with the weight initialised ``N(0, 1)``
and tagged ``mup_type="weight"`` (the scale lives in the op, not the weight), the
bias (off by default, as for :class:`~unit_scaling.Linear`) zero and tagged
``"bias"``, and ``forward`` calling the ``U.*`` function. Only
``padding_mode="zeros"`` is supported.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor, nn

from .. import functional as U
from .._torch_internals import size_1_t, size_2_t, size_3_t
from ..constraints import validate_constraint
from ..parameter import Parameter
from ._base import KeepsTags

__all__ = [
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "ConvTranspose3d",
]


class _UnitConv(KeepsTags):
    """What every unit-scaled convolution adds to its ``nn`` base class."""

    weight: Tensor
    bias: Tensor | None
    constraint: str | None

    @staticmethod
    def _check(name: str, padding_mode: str, constraint: str | None) -> None:
        if padding_mode != "zeros":
            raise ValueError(
                f"{name}: padding_mode={padding_mode!r} has not been implemented; "
                "only 'zeros' is supported"
            )
        validate_constraint(constraint)

    def _tag(self, constraint: str | None) -> None:
        self.weight = Parameter(self.weight.data, mup_type="weight")
        if self.bias is not None:
            self.bias = Parameter(self.bias.data, mup_type="bias")
        self.constraint = constraint

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, constraint={self.constraint!r}"


class Conv1d(_UnitConv, nn.Conv1d):
    """Unit-scaled :class:`torch.nn.Conv1d`: ``y = U.conv1d(x, W, b, ...)``.

    Example::

        >>> conv = Conv1d(16, 32, kernel_size=3, padding=1)
        >>> conv(torch.randn(4, 16, 100)).shape
        torch.Size([4, 32, 100])
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: size_1_t,
        stride: size_1_t = 1,
        padding: size_1_t | str = 0,
        dilation: size_1_t = 1,
        groups: int = 1,
        bias: bool = False,
        padding_mode: Literal["zeros"] = "zeros",
        device: Any = None,
        dtype: torch.dtype | None = None,
        constraint: str | None = "to_output_scale",
    ) -> None:
        self._check("Conv1d", padding_mode, constraint)
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
        self._tag(constraint)

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


class Conv2d(_UnitConv, nn.Conv2d):
    """Unit-scaled :class:`torch.nn.Conv2d`: ``y = U.conv2d(x, W, b, ...)``.

    Example::

        >>> conv = Conv2d(16, 32, kernel_size=3, padding=1)
        >>> conv(torch.randn(4, 16, 28, 28)).shape
        torch.Size([4, 32, 28, 28])
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: size_2_t,
        stride: size_2_t = 1,
        padding: size_2_t | str = 0,
        dilation: size_2_t = 1,
        groups: int = 1,
        bias: bool = False,
        padding_mode: Literal["zeros"] = "zeros",
        device: Any = None,
        dtype: torch.dtype | None = None,
        constraint: str | None = "to_output_scale",
    ) -> None:
        self._check("Conv2d", padding_mode, constraint)
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
        self._tag(constraint)

    def forward(self, input: Tensor) -> Tensor:
        return U.conv2d(
            input,
            self.weight,
            self.bias,
            self.stride,
            self.padding,
            self.dilation,
            self.groups,
            constraint=self.constraint,
        )


class Conv3d(_UnitConv, nn.Conv3d):
    """Unit-scaled :class:`torch.nn.Conv3d`: ``y = U.conv3d(x, W, b, ...)``.

    Example::

        >>> conv = Conv3d(8, 16, kernel_size=3, padding=1)
        >>> conv(torch.randn(2, 8, 10, 10, 10)).shape
        torch.Size([2, 16, 10, 10, 10])
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: size_3_t,
        stride: size_3_t = 1,
        padding: size_3_t | str = 0,
        dilation: size_3_t = 1,
        groups: int = 1,
        bias: bool = False,
        padding_mode: Literal["zeros"] = "zeros",
        device: Any = None,
        dtype: torch.dtype | None = None,
        constraint: str | None = "to_output_scale",
    ) -> None:
        self._check("Conv3d", padding_mode, constraint)
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
        self._tag(constraint)

    def forward(self, input: Tensor) -> Tensor:
        return U.conv3d(
            input,
            self.weight,
            self.bias,
            self.stride,
            self.padding,
            self.dilation,
            self.groups,
            constraint=self.constraint,
        )


class _UnitConvTranspose(_UnitConv):
    """``forward(input, output_size=None)`` as torch's, on a ``U`` function."""

    _function: staticmethod[..., Tensor]
    _spatial_dims: int

    def forward(self, input: Tensor, output_size: list[int] | None = None) -> Tensor:
        output_padding = self._output_padding(  # type: ignore[operator]
            input,
            output_size,
            self.stride,
            self.padding,
            self.kernel_size,
            self._spatial_dims,
            self.dilation,
        )
        return self._function(
            input,
            self.weight,
            self.bias,
            self.stride,
            self.padding,
            output_padding,
            self.groups,
            self.dilation,
            constraint=self.constraint,
        )


class ConvTranspose1d(_UnitConvTranspose, nn.ConvTranspose1d):
    """Unit-scaled :class:`torch.nn.ConvTranspose1d`: ``U.conv_transpose1d``.

    Example::

        >>> up = ConvTranspose1d(32, 16, kernel_size=4, stride=2, padding=1)
        >>> up(torch.randn(4, 32, 50)).shape
        torch.Size([4, 16, 100])
    """

    _function = staticmethod(U.conv_transpose1d)
    _spatial_dims = 1

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: size_1_t,
        stride: size_1_t = 1,
        padding: size_1_t = 0,
        output_padding: size_1_t = 0,
        groups: int = 1,
        bias: bool = False,
        dilation: size_1_t = 1,
        padding_mode: Literal["zeros"] = "zeros",
        device: Any = None,
        dtype: torch.dtype | None = None,
        constraint: str | None = "to_output_scale",
    ) -> None:
        self._check("ConvTranspose1d", padding_mode, constraint)
        super().__init__(
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding,
            output_padding,
            groups,
            bias,
            dilation,
            padding_mode,
            device,
            dtype,
        )
        self._tag(constraint)


class ConvTranspose2d(_UnitConvTranspose, nn.ConvTranspose2d):
    """Unit-scaled :class:`torch.nn.ConvTranspose2d`: ``U.conv_transpose2d``.

    Example::

        >>> up = ConvTranspose2d(32, 16, kernel_size=4, stride=2, padding=1)
        >>> up(torch.randn(4, 32, 14, 14)).shape
        torch.Size([4, 16, 28, 28])
    """

    _function = staticmethod(U.conv_transpose2d)
    _spatial_dims = 2

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: size_2_t,
        stride: size_2_t = 1,
        padding: size_2_t = 0,
        output_padding: size_2_t = 0,
        groups: int = 1,
        bias: bool = False,
        dilation: size_2_t = 1,
        padding_mode: Literal["zeros"] = "zeros",
        device: Any = None,
        dtype: torch.dtype | None = None,
        constraint: str | None = "to_output_scale",
    ) -> None:
        self._check("ConvTranspose2d", padding_mode, constraint)
        super().__init__(
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding,
            output_padding,
            groups,
            bias,
            dilation,
            padding_mode,
            device,
            dtype,
        )
        self._tag(constraint)


class ConvTranspose3d(_UnitConvTranspose, nn.ConvTranspose3d):
    """Unit-scaled :class:`torch.nn.ConvTranspose3d`: ``U.conv_transpose3d``.

    Example::

        >>> up = ConvTranspose3d(16, 8, kernel_size=2, stride=2)
        >>> up(torch.randn(2, 16, 5, 5, 5)).shape
        torch.Size([2, 8, 10, 10, 10])
    """

    _function = staticmethod(U.conv_transpose3d)
    _spatial_dims = 3

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: size_3_t,
        stride: size_3_t = 1,
        padding: size_3_t = 0,
        output_padding: size_3_t = 0,
        groups: int = 1,
        bias: bool = False,
        dilation: size_3_t = 1,
        padding_mode: Literal["zeros"] = "zeros",
        device: Any = None,
        dtype: torch.dtype | None = None,
        constraint: str | None = "to_output_scale",
    ) -> None:
        self._check("ConvTranspose3d", padding_mode, constraint)
        super().__init__(
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding,
            output_padding,
            groups,
            bias,
            dilation,
            padding_mode,
            device,
            dtype,
        )
        self._tag(constraint)
