"""Quantisation speed: ``FPFormat.quantise`` against one elementwise pass.

A 16M-element float32 tensor. Every time is a ratio to ``x * 1.0``, one
out-of-place elementwise pass (read the tensor, write a new one): no out-of-place
quantisation can beat it. Target: round-to-nearest in at most 1.5 of it. The native
cast round trip ``x.to(float8).to(float32)`` is shown for comparison. The first call
of each format compiles its kernel; that happens during warm-up.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import torch

from unit_scaling.formats import FP8_E4M3, FP8_E5M2, FPFormat

from ._measure import interleaved_medians, table

NUMEL = 1 << 24


def run(rounds: int = 30) -> str:
    """Time quantisation to E4M3/E5M2 with both roundings; return the table."""
    torch.manual_seed(0)
    x = torch.randn(NUMEL) * 16
    formats: dict[str, FPFormat] = {
        "FP8_E4M3 (E4M3FN-RN)": FP8_E4M3,
        "FP8_E5M2 (E5M2-RN)": FP8_E5M2,
        "E4M3FN-SR": dataclasses.replace(FP8_E4M3, rounding="stochastic"),
        "E5M2-SR": dataclasses.replace(FP8_E5M2, rounding="stochastic"),
        "E4M3-RN (IEEE-like, generic kernel)": FPFormat(4, 3, "nearest"),
        "E4M3-SR (IEEE-like)": FPFormat(4, 3, "stochastic"),
    }
    candidates: dict[str, Callable[[], object]] = {
        "x * 1.0": lambda: x * 1.0,
        "native cast float8_e4m3fn": lambda: x.to(torch.float8_e4m3fn).to(x.dtype),
        "native cast float8_e5m2": lambda: x.to(torch.float8_e5m2).to(x.dtype),
    }
    for name, fmt in formats.items():
        candidates[name] = functools.partial(fmt.quantise, x)
    times = interleaved_medians(candidates, rounds)
    floor = times["x * 1.0"]
    rows: list[tuple[str, ...]] = []
    for name, seconds in times.items():
        nearest = name in formats and formats[name].rounding == "nearest"
        rows.append(
            (
                name,
                f"{seconds * 1e3:.1f}",
                f"{seconds / floor:.2f}",
                "≤ 1.5" if nearest else "",
            )
        )
    return (
        f"Quantisation: {NUMEL:,} float32 elements, {torch.get_num_threads()} "
        f"threads, median of {rounds} interleaved calls\n"
        + table(rows, ("operation", "ms", "ratio to x * 1.0", "target"))
    )


if __name__ == "__main__":
    print(run())
