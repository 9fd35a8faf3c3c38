"""Unit-scaled adaptive pooling: ``adaptive_{avg,max}_pool{1,2,3}d``.

An adaptive pool maps each spatial size ``L_in`` to ``L_out`` with windows
``[floor(i·L_in/L_out), ceil((i+1)·L_in/L_out))``: of size ``K = L_in/L_out``
(non-overlapping) when ``L_out`` divides ``L_in``, of two neighbouring sizes,
overlapping, otherwise. The scales are those of :mod:`.pooling`, computed
exactly from these windows (see :mod:`._windows`): for an average over windows of
``K`` elements with ``S = L_in / L_out``, output ``K^½`` and gradient
``(K·S)^½``; for a maximum, output ``1 / std`` of the maximum of ``K`` unit
normals and gradient ``(n_in / n_out)^½``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch.nn.functional as F
from torch import Tensor

from ._checks import spatial_shape, validate_constraint
from ._scaling import memoise, scaled_unary
from ._windows import adaptive_windows, average_scales, max_scales

__all__ = [
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "adaptive_avg_pool3d",
    "adaptive_max_pool1d",
    "adaptive_max_pool2d",
    "adaptive_max_pool3d",
]

_OutputSize = int | None | Sequence[int | None]


def _output_sizes(
    op: str, n: int, input: Tensor, output_size: _OutputSize
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Input and output spatial sizes; a ``None`` output size keeps the input's."""
    spatial = spatial_shape(op, input, n)
    sizes = (
        (output_size,) * n
        if output_size is None or isinstance(output_size, int)
        else tuple(output_size)
    )
    if len(sizes) != n:
        raise ValueError(
            f"U.{op}: output_size={output_size!r} must be an int or {n} ints (or None)"
        )
    return spatial, tuple(
        length if size is None else size
        for length, size in zip(spatial, sizes, strict=True)
    )


@memoise
def _adaptive_scales(
    spatial: tuple[int, ...], out: tuple[int, ...], maximum: bool
) -> tuple[float, float]:
    dims = [
        (length, adaptive_windows(length, size))
        for length, size in zip(spatial, out, strict=True)
    ]
    return max_scales(dims) if maximum else average_scales(dims)


_Pool = Callable[..., Tensor]
_MaxPool = Callable[..., Tensor | tuple[Tensor, Tensor]]
_AVERAGES: dict[int, _Pool] = {
    1: F.adaptive_avg_pool1d,
    2: F.adaptive_avg_pool2d,
    3: F.adaptive_avg_pool3d,
}
_MAXIMA: dict[int, _MaxPool] = {
    1: F.adaptive_max_pool1d,
    2: F.adaptive_max_pool2d,
    3: F.adaptive_max_pool3d,
}


def _scales(
    n: int,
    maximum: bool,
    input: Tensor,
    output_size: _OutputSize,
    constraint: str | None,
) -> tuple[float, float]:
    op = f"adaptive_{'max' if maximum else 'avg'}_pool{n}d"
    validate_constraint(constraint)
    spatial, out = _output_sizes(op, n, input, output_size)
    return _adaptive_scales(spatial, out, maximum)


def _adaptive_avg_pool(
    n: int, input: Tensor, output_size: _OutputSize, constraint: str | None
) -> Tensor:
    scales = _scales(n, False, input, output_size, constraint)
    pool = _AVERAGES[n]
    return scaled_unary(lambda x: pool(x, output_size), input, *scales, constraint)


def _adaptive_max_pool(
    n: int,
    input: Tensor,
    output_size: _OutputSize,
    return_indices: bool,
    constraint: str | None,
) -> Tensor | tuple[Tensor, Tensor]:
    scales = _scales(n, True, input, output_size, constraint)
    pool = _MAXIMA[n]
    return scaled_unary(
        lambda x: pool(x, output_size, return_indices), input, *scales, constraint
    )


