"""The scales of averaging and max-pooling, computed exactly from torch's windows.

Pooling acts on each spatial dimension separately, so everything here is worked
out one dimension at a time from the windows torch lays out (padding, dilation,
``ceil_mode`` and adaptive windows included) and then multiplied over dimensions.
For i.i.d. unit-normal input and a unit-normal output gradient:

* a **linear** pooling ``y = M x`` (average pooling, ``area`` interpolation) has
  output mean square ``||M||² / n_out`` and input-gradient mean square
  ``||M||² / n_in``, where ``||M||²`` (the squared Frobenius norm) is the product
  over dimensions of each dimension's;
* a **max** pooling routes each output's gradient to one input element, so the
  input gradient's mean square is exactly ``n_out / n_in``; its output is the
  maximum of the ``n`` valid elements of a window, whose standard deviation over
  all output positions comes from the moments of the maximum of ``n`` unit
  normals (:func:`max_moments`, by numerical integration) mixed over the window
  sizes that occur.

In the interior of an input (no padding, no partial windows) these reduce to the
textbook rules: an average of ``K`` terms has output scale ``K^½`` and gradient
scale ``(K·S)^½`` for stride numel ``S``; a max pool has gradient scale about
``S^½``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from ._scaling import memoise, normal_expectation

__all__ = [
    "Window",
    "adaptive_windows",
    "average_scales",
    "max_moments",
    "max_scales",
    "pool_windows",
]

# A window along one dimension: (valid elements, length counting padding).
Window = tuple[int, int]


@memoise
def pool_windows(
    length: int, kernel: int, stride: int, padding: int, dilation: int, ceil: bool
) -> tuple[Window, ...]:
    """The windows of ``{avg,max}_pool`` along one dimension, as torch lays them out.

    The padded length stops at ``length + padding`` (an average's divisor counts
    the padding only up to there); ``dilation`` spaces the taps of a max pool.
    """
    span = dilation * (kernel - 1) + 1
    numerator = length + 2 * padding - span + (stride - 1 if ceil else 0)
    n_out = numerator // stride + 1
    if ceil and (n_out - 1) * stride >= length + padding:
        n_out -= 1
    windows = []
    for i in range(max(n_out, 0)):
        start = i * stride - padding
        valid = sum(0 <= start + j * dilation < length for j in range(kernel))
        padded = min(start + span, length + padding) - start
        windows.append((valid, padded))
    return tuple(windows)


@memoise
def adaptive_windows(length: int, out: int) -> tuple[Window, ...]:
    """The windows of ``adaptive_{avg,max}_pool`` along one dimension:
    ``[floor(i·L/out), ceil((i+1)·L/out))``, with no padding."""
    windows = []
    for i in range(out):
        size = -(-(i + 1) * length // out) - i * length // out
        windows.append((size, size))
    return tuple(windows)


def _norm_sq(windows: Sequence[Window], count_include_pad: bool, divide: bool) -> float:
    """``||M||²`` of one dimension's averaging matrix: ``Σ valid / divisor²``."""
    total = 0.0
    for valid, padded in windows:
        divisor = (padded if count_include_pad else valid) if divide else 1
        total += valid / divisor**2 if divisor else 0.0
    return total


def average_scales(
    dims: Sequence[tuple[int, Sequence[Window]]],
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> tuple[float, float]:
    """``(output_scale, grad_scale)`` of an average pool, exact for i.i.d. input.

    ``dims`` gives each spatial dimension's input length and windows. With
    ``divisor_override`` every window sum is divided by it instead.
    """
    norm_sq, n_in, n_out = 1.0, 1, 1
    for length, windows in dims:
        norm_sq *= _norm_sq(windows, count_include_pad, divisor_override is None)
        n_in *= length
        n_out *= len(windows)
    if divisor_override is not None:
        norm_sq /= divisor_override**2
    if norm_sq == 0:
        return 1.0, 1.0
    return (n_out / norm_sq) ** 0.5, (n_in / norm_sq) ** 0.5


@memoise
def max_moments(n: int) -> tuple[float, float]:
    """Mean and variance of the maximum of ``n`` i.i.d. unit normals.

    Integrates ``x^k · n φ(x) Φ(x)^(n-1)`` (the maximum's density) numerically.
    """

    def density_over_phi(x: float) -> float:
        cdf = 0.5 * math.erfc(-x / math.sqrt(2))
        return n * cdf ** (n - 1) if cdf > 0 else 0.0

    # The maximum's density narrows as n grows (std 0.35 at n = 100, 0.25 at 10⁴).
    width = 0.25
    mean = normal_expectation(lambda x: x * density_over_phi(x), width)
    second = normal_expectation(lambda x: x * x * density_over_phi(x), width)
    return mean, second - mean**2


def max_scales(dims: Sequence[tuple[int, Sequence[Window]]]) -> tuple[float, float]:
    """``(output_scale, grad_scale)`` of a max pool, for i.i.d. unit-normal input.

    The output scale is ``1 / std`` of the output over all positions, whose
    windows hold ``n`` valid elements with the frequencies that occur (a mixture
    of the maxima of ``n`` normals); the gradient scale is
    ``(n_in / n_out)^½``.
    """
    sizes: Counter[int] = Counter({1: 1})
    n_in, n_out = 1, 1
    for length, windows in dims:
        along = Counter(valid for valid, _ in windows)
        product: Counter[int] = Counter()
        for a, count_a in sizes.items():
            for b, count_b in along.items():
                product[a * b] += count_a * count_b
        sizes = product
        n_in *= length
        n_out *= len(windows)
    total = sum(sizes.values())
    if total == 0:
        return 1.0, 1.0
    moments = {n: max_moments(n) for n in sizes}
    mean = sum(c * moments[n][0] for n, c in sizes.items()) / total
    second = sum(c * (moments[n][1] + moments[n][0] ** 2) for n, c in sizes.items())
    variance = second / total - mean**2
    return variance**-0.5, (n_in / n_out) ** 0.5
