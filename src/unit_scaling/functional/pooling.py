"""Unit-scaled pooling: ``avg_pool{1,2,3}d`` and ``max_pool{1,2,3}d``.

Pooling is positively homogeneous (``pool(a x) = a pool(x)`` for ``a > 0``), so
each op is the torch op with its output multiplied by ``alpha`` (the smaller
tensor) and its input gradient by ``beta``. Both are exact expectations for
i.i.d. unit-normal input and output gradient, computed from torch's own windows
(see :mod:`._windows`); away from the borders they are:

* **average** of ``K`` elements: output ``K^½`` (the mean of ``K`` unit terms has
  std ``K^-½``), gradient ``(K·S)^½`` (each element lies in ``K/S`` windows and
  receives ``1/K`` of each one's gradient), with ``S`` the stride's numel;
* **maximum** of ``K`` elements: output ``1 / std`` of the maximum of ``K`` unit
  normals, gradient ``(n_in / n_out)^½ ≈ S^½`` (each window passes its gradient
  to one element).

Padding, partial (``ceil_mode``) windows, ``count_include_pad`` and
``divisor_override`` change the border windows, and the exact scales follow.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from string import Template

import torch.nn.functional as F
from torch import Tensor

from ._checks import expand_size, spatial_shape, validate_constraint
from ._dims import for_dims
from ._scaling import memoise, scaled_unary
from ._windows import average_scales, max_scales, pool_windows

__all__ = [
    "avg_pool1d",
    "avg_pool2d",
    "avg_pool3d",
    "max_pool1d",
    "max_pool2d",
    "max_pool3d",
]

_Size = int | Sequence[int]


def _scales(
    op: str,
    n: int,
    input: Tensor,
    kernel_size: _Size,
    stride: _Size | None,
    padding: _Size,
    dilation: _Size,
    ceil_mode: bool,
    average: tuple[bool, int | None] | None,
) -> tuple[float, float]:
    """The exact scales of a max pool, or of an average pool when ``average`` is
    its ``(count_include_pad, divisor_override)``, from torch's arguments."""
    kernel = expand_size(op, "kernel_size", kernel_size, n)
    # torch: a missing (None or empty) stride is the kernel size.
    no_stride = stride is None or (not isinstance(stride, int) and len(stride) == 0)
    strides = kernel if no_stride else expand_size(op, "stride", stride, n)  # type: ignore[arg-type]
    return _window_scales(
        spatial_shape(op, input, n),
        kernel,
        strides,
        expand_size(op, "padding", padding, n),
        expand_size(op, "dilation", dilation, n),
        ceil_mode,
        average,
    )


@memoise
def _window_scales(
    spatial: tuple[int, ...],
    kernel: tuple[int, ...],
    strides: tuple[int, ...],
    pads: tuple[int, ...],
    dilations: tuple[int, ...],
    ceil_mode: bool,
    average: tuple[bool, int | None] | None,
) -> tuple[float, float]:
    dims = [
        (length, pool_windows(length, k, s, p, d, ceil_mode))
        for length, k, s, p, d in zip(
            spatial, kernel, strides, pads, dilations, strict=True
        )
    ]
    return max_scales(dims) if average is None else average_scales(dims, *average)


_Pool = Callable[..., Tensor]
_MaxPool = Callable[..., Tensor | tuple[Tensor, Tensor]]
_AVERAGES: dict[int, _Pool] = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}
_MAXIMA: dict[int, _MaxPool] = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}


def _avg_pool(
    n: int,
    input: Tensor,
    kernel_size: _Size,
    stride: _Size | None = None,
    padding: _Size = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
    constraint: str | None = "to_output_scale",
) -> Tensor:
    """``avg_pool{n}d``: the pool, scaled by its exact average-pool scales."""
    op = f"avg_pool{n}d"
    validate_constraint(constraint)
    average = (count_include_pad, divisor_override)
    scales = _scales(op, n, input, kernel_size, stride, padding, 1, ceil_mode, average)
    # avg_pool1d has no divisor_override.
    extra = () if divisor_override is None else (divisor_override,)
    pool = _AVERAGES[n]
    return scaled_unary(
        lambda x: pool(
            x, kernel_size, stride, padding, ceil_mode, count_include_pad, *extra
        ),
        input,
        *scales,
        constraint,
    )


def _max_pool(
    n: int,
    input: Tensor,
    kernel_size: _Size,
    stride: _Size | None = None,
    padding: _Size = 0,
    dilation: _Size = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
    constraint: str | None = "to_output_scale",
) -> Tensor | tuple[Tensor, Tensor]:
    """``max_pool{n}d``: the pool, scaled by its exact max-pool scales."""
    op = f"max_pool{n}d"
    validate_constraint(constraint)
    scales = _scales(
        op, n, input, kernel_size, stride, padding, dilation, ceil_mode, None
    )
    pool = _MAXIMA[n]
    return scaled_unary(
        lambda x: pool(
            x,
            kernel_size,
            stride,
            padding,
            dilation,
            ceil_mode=ceil_mode,
            return_indices=return_indices,
        ),
        input,
        *scales,
        constraint,
    )


