"""Unit-scaled convolution layers: ``Conv{1,2,3}d`` and ``ConvTranspose{1,2,3}d``.

Each is its :mod:`torch.nn` counterpart with the weight initialised ``N(0, 1)``
and tagged ``mup_type="weight"`` (the scale lives in the op, not the weight), the
bias (off by default, as for :class:`~unit_scaling.Linear`) zero and tagged
``"bias"``, and ``forward`` calling the ``U.*`` function. Only
``padding_mode="zeros"`` is supported.
"""

from __future__ import annotations

from typing import Any, Literal, cast

import torch
from torch import Tensor, nn

from .. import functional as U
from ._base import CallsFunction, WeightAndBias

__all__ = [
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "ConvTranspose3d",
]


class _ConvNd(WeightAndBias, CallsFunction):
    """What every unit-scaled convolution adds to its ``nn`` base class: only zero
    padding, the tagged ``N(0, 1)`` weight and zero bias, and ``constraint``."""

    def __init__(
        self, padding_mode: str, constraint: str | None, *torch_args: Any
    ) -> None:
        if padding_mode != "zeros":
            raise ValueError(
                f"{type(self).__name__}: padding_mode={padding_mode!r} has not been "
                "implemented; only 'zeros' is supported"
            )
        super().__init__(constraint, *torch_args)
        self._tag_weight_and_bias()


class _Conv(_ConvNd):
    """``Conv{1,2,3}d``: torch's constructor, without a bias by default."""

    _arguments = ("weight", "bias", "stride", "padding", "dilation", "groups")

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, ...],
        stride: int | tuple[int, ...] = 1,
        padding: int | tuple[int, ...] | str = 0,
        dilation: int | tuple[int, ...] = 1,
        groups: int = 1,
        bias: bool = False,
        padding_mode: Literal["zeros"] = "zeros",
        device: Any = None,
        dtype: torch.dtype | None = None,
        constraint: str | None = "to_output_scale",
    ) -> None:
        super().__init__(
            padding_mode,
            constraint,
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


class Conv1d(_Conv, nn.Conv1d):
    """Unit-scaled :class:`torch.nn.Conv1d`: ``y = U.conv1d(x, W, b, ...)``.

    Example::

        >>> conv = Conv1d(16, 32, kernel_size=3, padding=1)
        >>> conv(torch.randn(4, 16, 100)).shape
        torch.Size([4, 32, 100])
    """

    _function = staticmethod(U.conv1d)


class Conv2d(_Conv, nn.Conv2d):
    """Unit-scaled :class:`torch.nn.Conv2d`: ``y = U.conv2d(x, W, b, ...)``.

    Example::

        >>> conv = Conv2d(16, 32, kernel_size=3, padding=1)
        >>> conv(torch.randn(4, 16, 28, 28)).shape
        torch.Size([4, 32, 28, 28])
    """

    _function = staticmethod(U.conv2d)


class Conv3d(_Conv, nn.Conv3d):
    """Unit-scaled :class:`torch.nn.Conv3d`: ``y = U.conv3d(x, W, b, ...)``.

    Example::

        >>> conv = Conv3d(8, 16, kernel_size=3, padding=1)
        >>> conv(torch.randn(2, 8, 10, 10, 10)).shape
        torch.Size([2, 16, 10, 10, 10])
    """

    _function = staticmethod(U.conv3d)


class _ConvTranspose(_ConvNd):
    """``ConvTranspose{1,2,3}d``: torch's constructor, without a bias by default,
    and its ``forward(input, output_size=None)``."""

    # ``U.conv_transpose*d`` then takes output_padding (set by each call's
    # output_size), groups and dilation, which forward passes.
    _arguments = ("weight", "bias", "stride", "padding")
    _spatial_dims: int

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, ...],
        stride: int | tuple[int, ...] = 1,
        padding: int | tuple[int, ...] = 0,
        output_padding: int | tuple[int, ...] = 0,
        groups: int = 1,
        bias: bool = False,
        dilation: int | tuple[int, ...] = 1,
        padding_mode: Literal["zeros"] = "zeros",
        device: Any = None,
        dtype: torch.dtype | None = None,
        constraint: str | None = "to_output_scale",
    ) -> None:
        super().__init__(
            padding_mode,
            constraint,
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
        return cast(
            Tensor, self._call(input, output_padding, self.groups, self.dilation)
        )


class ConvTranspose1d(_ConvTranspose, nn.ConvTranspose1d):
    """Unit-scaled :class:`torch.nn.ConvTranspose1d`: ``U.conv_transpose1d``.

    Example::

        >>> up = ConvTranspose1d(32, 16, kernel_size=4, stride=2, padding=1)
        >>> up(torch.randn(4, 32, 50)).shape
        torch.Size([4, 16, 100])
    """

    _function = staticmethod(U.conv_transpose1d)
    _spatial_dims = 1


class ConvTranspose2d(_ConvTranspose, nn.ConvTranspose2d):
    """Unit-scaled :class:`torch.nn.ConvTranspose2d`: ``U.conv_transpose2d``.

    Example::

        >>> up = ConvTranspose2d(32, 16, kernel_size=4, stride=2, padding=1)
        >>> up(torch.randn(4, 32, 14, 14)).shape
        torch.Size([4, 16, 28, 28])
    """

    _function = staticmethod(U.conv_transpose2d)
    _spatial_dims = 2


class ConvTranspose3d(_ConvTranspose, nn.ConvTranspose3d):
    """Unit-scaled :class:`torch.nn.ConvTranspose3d`: ``U.conv_transpose3d``.

    Example::

        >>> up = ConvTranspose3d(16, 8, kernel_size=2, stride=2)
        >>> up(torch.randn(2, 16, 5, 5, 5)).shape
        torch.Size([2, 8, 10, 10, 10])
    """

    _function = staticmethod(U.conv_transpose3d)
    _spatial_dims = 3
