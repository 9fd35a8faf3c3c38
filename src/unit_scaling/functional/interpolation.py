"""Unit-scaled :func:`torch.nn.functional.interpolate`, for every mode torch has.

Interpolation is linear and separable: along each spatial dimension the output is
``M x`` for an ``n_out × n_in`` matrix ``M`` fixed by the mode and its flags. For
i.i.d. unit-normal input the output's mean square is ``||M||² / n_out`` (each row
has ``Σ_j M_ij²``), and for a unit-normal output gradient the input gradient's is
``||M||² / n_in``; over several dimensions the squared norms multiply. So

.. math::
    \\alpha = \\Big(\\prod_d \\frac{n_{out,d}}{\\lVert M_d \\rVert^2}\\Big)^{1/2},
    \\qquad
    \\beta = \\Big(\\prod_d \\frac{n_{in,d}}{\\lVert M_d \\rVert^2}\\Big)^{1/2}

exactly. ``||M_d||²`` is computed here in plain Python from torch's own index
and weight rules (source index, ``align_corners``, border clamping, the cubic
convolution's ``A = -0.75``, the antialiasing filters and their supports), which
the tests check against ``F.interpolate`` applied to an identity matrix; the
result is cached per argument set.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .._torch_internals import INTERPOLATE_HAS_LANCZOS
from ._checks import validate_constraint
from ._scaling import memoise, scaled_unary
from ._windows import adaptive_windows, average_scales

__all__ = ["interpolate"]

_MODES = (
    "nearest",
    "nearest-exact",
    "linear",
    "bilinear",
    "trilinear",
    "bicubic",
    "area",
    "lanczos",
)


def _cubic(x: float, a: float) -> float:
    """Keys' cubic convolution kernel with parameter ``a``."""
    x = abs(x)
    if x < 1:
        return ((a + 2) * x - (a + 3)) * x * x + 1
    if x < 2:
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return 0.0


def _lanczos3(x: float) -> float:
    if abs(x) >= 3:
        return 0.0
    if x == 0:
        return 1.0
    px = math.pi * x
    return 3 * math.sin(px) * math.sin(px / 3) / (px * px)


# Antialiasing filters: (interpolation size, filter), as torch's (and PIL's).
_AA_FILTERS: dict[str, tuple[int, Callable[[float], float]]] = {
    "bilinear": (2, lambda x: max(0.0, 1 - abs(x))),
    "bicubic": (4, lambda x: _cubic(x, -0.5)),
    "lanczos": (6, _lanczos3),
}