def avg_pool1d(
    input: Tensor,
    kernel_size: _Size,
    stride: _Size | None = None,
    padding: _Size = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    constraint: str | None = "to_output_scale",
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.avg_pool1d`.

    .. math::
        y = \\alpha\\, \\mathrm{avgpool}(x), \\qquad
        \\partial_x = \\beta\\, \\mathrm{avgpool}^T(\\partial_y), \\qquad
        \\alpha = \\left(\\frac{n_{out}}{\\lVert M \\rVert^2}\\right)^{1/2},\\quad
        \\beta = \\left(\\frac{n_{in}}{\\lVert M \\rVert^2}\\right)^{1/2}

    where ``M`` is the pooling's ``n_out × n_in`` averaging matrix (from torch's
    windows, padding and divisor), so that both are exact for i.i.d. unit-normal
    data. Away from the borders :math:`\\alpha = K^{1/2}` and
    :math:`\\beta = (K S)^{1/2}` for kernel size ``K`` and stride ``S``. The
    constraint ties ``(alpha, beta)``: by default both are ``alpha``, and the
    input gradient then has RMS about :math:`S^{-1/2}`.

    Args:
        input: ``(N, C, L)`` or ``(C, L)``.
        kernel_size, stride, padding, ceil_mode, count_include_pad: as in torch.
        constraint: applied to ``(alpha, beta)``; see
            :mod:`unit_scaling.constraints`.

    Example::

        >>> y = U.avg_pool1d(torch.randn(8, 16, 100), 4)
        >>> round(y.std().item(), 1)
        1.0
    """
    return _avg_pool(
        1,
        input,
        kernel_size,
        stride,
        padding,
        ceil_mode,
        count_include_pad,
        None,
        constraint,
    )


_AVG_DOC = Template(
    """Unit-scaled :func:`torch.nn.functional.$name`.

    As :func:`avg_pool1d` (exact scales from the averaging matrix; away from the
    borders :math:`\\alpha = K^{1/2}`, :math:`\\beta = (K S)^{1/2}` with
    ``K = $kernel_numel`` and ``S = $stride_numel``). With ``divisor_override = d``
    each window sum is divided by ``d``, and the scales follow (interior:
    :math:`\\alpha = d K^{-1/2}`, :math:`\\beta = d (S/K)^{1/2}`).

    Args:
        input: ``(N, C, $axes)`` or ``(C, $axes)``.
        kernel_size, stride, padding: as in torch.
        ceil_mode, count_include_pad, divisor_override: as in torch.
        constraint: applied to ``(alpha, beta)``; see
            :mod:`unit_scaling.constraints`.

    Example::

        >>> y = U.$name(torch.randn($input), 2)
        >>> round(y.std().item(), 1)
        1.0
    """
)
avg_pool2d = for_dims(_avg_pool, 2, _AVG_DOC, input="8, 16, 32, 32")
avg_pool3d = for_dims(_avg_pool, 3, _AVG_DOC, input="4, 8, 16, 16, 16")

_MAX_DOC = Template(
    """Unit-scaled :func:`torch.nn.functional.$name`.

    .. math::
        y = \\alpha \\max_{j \\in w} x_j, \\qquad
        \\alpha = 1 / \\mathrm{std}\\Big[\\max_{j \\le K} x_j\\Big],\\qquad
        \\beta = (n_{in} / n_{out})^{1/2} \\approx S^{1/2}

    for kernel size ``K = $kernel_numel`` and stride ``S = $stride_numel``. The
    maximum of ``K`` unit normals has standard deviation 1, 0.826, 0.701, 0.598
    and 0.451 for ``K`` = 1, 2, 4, 9 and 64 (computed by numerical integration,
    exact to ``1e-9``); where padding or partial windows leave fewer valid
    elements, ``alpha`` accounts for the mixture of window sizes. Each window's
    gradient reaches exactly one element, so ``beta`` is exact. The output's mean
    (e.g. 1.03 for ``K = 4``) is not normalised, as for
    :func:`~unit_scaling.functional.relu`. The constraint ties ``(alpha, beta)``.

    Args:
        input: ``(N, C, $axes)`` or ``(C, $axes)``.
        kernel_size, stride, padding, dilation, ceil_mode: as in torch.
        return_indices: also return the argmax indices, as torch does (only the
            output is scaled).
        constraint: applied to ``(alpha, beta)``; see
            :mod:`unit_scaling.constraints`.

    Example::

        >>> y = U.$name(torch.randn($input), $kernel)
        >>> round(y.std().item(), 1)
        1.0
    """
)
max_pool1d = for_dims(_max_pool, 1, _MAX_DOC, input="8, 16, 100", kernel="4")
max_pool2d = for_dims(_max_pool, 2, _MAX_DOC, input="8, 16, 32, 32", kernel="2")
max_pool3d = for_dims(_max_pool, 3, _MAX_DOC, input="4, 8, 16, 16, 16", kernel="2")
