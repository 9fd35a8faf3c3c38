"""The statistics :func:`track_scales` records per tensor: :class:`Metrics`,
and :func:`finalize`, which derives them from the raw sums of ``statistics``."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

from torch import Tensor

from ...formats import BlockFormat
from ...formats._statistics import (
    finish_quantisation_statistics,
    raw_quantisation_statistics,
)
from .statistics import RAW_FIELDS, raw_statistics

__all__ = ["Metrics", "finalize"]


class Metrics:
    """Scale statistics of one tensor: ``fwd`` (its value), ``bwd`` (its gradient).

    ``bwd`` is ``None`` until a backward pass reaches the tensor.
    """

    @dataclasses.dataclass
    class Data:
        """Statistics of one tensor."""

        mean_abs: float
        abs_mean: float
        std: float
        abs_max: float
        abs_min: float
        numel: int
        e4m3_overflow: float = 0.0
        e4m3_underflow: float = 0.0
        e5m2_overflow: float = 0.0
        e5m2_underflow: float = 0.0
        block_flushed: float = math.nan
        block_saturated: float = math.nan
        block_mse: float = math.nan
        block_sqnr_db: float = math.nan
        block_range_median: float = math.nan
        block_range_max: float = math.nan

        @staticmethod
        def from_tensor(
            t: Tensor, block_format: BlockFormat | None = None
        ) -> Metrics.Data:
            """Compute the statistics of ``t`` (synchronises with the device),
            with ``block_format``'s (see :func:`track_scales`) if given."""
            raw = raw_statistics(t).tolist() if t.numel() else None
            if raw is not None and block_format is not None:
                raw += raw_quantisation_statistics(t, block_format).tolist()
            return finalize(raw, t.numel())

    _FULL_NAMES: ClassVar[dict[str, str]] = {
        "mean_abs": "mean absolute value",
        "abs_mean": "absolute mean value",
        "std": "standard deviation",
        "abs_max": "absolute maximum",
        "abs_min": "absolute minimum",
        "numel": "number of elements",
        "e4m3_overflow": "fraction above the E4M3 maximum",
        "e4m3_underflow": "fraction flushed to zero in E4M3",
        "e5m2_overflow": "fraction above the E5M2 maximum",
        "e5m2_underflow": "fraction flushed to zero in E5M2",
        "block_flushed": "fraction flushed to zero in the block format",
        "block_saturated": "fraction saturated in the block format",
        "block_mse": "mean squared error in the block format",
        "block_sqnr_db": "signal-to-quantisation-noise ratio (dB), block format",
        "block_range_median": "median dynamic range of a block (binades)",
        "block_range_max": "largest dynamic range of a block (binades)",
    }

    def __init__(self, fwd: Metrics.Data, bwd: Metrics.Data | None = None) -> None:
        self.fwd = fwd
        self.bwd = bwd

    def __repr__(self) -> str:
        return f"Metrics(fwd={self.fwd}, bwd={self.bwd})"

    @staticmethod
    def names() -> list[str]:
        """Field names of :class:`Metrics.Data`."""
        return [f.name for f in dataclasses.fields(Metrics.Data)]

    @staticmethod
    def full_names() -> list[str]:
        """Readable names of :class:`Metrics.Data` fields."""
        return [Metrics._FULL_NAMES[n] for n in Metrics.names()]

    @staticmethod
    def get_full_name(name: str) -> str:
        """The readable name of one field, e.g. ``"mean_abs"``."""
        if name not in Metrics._FULL_NAMES:
            raise ValueError(
                f"unknown metric {name!r}; expected one of {Metrics.names()}"
            )
        return Metrics._FULL_NAMES[name]


def finalize(raw: list[float] | None, numel: int) -> Metrics.Data:
    """:class:`Metrics.Data` from raw statistics (``None`` for an empty tensor).

    Means and the standard deviation (with Bessel's correction; 0 for one
    element) are over the finite elements, so that a mask holding ``-inf``
    still reports the scale of its finite part; the maximum shows infinities,
    and they count as FP8 overflow. NaN is ignored. A tensor with no finite
    element reports its means and standard deviation as ``inf`` (NaN if it
    holds NaN), never a misleading 0. Empty tensors give zeros. Raw
    statistics longer than ``RAW_FIELDS`` end with a block format's
    (``formats._statistics.RAW_FIELDS``); without them the block fields are NaN.
    """
    if raw is None or numel == 0:
        return Metrics.Data(0.0, 0.0, 0.0, 0.0, 0.0, 0)
    block: tuple[float, ...] = (math.nan,) * 6
    if len(raw) > len(RAW_FIELDS):  # a block format's statistics follow
        block = finish_quantisation_statistics(raw[len(RAW_FIELDS) :], numel)
        raw = raw[: len(RAW_FIELDS)]
    r = dict(zip(RAW_FIELDS, raw, strict=True))
    finite = r["finite"]
    if finite == 0:
        mean_abs = abs_mean = std = math.nan if numel > r["infs"] else math.inf
    else:
        # Equal for a tensor of one sign (see _statistics.RAW_FIELDS).
        mean_abs = r["sum_abs"] / finite
        abs_mean = abs(r["sum"]) / finite
        std = math.sqrt(r["m2"] / max(finite - 1, 1))
    return Metrics.Data(
        mean_abs,
        abs_mean,
        std,
        r["abs_max"],
        r["abs_min"],
        numel,
        r["e4m3_over"] / numel,
        (r["e4m3_flush"] - r["zeros"]) / numel,
        r["e5m2_over"] / numel,
        (r["e5m2_flush"] - r["zeros"]) / numel,
        *block,
    )
