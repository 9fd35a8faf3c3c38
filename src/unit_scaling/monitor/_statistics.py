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
from ..transforms._tracking.statistics import RAW_FIELDS as TRACKING_FIELDS
from ..transforms._tracking.statistics import raw_statistics as tracking_statistics

__all__ = [
    "FORMATS",
    "PASS_SIZE",
    "RAW_SIZE",
    "STATISTICS",
    "finalize",
    "merge_raw",
    "raw_statistics",
    "read_back",
    "reduce_over_processes",
    "tensor_statistics",
    "to_raw",
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
# What ``track_scales``' one-pass kernel gives (its RAW_FIELDS), then the
# number of elements: a "pass" vector.
PASS_SIZE = len(TRACKING_FIELDS) + 1


def raw_statistics(tensor: Tensor, scale: float = 1.0) -> Tensor:
    """The sums and counts of ``tensor`` that :func:`finalize` reads (after
    :func:`to_raw`), as a float64 tensor on the tensor's device.

    With ``scale`` 1 this is one pass of ``track_scales``' kernel (a C++ pass on
    the CPU, fused torch ops elsewhere): a :data:`PASS_SIZE` vector. With
    another scale (what the tensor is multiplied by when cast to low
    precision), the counts are those of ``tensor * scale``, from separate torch
    ops: a :data:`RAW_SIZE` vector. Nothing is read back to the host.
    """
    if tensor.numel() == 0:
        return torch.zeros(RAW_SIZE, dtype=torch.float64, device=tensor.device)
    if scale == 1:
        return _one_pass(tensor)
    return _scaled(tensor, scale)


def _one_pass(tensor: Tensor) -> Tensor:
    out = tracking_statistics(tensor)
    numel = torch.full(
        (1,), float(tensor.numel()), dtype=torch.float64, device=out.device
    )
    return torch.cat([out, numel])


def _scaled(tensor: Tensor, scale: float) -> Tensor:
    magnitude = tensor.detach().abs()
    if magnitude.dtype not in (torch.float32, torch.float64):
        magnitude = magnitude.float()
    finite = magnitude.isfinite()
    finite_part = torch.where(finite, magnitude, 0.0)
    # Squares summed in float64: float32 squares overflow past 1.8e19.
    sum_squares = torch.linalg.vector_norm(finite_part, dtype=torch.float64).square()
    abs_max = magnitude.masked_fill(magnitude.isnan(), 0.0).amax()
    cast = magnitude * scale
    nonzero = cast > 0
    counts = [finite.sum()]
    for largest, flush in _LIMITS:
        counts.append((cast > largest).sum())
        counts.append((nonzero & (cast <= flush)).sum())
    numel = torch.full(
        (1,), float(tensor.numel()), dtype=torch.float64, device=tensor.device
    )
    rest = torch.stack(counts).double()
    return torch.cat(
        [numel, rest[:1], sum_squares.reshape(1), abs_max.double().reshape(1), rest[1:]]
    )


def to_raw(values: list[float]) -> list[float]:
    """A vector of :func:`raw_statistics`, read back to the host, as the
    additive raw vector (a pass vector converted; a raw one as it is)."""
    if len(values) == RAW_SIZE:
        return values
    v = dict(zip(TRACKING_FIELDS, values, strict=False))
    numel = values[-1]
    finite = v["finite"]
    return [
        numel,
        finite,
        v["m2"] + finite * v["mean"] ** 2,
        v["abs_max"],
        v["e4m3_over"],
        v["e4m3_flush"] - v["zeros"],
        v["e5m2_over"],
        v["e5m2_flush"] - v["zeros"],
        v["fp16_over"],
        v["fp16_flush"] - v["zeros"],
    ]


def merge_raw(raws: list[list[float]]) -> list[float]:
    """One raw vector from several (host lists): the statistics of all their
    tensors taken together."""
    merged = [sum(column) for column in zip(*raws, strict=True)]
    merged[_ABS_MAX] = max(raw[_ABS_MAX] for raw in raws)
    return merged


def read_back(vectors: list[Tensor]) -> list[list[float]]:
    """Vectors of :func:`raw_statistics` (any devices) as additive raw vectors
    on the host, with one read back per device and kind of vector."""
    out: list[list[float] | None] = [None] * len(vectors)
    batches: dict[tuple[torch.device, int], list[int]] = {}
    for i, v in enumerate(vectors):
        batches.setdefault((v.device, v.numel()), []).append(i)
    for indices in batches.values():
        rows = torch.stack([vectors[i] for i in indices]).tolist()
        for i, row in zip(indices, rows, strict=True):
            out[i] = to_raw(row)
    return [row for row in out if row is not None]


def reduce_over_processes(
    raws: list[list[float]], device: torch.device
) -> list[list[float]]:
    """Raw vectors, each summed over the processes of ``torch.distributed`` (its
    abs max the largest), communicated on ``device``. Summing is right for
    sharded and replicated tensors alike: a replicated tensor counts each
    element once per process, which no statistic sees."""
    if not (dist.is_available() and dist.is_initialized()):
        return raws
    if dist.get_world_size() == 1 or not raws:
        return raws
    sums = torch.tensor(raws, dtype=torch.float64, device=device)
    maxima = sums[:, _ABS_MAX].contiguous()
    sums[:, _ABS_MAX] = 0
    dist.all_reduce(sums)
    dist.all_reduce(maxima, op=dist.ReduceOp.MAX)
    sums[:, _ABS_MAX] = maxima
    result: list[list[float]] = sums.tolist()
    return result


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
    return finalize(to_raw(raw_statistics(tensor, scale).tolist()))