def adaptive_avg_pool1d(
    input: Tensor,
    output_size: int | Sequence[int],
    constraint: str | None = "to_output_scale",
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.adaptive_avg_pool1d`.

    Output ``i`` averages a window of ``K_i`` inputs, so the averaging matrix
    ``M`` has :math:`\\lVert M \\rVert^2 = \\sum_i 1 / K_i` and

    .. math::
        y = \\alpha\\, \\mathrm{avgpool}(x), \\qquad
        \\alpha = \\Big(L_{out} \\Big/ \\sum_i K_i^{-1}\\Big)^{1/2},\\quad
        \\beta = \\Big(L_{in} \\Big/ \\sum_i K_i^{-1}\\Big)^{1/2}

    exact for i.i.d. unit-normal data. When ``L_out`` divides ``L_in``,
    :math:`\\alpha = K^{1/2}` and :math:`\\beta = K` for ``K = L_in / L_out``
    (the global average, ``output_size=1``, has :math:`\\alpha = L^{1/2}`,
    :math:`\\beta = L`). The constraint ties ``(alpha, beta)``.

    Args:
        input: ``(N, C, L)`` or ``(C, L)``.
        output_size: the target length.
        constraint: applied to ``(alpha, beta)``; see
            :mod:`unit_scaling.constraints`.

    Example::

        >>> y = U.adaptive_avg_pool1d(torch.randn(8, 16, 100), 10)
        >>> y.shape, round(y.std().item(), 1)
        (torch.Size([8, 16, 10]), 1.0)
    """
    return _adaptive_avg_pool(1, input, output_size, constraint)


def adaptive_avg_pool2d(
    input: Tensor,
    output_size: _OutputSize,
    constraint: str | None = "to_output_scale",
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.adaptive_avg_pool2d`.

    As :func:`adaptive_avg_pool1d` along each of ``H`` and ``W``: ``M`` is the
    product of the two dimensions' matrices, so

    .. math::
        \\alpha = \\alpha_H \\alpha_W, \\qquad \\beta = \\beta_H \\beta_W

    A ``None`` output size keeps that dimension (its factors are 1).

    Args:
        input: ``(N, C, H, W)`` or ``(C, H, W)``.
        output_size: the target ``(H_out, W_out)``, or one int for both.
        constraint: applied to ``(alpha, beta)``; see
            :mod:`unit_scaling.constraints`.

    Example::

        >>> y = U.adaptive_avg_pool2d(torch.randn(8, 16, 32, 32), (4, 4))
        >>> y.shape, round(y.std().item(), 1)
        (torch.Size([8, 16, 4, 4]), 1.0)
    """
    return _adaptive_avg_pool(2, input, output_size, constraint)


def adaptive_avg_pool3d(
    input: Tensor,
    output_size: _OutputSize,
    constraint: str | None = "to_output_scale",
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.adaptive_avg_pool3d`.

    As :func:`adaptive_avg_pool1d` along each of ``D``, ``H`` and ``W``, the
    scales multiplying over them:

    .. math::
        \\alpha = \\alpha_D \\alpha_H \\alpha_W, \\qquad
        \\beta = \\beta_D \\beta_H \\beta_W

    A ``None`` output size keeps that dimension (its factors are 1).

    Args:
        input: ``(N, C, D, H, W)`` or ``(C, D, H, W)``.
        output_size: the target ``(D_out, H_out, W_out)``, or one int for all.
        constraint: applied to ``(alpha, beta)``; see
            :mod:`unit_scaling.constraints`.

    Example::

        >>> y = U.adaptive_avg_pool3d(torch.randn(4, 8, 16, 16, 16), 4)
        >>> y.shape, round(y.std().item(), 1)
        (torch.Size([4, 8, 4, 4, 4]), 1.0)
    """
    return _adaptive_avg_pool(3, input, output_size, constraint)


def adaptive_max_pool1d(
    input: Tensor,
    output_size: int | Sequence[int],
    return_indices: bool = False,
    constraint: str | None = "to_output_scale",
) -> Tensor | tuple[Tensor, Tensor]:
    """Unit-scaled :func:`torch.nn.functional.adaptive_max_pool1d`.

    The maximum over the windows of :func:`adaptive_avg_pool1d`, scaled as
    :func:`~unit_scaling.functional.max_pool1d` is:

    .. math::
        y_i = \\alpha \\max_{j \\in w_i} x_j, \\qquad
        \\alpha = 1 / \\mathrm{std}_i\\Big[\\max_{j \\in w_i} x_j\\Big],\\qquad
        \\beta = (L_{in} / L_{out})^{1/2}

    where the standard deviation is over the windows, whose sizes ``K_i`` may
    differ (``alpha`` accounts for the mixture). Each window's gradient reaches
    one element, so ``beta`` is exact. The constraint ties ``(alpha, beta)``.

    Args:
        input: ``(N, C, L)`` or ``(C, L)``.
        output_size: the target length.
        return_indices: also return the argmax indices (only the output is
            scaled).
        constraint: applied to ``(alpha, beta)``; see
            :mod:`unit_scaling.constraints`.

    Example::

        >>> y = U.adaptive_max_pool1d(torch.randn(8, 16, 100), 25)
        >>> y.shape, round(y.std().item(), 1)
        (torch.Size([8, 16, 25]), 1.0)
    """
    return _adaptive_max_pool(1, input, output_size, return_indices, constraint)


def adaptive_max_pool2d(
    input: Tensor,
    output_size: _OutputSize,
    return_indices: bool = False,
    constraint: str | None = "to_output_scale",
) -> Tensor | tuple[Tensor, Tensor]:
    """Unit-scaled :func:`torch.nn.functional.adaptive_max_pool2d`.

    As :func:`adaptive_max_pool1d` over the windows of ``H`` and ``W`` together:

    .. math::
        \\alpha = 1 / \\mathrm{std}_{i}\\Big[\\max_{j \\in w_{H,i} \\times w_{W,i}}
            x_j\\Big],\\qquad
        \\beta = \\Big(\\frac{H_{in} W_{in}}{H_{out} W_{out}}\\Big)^{1/2}

    A ``None`` output size keeps that dimension.

    Args:
        input: ``(N, C, H, W)`` or ``(C, H, W)``.
        output_size: the target ``(H_out, W_out)``, or one int for both.
        return_indices: also return the argmax indices (only the output is
            scaled).
        constraint: applied to ``(alpha, beta)``; see
            :mod:`unit_scaling.constraints`.

    Example::

        >>> y = U.adaptive_max_pool2d(torch.randn(8, 16, 32, 32), 8)
        >>> y.shape, round(y.std().item(), 1)
        (torch.Size([8, 16, 8, 8]), 1.0)
    """
    return _adaptive_max_pool(2, input, output_size, return_indices, constraint)


def adaptive_max_pool3d(
    input: Tensor,
    output_size: _OutputSize,
    return_indices: bool = False,
    constraint: str | None = "to_output_scale",
) -> Tensor | tuple[Tensor, Tensor]:
    """Unit-scaled :func:`torch.nn.functional.adaptive_max_pool3d`.

    As :func:`adaptive_max_pool1d` over the windows of ``D``, ``H`` and ``W``
    together, with

    .. math::
        \\beta = \\Big(\\frac{D_{in} H_{in} W_{in}}{D_{out} H_{out} W_{out}}\\Big)^{1/2}

    and ``alpha`` from the maxima over those windows. A ``None`` output size keeps
    that dimension.

    Args:
        input: ``(N, C, D, H, W)`` or ``(C, D, H, W)``.
        output_size: the target ``(D_out, H_out, W_out)``, or one int for all.
        return_indices: also return the argmax indices (only the output is
            scaled).
        constraint: applied to ``(alpha, beta)``; see
            :mod:`unit_scaling.constraints`.

    Example::

        >>> y = U.adaptive_max_pool3d(torch.randn(4, 8, 16, 16, 16), 4)
        >>> y.shape, round(y.std().item(), 1)
        (torch.Size([4, 8, 4, 4, 4]), 1.0)
    """
    return _adaptive_max_pool(3, input, output_size, return_indices, constraint)
