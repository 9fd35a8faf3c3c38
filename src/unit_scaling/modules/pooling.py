"""Unit-scaled pooling layers: average, max and adaptive, in 1, 2 and 3 dims.

Each takes its :mod:`torch.nn` counterpart's arguments plus ``constraint``, and
calls the ``U.*`` function (see :mod:`unit_scaling.functional.pooling` for the
scales). They hold no parameters.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .. import functional as U
from ._base import CallsFunction

__all__ = [
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "AdaptiveAvgPool3d",
    "AdaptiveMaxPool1d",
    "AdaptiveMaxPool2d",
    "AdaptiveMaxPool3d",
    "AvgPool1d",
    "AvgPool2d",
    "AvgPool3d",
    "MaxPool1d",
    "MaxPool2d",
    "MaxPool3d",
]


class AvgPool1d(CallsFunction, nn.AvgPool1d):
    """Unit-scaled :class:`torch.nn.AvgPool1d`: the average of ``K`` elements
    times about ``K^½``; see :func:`unit_scaling.functional.avg_pool1d`.

    Example::

        >>> AvgPool1d(2)(torch.randn(4, 8, 16)).shape
        torch.Size([4, 8, 8])
    """

    _function = staticmethod(U.avg_pool1d)
    _arguments = ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad")

    def __init__(
        self,
        kernel_size: int | tuple[int],
        stride: int | tuple[int] | None = None,
        padding: int | tuple[int] = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        constraint: str | None = "to_output_scale",
    ) -> None:
        super().__init__(
            constraint, kernel_size, stride, padding, ceil_mode, count_include_pad
        )


class _AvgPool(CallsFunction):
    """``AvgPool{2,3}d``: torch's constructor (which, unlike ``AvgPool1d``'s,
    takes ``divisor_override``) plus ``constraint``."""

    _arguments = (*AvgPool1d._arguments, "divisor_override")

    def __init__(
        self,
        kernel_size: int | tuple[int, ...],
        stride: int | tuple[int, ...] | None = None,
        padding: int | tuple[int, ...] = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        divisor_override: int | None = None,
        constraint: str | None = "to_output_scale",
    ) -> None:
        super().__init__(
            constraint,
            kernel_size,
            stride,
            padding,
            ceil_mode,
            count_include_pad,
            divisor_override,
        )


class AvgPool2d(_AvgPool, nn.AvgPool2d):
    """Unit-scaled :class:`torch.nn.AvgPool2d`: the average of ``K`` elements
    times about ``K^½``; see :func:`unit_scaling.functional.avg_pool2d`.

    Example::

        >>> AvgPool2d(2)(torch.randn(4, 8, 16, 16)).shape
        torch.Size([4, 8, 8, 8])
    """

    _function = staticmethod(U.avg_pool2d)


class AvgPool3d(_AvgPool, nn.AvgPool3d):
    """Unit-scaled :class:`torch.nn.AvgPool3d`: the average of ``K`` elements
    times about ``K^½``; see :func:`unit_scaling.functional.avg_pool3d`.

    Example::

        >>> AvgPool3d(2)(torch.randn(2, 4, 8, 8, 8)).shape
        torch.Size([2, 4, 4, 4, 4])
    """

    _function = staticmethod(U.avg_pool3d)


class _MaxPool(CallsFunction):
    """``MaxPool{1,2,3}d``: torch's constructor plus ``constraint``."""

    _arguments = ("kernel_size", "stride", "padding", "dilation")
    _keywords = ("ceil_mode", "return_indices", "constraint")

    def __init__(
        self,
        kernel_size: int | tuple[int, ...],
        stride: int | tuple[int, ...] | None = None,
        padding: int | tuple[int, ...] = 0,
        dilation: int | tuple[int, ...] = 1,
        return_indices: bool = False,
        ceil_mode: bool = False,
        constraint: str | None = "to_output_scale",
    ) -> None:
        super().__init__(
            constraint,
            kernel_size,
            stride,
            padding,
            dilation,
            return_indices,
            ceil_mode,
        )


class MaxPool1d(_MaxPool, nn.MaxPool1d):
    """Unit-scaled :class:`torch.nn.MaxPool1d`: the maximum of ``K`` elements
    over its expected std; see :func:`unit_scaling.functional.max_pool1d`.

    Example::

        >>> MaxPool1d(2)(torch.randn(4, 8, 16)).shape
        torch.Size([4, 8, 8])
    """

    _function = staticmethod(U.max_pool1d)


class MaxPool2d(_MaxPool, nn.MaxPool2d):
    """Unit-scaled :class:`torch.nn.MaxPool2d`: the maximum of ``K`` elements
    over its expected std; see :func:`unit_scaling.functional.max_pool2d`.

    Example::

        >>> MaxPool2d(3, stride=2, padding=1)(torch.randn(4, 8, 16, 16)).shape
        torch.Size([4, 8, 8, 8])
    """

    _function = staticmethod(U.max_pool2d)


