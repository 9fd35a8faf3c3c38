"""What a block format does to a tensor: the fraction of its elements that
flush to zero or saturate, the quantisation error, and its blocks' dynamic
range (:func:`quantisation_statistics`)."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from ._block import BlockFormat, normalise_axis, quantise_blocks, to_blocks

__all__ = ["QuantisationStatistics", "quantisation_statistics"]

# The raw sums: one transfer per tensor's device, merged by the caller.
RAW_FIELDS = (
    "flushed",  # count: non-zero finite elements that become zero
    "saturated",  # count: finite elements above their block's largest value
    "squared_error",  # sum over finite elements with finite values
    "power",  # sum of squares over the same elements
    "measured",  # count of those elements (the padding excluded)
    "range_median",  # log2(amax / smallest non-zero |x|), median over blocks
    "range_max",  # ... and largest
)


class QuantisationStatistics(NamedTuple):
    """A block format's effect on one tensor (see
    :func:`quantisation_statistics`).

    Attributes:
        flushed: the fraction of elements, non-zero before, that are zero after.
        saturated: the fraction of elements above the largest value of their
            block (the element's maximum times the block's scale), which are
            clipped to it.
        mse: the mean squared quantisation error.
        sqnr_db: the signal-to-quantisation-noise ratio,
            :math:`10 \\log_{10}(\\sum x^2 / \\sum (q(x) - x)^2)` in decibels
            (``inf`` when nothing changes).
        block_range_median: each block's dynamic range, :math:`\\log_2` of its
            largest over its smallest non-zero magnitude (binades): the median
            over the blocks holding a non-zero element.
        block_range_max: the largest of those.
    """

    flushed: float
    saturated: float
    mse: float
    sqnr_db: float
    block_range_median: float
    block_range_max: float


def raw_quantisation_statistics(x: Tensor, fmt: BlockFormat, axis: int = -1) -> Tensor:
    """The sums of :data:`RAW_FIELDS` for ``x`` quantised to ``fmt`` along
    ``axis``, as a float64 tensor on ``x``'s device (no host sync)."""
    x = x.detach()
    if x.dim() < fmt.block_dims:
        x = x.reshape((1,) * (fmt.block_dims - x.dim()) + tuple(x.shape))
    axis = normalise_axis(x, fmt, axis)
    blocked = quantise_blocks(fmt, x, axis, None)
    values = blocked.elements * blocked.scales.unsqueeze(-1)
    limit = fmt.element.max_absolute_value * blocked.scales
    if blocked.tensor_scale is not None:
        values = values * blocked.tensor_scale
        limit = limit * blocked.tensor_scale
    original, _ = to_blocks(x.float(), fmt, axis)
    magnitude = original.abs()
    finite = original.isfinite()
    nonzero = finite & (original != 0)
    flushed = (nonzero & (values == 0)).sum()
    saturated = (finite & (magnitude > limit.unsqueeze(-1))).sum()
    measured = finite & values.isfinite()
    error = torch.where(measured, values.double() - original.double(), 0)
    power = torch.where(measured, original.double(), 0).square().sum()
    amax = torch.where(finite, magnitude, 0).amax(-1)
    smallest = torch.where(nonzero, magnitude, math.inf).amin(-1)
    ranges = torch.log2(amax.double() / smallest.double())[smallest.isfinite()]
    if ranges.numel():
        median, largest = ranges.median(), ranges.max()
    else:
        median = largest = torch.zeros((), dtype=torch.float64, device=x.device)
    return torch.stack(
        [
            flushed.double(),
            saturated.double(),
            error.square().sum(),
            power,
            (measured.sum() - (original.numel() - x.numel())).double(),
            median.double(),
            largest.double(),
        ]
    )


def finish_quantisation_statistics(
    raw: list[float], numel: int
) -> QuantisationStatistics:
    """:class:`QuantisationStatistics` from the sums of
    :func:`raw_quantisation_statistics` over a tensor of ``numel`` elements."""
    r = dict(zip(RAW_FIELDS, raw, strict=True))
    error, power = r["squared_error"], r["power"]
    if error == 0:
        sqnr = math.inf if power > 0 else math.nan
    else:
        sqnr = 10 * math.log10(power / error) if power > 0 else -math.inf
    return QuantisationStatistics(
        r["flushed"] / max(numel, 1),
        r["saturated"] / max(numel, 1),
        error / r["measured"] if r["measured"] else math.nan,
        sqnr,
        r["range_median"],
        r["range_max"],
    )


def quantisation_statistics(
    x: Tensor, fmt: BlockFormat, axis: int = -1
) -> QuantisationStatistics:
    """What quantising ``x`` to ``fmt`` along ``axis`` does to it: the fractions
    of its elements that flush to zero and saturate, the error (MSE and SQNR)
    and its blocks' dynamic range (see :class:`QuantisationStatistics`).
    Non-finite elements count in the fractions' denominators only.

    With round-to-nearest elements, ``"floor"`` MX scales saturate the
    largest elements of some blocks; NVFP4 with a static per-tensor scale
    (``tensor_amax``) can saturate whole blocks, which this does not see (it
    uses each tensor's own amax).

    Example::

        >>> from unit_scaling.formats import MXFP4
        >>> x = torch.tensor([[1.0, 1e-3, -3.3, 7.0]])
        >>> s = quantisation_statistics(x, MXFP4)
        >>> s.flushed, s.saturated, round(s.block_range_max, 2)
        (0.25, 0.25, 12.77)
    """
    if not isinstance(fmt, BlockFormat):
        raise TypeError(f"fmt must be a BlockFormat, got {type(fmt).__name__}")
    if not isinstance(x, Tensor) or not x.is_floating_point():
        kind = x.dtype if isinstance(x, Tensor) else type(x).__name__
        raise TypeError(f"x must be a floating-point tensor, got {kind}")
    if x.numel() == 0:
        return QuantisationStatistics(0.0, 0.0, math.nan, math.nan, 0.0, 0.0)
    raw = raw_quantisation_statistics(x, fmt, axis).tolist()
    return finish_quantisation_statistics(raw, x.numel())