def _source_scale(
    n_in: int, n_out: int, align_corners: bool, scale_factor: float | None
) -> float:
    """Input positions per output position, as torch's kernels compute it."""
    if align_corners:
        return (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    if scale_factor is not None and scale_factor > 0:
        return 1 / scale_factor
    return n_in / n_out


def _sum_sq(weights: dict[int, float]) -> float:
    return sum(w * w for w in weights.values())


def _antialiased_norm_sq(mode: str, n_in: int, n_out: int, scale: float) -> float:
    size, kernel = _AA_FILTERS[mode]
    support = size / 2 * scale if scale >= 1 else size / 2
    stretch = 1 / scale if scale >= 1 else 1.0
    total = 0.0
    for i in range(n_out):
        center = scale * (i + 0.5)
        low = max(int(center - support + 0.5), 0)
        high = min(int(center + support + 0.5), n_in)
        weights = [kernel((j - center + 0.5) * stretch) for j in range(low, high)]
        norm = sum(weights)
        if norm != 0:
            total += sum(w * w for w in weights) / norm**2
    return total


def _clamped_norm_sq(mode: str, n_in: int, n_out: int, scale: float, ac: bool) -> float:
    """Linear and cubic modes: taps beyond the border read the border element."""
    cubic = mode == "bicubic"
    total = 0.0
    for i in range(n_out):
        source = scale * i if ac else scale * (i + 0.5) - 0.5
        if not (ac or cubic):
            source = max(source, 0.0)
        index = min(math.floor(source), n_in - 1)
        t = min(max(source - index, 0.0), 1.0)
        if cubic:
            taps = {-1: _cubic(t + 1, -0.75), 0: _cubic(t, -0.75)}
            taps.update({1: _cubic(1 - t, -0.75), 2: _cubic(2 - t, -0.75)})
        else:
            taps = {0: 1 - t, 1: t}
        weights: dict[int, float] = {}
        for offset, w in taps.items():
            j = max(min(index + offset, n_in - 1), 0)
            weights[j] = weights.get(j, 0.0) + w
        total += _sum_sq(weights)
    return total


def _norm_sq(
    mode: str,
    n_in: int,
    n_out: int,
    align_corners: bool,
    scale_factor: float | None,
    antialias: bool,
) -> float:
    """``||M||²`` of one dimension's interpolation matrix."""
    if mode in ("nearest", "nearest-exact"):
        return float(n_out)  # one weight of 1 per row
    scale = _source_scale(n_in, n_out, align_corners, scale_factor)
    if antialias or mode == "lanczos":
        return _antialiased_norm_sq(mode, n_in, n_out, scale)
    return _clamped_norm_sq(mode, n_in, n_out, scale, align_corners)


@memoise
def _interpolation_scales(
    spatial: tuple[int, ...],
    out: tuple[int, ...],
    mode: str,
    align_corners: bool,
    scale_factors: tuple[float, ...] | None,
    antialias: bool,
) -> tuple[float, float]:
    if mode == "area":
        return average_scales(
            [(n, adaptive_windows(n, m)) for n, m in zip(spatial, out, strict=True)]
        )
    factors = scale_factors or (None,) * len(spatial)
    norm_sq = 1.0
    for n_in, n_out, factor in zip(spatial, out, factors, strict=True):
        norm_sq *= _norm_sq(mode, n_in, n_out, align_corners, factor, antialias)
    if norm_sq == 0:
        return 1.0, 1.0
    return (math.prod(out) / norm_sq) ** 0.5, (math.prod(spatial) / norm_sq) ** 0.5


def _sizes(
    spatial: tuple[int, ...],
    size: int | Sequence[int] | None,
    scale_factor: float | Sequence[float] | None,
    mode: str,
    recompute_scale_factor: bool | None,
) -> tuple[tuple[int, ...], tuple[float, ...] | None]:
    """Output sizes, and the scale factors torch's kernels use (or ``None``)."""
    n = len(spatial)
    if (size is None) == (scale_factor is None):
        raise ValueError(
            "U.interpolate: give exactly one of size and scale_factor, got "
            f"size={size!r} and scale_factor={scale_factor!r}"
        )
    if size is not None:
        sizes = (size,) * n if isinstance(size, int) else tuple(size)
        if len(sizes) != n:
            raise ValueError(
                f"U.interpolate: size={size!r} must be an int or {n} ints for input "
                f"with {n} spatial dims"
            )
        return sizes, None
    assert scale_factor is not None
    factors = (
        (float(scale_factor),) * n
        if isinstance(scale_factor, int | float)
        else tuple(float(f) for f in scale_factor)
    )
    if len(factors) != n:
        raise ValueError(
            f"U.interpolate: scale_factor={scale_factor!r} must be a number or {n} "
            f"numbers for input with {n} spatial dims"
        )
    sizes = tuple(
        math.floor(n_in * f) for n_in, f in zip(spatial, factors, strict=True)
    )
    # As in torch: "area" and recompute_scale_factor=True use the integer sizes.
    return sizes, None if recompute_scale_factor or mode == "area" else factors


def interpolate(
    input: Tensor,
    size: int | Sequence[int] | None = None,
    scale_factor: float | Sequence[float] | None = None,
    mode: str = "nearest",
    align_corners: bool | None = None,
    recompute_scale_factor: bool | None = None,
    antialias: bool = False,
    constraint: str | None = "to_output_scale",
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.interpolate` (up- or down-sampling).

    .. math::
        y = \\alpha\\, \\mathrm{interpolate}(x), \\qquad
        \\alpha = \\Big(\\prod_d \\frac{n_{out,d}}{\\lVert M_d \\rVert^2}\\Big)^{1/2},
        \\quad
        \\beta = \\Big(\\prod_d \\frac{n_{in,d}}{\\lVert M_d \\rVert^2}\\Big)^{1/2}

    where ``M_d`` is the interpolation matrix of spatial dimension ``d`` (see the
    module docstring): exact for i.i.d. unit-normal data. For ``"nearest"``,
    :math:`\\alpha = 1` and :math:`\\beta = (n_{in}/n_{out})^{1/2}` (each input
    element is copied ``n_out/n_in`` times on average); ``"area"`` is an adaptive
    average pool; linear and cubic modes shrink the output (an interpolated value
    averages its neighbours) and are scaled back up. The constraint ties
    ``(alpha, beta)``; ``alpha`` multiplies whichever of the input and output is
    smaller.

    Args:
        input: ``(N, C, *spatial)`` with 1 to 3 spatial dims.
        size, scale_factor, mode, align_corners: as in torch (every mode
            torch supports).
        recompute_scale_factor, antialias: as in torch.
        constraint: applied to ``(alpha, beta)``; see
            :mod:`unit_scaling.constraints`.

    Example::

        >>> x = torch.randn(8, 16, 32, 32)
        >>> y = U.interpolate(x, scale_factor=2, mode="bilinear")
        >>> y.shape, round(y.std().item(), 1)
        (torch.Size([8, 16, 64, 64]), 1.0)
    """
    validate_constraint(constraint)
    if mode not in _MODES:
        raise ValueError(
            f"U.interpolate: mode={mode!r} is not one of torch's modes {_MODES}"
        )
    if mode == "lanczos" and not INTERPOLATE_HAS_LANCZOS:
        raise ValueError(
            "U.interpolate: mode='lanczos' needs torch >= 2.12, and torch "
            f"{torch.__version__} is installed: upgrade torch or use mode='bicubic'"
        )
    if input.dim() < 3:
        raise ValueError(
            "U.interpolate: expected input of shape (N, C, *spatial) with 1 to 3 "
            f"spatial dims, got {tuple(input.shape)}"
        )
    spatial = tuple(input.shape[2:])
    out, factors = _sizes(spatial, size, scale_factor, mode, recompute_scale_factor)
    scales = _interpolation_scales(
        spatial, out, mode, bool(align_corners), factors, antialias
    )
    return scaled_unary(
        lambda x: F.interpolate(
            x,
            size,
            scale_factor,
            mode,
            align_corners,
            recompute_scale_factor,
            antialias,
        ),
        input,
        *scales,
        constraint,
        scale_input=math.prod(spatial) < math.prod(out),
    )
