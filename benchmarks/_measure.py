"""Timing and memory measurement shared by the benchmarks.

Candidates are always measured side by side in one process, interleaved (each
round runs every candidate once, in rotating order) so that drift in machine load
affects them alike; we report medians.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def interleaved_times(
    candidates: dict[str, Callable[[], object]], rounds: int, warmup: int = 3
) -> dict[str, list[float]]:
    """Wall-clock seconds of every call of each candidate, measured interleaved.

    Round ``r`` runs every candidate once, in an order rotated by ``r``, so the
    ``r``-th times of two candidates were taken moments apart.
    """
    names = list(candidates)
    for name in names:
        for _ in range(warmup):
            candidates[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            start = time.perf_counter()
            candidates[name]()
            times[name].append(time.perf_counter() - start)
    return times


def interleaved_medians(
    candidates: dict[str, Callable[[], object]], rounds: int, warmup: int = 3
) -> dict[str, float]:
    """Median wall-clock seconds per call of each candidate, measured interleaved."""
    times = interleaved_times(candidates, rounds, warmup)
    return {name: statistics.median(ts) for name, ts in times.items()}


def paired_ratio(times: dict[str, list[float]], ours: str, baseline: str) -> float:
    """Median over rounds of ``ours / baseline``, each ratio taken within a round.

    On a shared machine whose speed drifts between rounds this is steadier than
    the ratio of the two medians: both calls of a round see the same load.
    """
    return statistics.median(
        a / b for a, b in zip(times[ours], times[baseline], strict=True)
    )


def peak_memory_bytes(step: Callable[[], object], *roots: object) -> int:
    """Peak bytes of live CPU tensors during one call of ``step``.

    ``roots`` are modules and optimizers whose existing state (parameters,
    gradients, optimizer moments) counts towards the peak.
    """
    # MemTracker is torch's own dispatch-mode memory tracker; it works on CPU,
    # where torch has no allocator statistics. It is private API, used only here.
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(*roots)  # type: ignore[arg-type]
    with tracker:
        step()
    snapshot = tracker.get_tracker_snapshot("peak")
    return int(snapshot[torch.device("cpu")]["Total"])


def table(rows: list[tuple[str, ...]], headers: tuple[str, ...]) -> str:
    """A plain-text table with aligned columns."""
    cells = [headers, *rows]
    widths = [max(len(str(row[i])) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True))
        for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def json_from_subprocess(module: str, *args: str) -> Any:
    """The JSON on the last stdout line of ``python -m module *args``, run in a
    fresh interpreter from the repository root."""
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])