class MaxPool3d(_MaxPool, nn.MaxPool3d):
    """Unit-scaled :class:`torch.nn.MaxPool3d`: the maximum of ``K`` elements
    over its expected std; see :func:`unit_scaling.functional.max_pool3d`.

    Example::

        >>> MaxPool3d(2)(torch.randn(2, 4, 8, 8, 8)).shape
        torch.Size([2, 4, 4, 4, 4])
    """

    _function = staticmethod(U.max_pool3d)


class _AdaptiveAvgPool(CallsFunction):
    """``AdaptiveAvgPool{1,2,3}d``: torch's constructor plus ``constraint``."""

    _arguments = ("output_size", "constraint")
    _keywords = ()

    def __init__(
        self, output_size: Any, constraint: str | None = "to_output_scale"
    ) -> None:
        super().__init__(constraint, output_size)


class AdaptiveAvgPool1d(_AdaptiveAvgPool, nn.AdaptiveAvgPool1d):
    """Unit-scaled :class:`torch.nn.AdaptiveAvgPool1d`: scaled exactly for
    its adaptive windows, as in :func:`unit_scaling.functional.adaptive_avg_pool1d`.

    Example::

        >>> AdaptiveAvgPool1d(5)(torch.randn(4, 8, 16)).shape
        torch.Size([4, 8, 5])
    """

    _function = staticmethod(U.adaptive_avg_pool1d)


class AdaptiveAvgPool2d(_AdaptiveAvgPool, nn.AdaptiveAvgPool2d):
    """Unit-scaled :class:`torch.nn.AdaptiveAvgPool2d`: scaled exactly for
    its adaptive windows, as in :func:`unit_scaling.functional.adaptive_avg_pool2d`.

    Example::

        >>> AdaptiveAvgPool2d((1, 1))(torch.randn(4, 8, 7, 7)).shape
        torch.Size([4, 8, 1, 1])
    """

    _function = staticmethod(U.adaptive_avg_pool2d)


class AdaptiveAvgPool3d(_AdaptiveAvgPool, nn.AdaptiveAvgPool3d):
    """Unit-scaled :class:`torch.nn.AdaptiveAvgPool3d`: scaled exactly for
    its adaptive windows, as in :func:`unit_scaling.functional.adaptive_avg_pool3d`.

    Example::

        >>> AdaptiveAvgPool3d(2)(torch.randn(2, 4, 8, 8, 8)).shape
        torch.Size([2, 4, 2, 2, 2])
    """

    _function = staticmethod(U.adaptive_avg_pool3d)


class _AdaptiveMaxPool(CallsFunction):
    """``AdaptiveMaxPool{1,2,3}d``: torch's constructor plus ``constraint``."""

    _arguments = ("output_size", "return_indices", "constraint")
    _keywords = ()

    def __init__(
        self,
        output_size: Any,
        return_indices: bool = False,
        constraint: str | None = "to_output_scale",
    ) -> None:
        super().__init__(constraint, output_size, return_indices)


class AdaptiveMaxPool1d(_AdaptiveMaxPool, nn.AdaptiveMaxPool1d):
    """Unit-scaled :class:`torch.nn.AdaptiveMaxPool1d`: the maximum of each
    adaptive window over its expected std; see
    :func:`unit_scaling.functional.adaptive_max_pool1d`.

    Example::

        >>> AdaptiveMaxPool1d(5)(torch.randn(4, 8, 16)).shape
        torch.Size([4, 8, 5])
    """

    _function = staticmethod(U.adaptive_max_pool1d)


class AdaptiveMaxPool2d(_AdaptiveMaxPool, nn.AdaptiveMaxPool2d):
    """Unit-scaled :class:`torch.nn.AdaptiveMaxPool2d`: the maximum of each
    adaptive window over its expected std; see
    :func:`unit_scaling.functional.adaptive_max_pool2d`.

    Example::

        >>> AdaptiveMaxPool2d(4)(torch.randn(4, 8, 16, 16)).shape
        torch.Size([4, 8, 4, 4])
    """

    _function = staticmethod(U.adaptive_max_pool2d)


class AdaptiveMaxPool3d(_AdaptiveMaxPool, nn.AdaptiveMaxPool3d):
    """Unit-scaled :class:`torch.nn.AdaptiveMaxPool3d`: the maximum of each
    adaptive window over its expected std; see
    :func:`unit_scaling.functional.adaptive_max_pool3d`.

    Example::

        >>> AdaptiveMaxPool3d(2)(torch.randn(2, 4, 8, 8, 8)).shape
        torch.Size([2, 4, 2, 2, 2])
    """

    _function = staticmethod(U.adaptive_max_pool3d)
