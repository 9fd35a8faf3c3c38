"""The statistics the monitor records per tensor.

:func:`raw_statistics` reduces a tensor to a few sums and counts on its device,
without a synchronisation; sums of several tensors (the micro-batches of a step,
the processes of a data-parallel job) merge with :func:`merge_raw`; and
:func:`finalize` turns them into :data:`STATISTICS` on the host.

Definitions (those of ``track_scales``; every fraction has one denominator, the
number of elements):

- ``rms``: the root mean square of the finite elements (``inf`` if there are
  none).
- ``abs_max``: the largest magnitude, infinities included, NaN ignored.
- ``log2_rms``: ``log2(rms)``: the distance from unit scale, in binades.
- ``<format>_saturated``: the fraction of elements whose magnitude, times the
  scale the tensor gets when cast, is above the format's largest finite value
  (infinities included): what a saturating cast clips.
- ``<format>_flushed``: the fraction of elements, not zero, that round to zero
  in the format (magnitude times the scale at most half the smallest
  subnormal; the tie goes to the even encoding, zero). Exact zeros, ``+0`` and
  ``-0`` alike, are not counted: they lose nothing.
- ``nonfinite``: the fraction of elements that are ``inf`` or NaN.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import Tensor

from ..formats import FP8_E4M3, FP8_E5M2, FPFormat

__all__ = [
    "FORMATS",
    "RAW_SIZE",
    "STATISTICS",
    "finalize",
    "merge_raw",
    "raw_statistics",
    "reduce_over_processes",
    "tensor_statistics",
]

FORMATS: dict[str, FPFormat] = {
    "e4m3": FP8_E4M3,
    "e5m2": FP8_E5M2,
    "fp16": FPFormat(5, 10),
}
"""The formats whose saturation and flushing the monitor measures, by name."""

STATISTICS: tuple[str, ...] = (
    "rms",
    "abs_max",
    "log2_rms",
    *(f"{name}_{what}" for name in FORMATS for what in ("saturated", "flushed")),
    "nonfinite",
)
"""The statistics of one tensor, in the order :func:`finalize` gives them."""

_LIMITS = [
    (fmt.max_absolute_value, fmt.min_absolute_subnormal / 2) for fmt in FORMATS.values()
]
# The raw accumulators: [numel, finite, sum of squares, abs_max, then a
# (saturated, flushed) pair of counts per format]. All but abs_max add.
_ABS_MAX = 3
RAW_SIZE = 4 + 2 * len(FORMATS)


def raw_statistics(tensor: Tensor, scale: float = 1.0) -> Tensor:
    """The sums and counts of ``tensor`` that :func:`finalize` reads, as a
    float64 tensor of :data:`RAW_SIZE` on the tensor's device.

    ``scale`` is what the tensor is multiplied by when cast to a low-precision
    format (a static FP8 scale; 1 for a unit-scaled tensor, or one that is not
    scaled): the saturating and flushing fractions are those of
    ``tensor * scale``. Nothing is read back to the host.
    """
    magnitude = tensor.detach().abs()
    if magnitude.dtype not in (torch.float32, torch.float64):
        magnitude = magnitude.float()
    if magnitude.numel() == 0:
        return torch.zeros(RAW_SIZE, dtype=torch.float64, device=tensor.device)
    finite = magnitude.isfinite()
    finite_part = torch.where(finite, magnitude, 0.0)
    # Squares summed in float64: float32 squares overflow past 1.8e19.
    sum_squares = torch.linalg.vector_norm(finite_part, dtype=torch.float64).square()
    abs_max = magnitude.masked_fill(magnitude.isnan(), 0.0).amax()
    cast = magnitude if scale == 1 else magnitude * scale
    nonzero = cast > 0
    counts = [finite.sum()]
    for largest, flush in _LIMITS:
        counts.append((cast > largest).sum())
        counts.append((nonzero & (cast <= flush)).sum())
    numel = torch.tensor(
        [float(tensor.numel())], dtype=torch.float64, device=tensor.device
    )
    rest = torch.stack(counts).double()
    return torch.cat(
        [numel, rest[:1], sum_squares.reshape(1), abs_max.double().reshape(1), rest[1:]]
    )


def merge_raw(raws: Tensor) -> Tensor:
    """One raw vector from a stack of them (``(n, RAW_SIZE)``): the statistics
    of all their tensors taken together."""
    merged = raws.sum(0)
    merged[_ABS_MAX] = raws[:, _ABS_MAX].amax()
    return merged


def reduce_over_processes(raws: Tensor) -> Tensor:
    """Rows of raw vectors (``(n, RAW_SIZE)``), each summed over the processes
    of ``torch.distributed`` (its abs max the largest), on the CPU. Summing is
    right for sharded and replicated tensors alike: a replicated tensor counts
    each element once per process, which no statistic sees."""
    if not (dist.is_available() and dist.is_initialized()):
        return raws.cpu()
    if dist.get_world_size() == 1:
        return raws.cpu()
    sums = raws.clone()
    sums[:, _ABS_MAX] = 0
    maxima = raws[:, _ABS_MAX].contiguous()
    dist.all_reduce(sums)
    dist.all_reduce(maxima, op=dist.ReduceOp.MAX)
    sums[:, _ABS_MAX] = maxima
    return sums.cpu()


def finalize(raw: list[float]) -> dict[str, float]:
    """:data:`STATISTICS` from one raw vector read back to the host."""
    numel, finite, sum_squares, abs_max, *counts = raw
    if finite > 0:
        rms = math.sqrt(sum_squares / finite)
    else:
        rms = math.inf if numel > 0 else 0.0
    denominator = max(numel, 1.0)
    values = {
        "rms": rms,
        "abs_max": abs_max,
        "log2_rms": math.log2(rms) if rms > 0 else -math.inf,
    }
    for i, name in enumerate(FORMATS):
        values[f"{name}_saturated"] = counts[2 * i] / denominator
        values[f"{name}_flushed"] = counts[2 * i + 1] / denominator
    values["nonfinite"] = (numel - finite) / denominator
    return values


def tensor_statistics(tensor: Tensor, scale: float = 1.0) -> dict[str, float]:
    """The :data:`STATISTICS` of one tensor (reads them back to the host).

    Example::

        >>> t = torch.tensor([0.0, -0.0, 1e-9, 500.0])
        >>> stats = tensor_statistics(t)
        >>> stats["e4m3_saturated"], stats["e4m3_flushed"], stats["fp16_flushed"]
        (0.25, 0.25, 0.25)
    """
    if not isinstance(tensor, Tensor) or not tensor.is_floating_point():
        got = tensor.dtype if isinstance(tensor, Tensor) else type(tensor).__name__
        raise TypeError(
            f"tensor_statistics: expected a floating-point tensor, got {got}"
        )
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(
            f"tensor_statistics: scale must be a positive finite number, got {scale!r}"
        )
    return finalize(raw_statistics(tensor, scale).tolist())
