"""What the GPU check's sections share: the run's settings, time budgets,
targets, captured output and result files."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

# The libraries whose log records are ours to report (a user configures their
# logging; on stderr they would hide what torch prints).
OUR_LOGGERS = ("unit_scaling", "admin_torch")


@dataclasses.dataclass(frozen=True)
class Settings:
    """One run: the device compared against the CPU (``cpu`` itself in
    ``--cpu-check``), where results go, and whether shapes are tiny."""

    device: torch.device
    out: Path
    cpu_check: bool
    jobs: int
    models: tuple[str, ...] | None  # zoo models; None: every fast one


@dataclasses.dataclass
class Target:
    """One of the issue's targets and what this run measured for it."""

    name: str
    goal: str
    measured: str = "not measured"
    met: bool | None = None  # None: not measured

    @property
    def verdict(self) -> str:
        return {None: "not measured", True: "met", False: "not met"}[self.met]


@dataclasses.dataclass
class SectionResult:
    """A section's numbers (``data``, JSON), its markdown and its targets."""

    name: str
    data: dict[str, Any]
    markdown: str
    targets: list[Target]
    seconds: float = 0.0


class Deadline:
    """Seconds left of a section's budget, and whether a task of a given
    expected length still fits."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def fits(self, expected: float) -> bool:
        return self.left() >= expected


@contextlib.contextmanager
def captured_stderr() -> Iterator[list[str]]:
    """Everything written to file descriptor 2 inside the block (Python's
    ``sys.stderr`` and C/C++ code alike), appended to the yielded list as one
    string when the block ends."""
    text: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield text
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text.append(sink.read().decode(errors="replace"))


class _Collect(logging.Handler):
    def __init__(self, into: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(f"{record.levelname} {record.name}: {record.getMessage()}")


@contextlib.contextmanager
def collected_messages() -> Iterator[list[str]]:
    """Our libraries' log records (WARNING and above) and every Python warning
    raised inside the block, as lines in the yielded list: reported, not
    printed."""
    messages: list[str] = []
    handler = _Collect(messages)
    loggers = [logging.getLogger(name) for name in OUR_LOGGERS]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield messages
        messages.extend(f"{w.category.__name__}: {w.message}" for w in caught)
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def sqnr(approx: Tensor, exact: Tensor) -> float:
    """Signal-to-quantisation-noise ratio of ``approx`` against ``exact``, dB."""
    a, b = approx.detach().double(), exact.detach().double()
    noise = float((a - b).pow(2).mean())
    signal = float(b.pow(2).mean())
    return math.inf if noise == 0 else 10 * math.log10(signal / noise)


def seeded_randn(*shape: int, seed: int, device: torch.device) -> Tensor:
    """``N(0, 1)`` values drawn on the CPU from ``seed``, then moved: the same
    on every device."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator).to(device)


def markdown_table(headers: tuple[str, ...], rows: list[tuple[Any, ...]]) -> str:
    """A GitHub-flavoured markdown table."""
    lines = ["| " + " | ".join(headers) + " |"]
    lines.append("| " + " | ".join("---" for _ in headers) + " |")
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def short(text: str, limit: int = 160) -> str:
    """``text`` on one line, cut to ``limit`` characters."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def write_section(
    settings: Settings, result: SectionResult, environment: dict[str, Any]
) -> None:
    """``<out>/<section>.json`` and ``<out>/<section>.md``."""
    settings.out.mkdir(parents=True, exist_ok=True)
    payload = {
        "section": result.name,
        "environment": environment,
        "seconds": result.seconds,
        "data": result.data,
        "targets": [dataclasses.asdict(t) for t in result.targets],
        "markdown": result.markdown,
    }
    path = settings.out / f"{result.name}.json"
    path.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    (settings.out / f"{result.name}.md").write_text(result.markdown + "\n")


def turn_off_tf32() -> None:
    """Float32 matrix products and convolutions in float32 on a GPU, as on a
    CPU (TF32 would differ from the CPU by ~1e-3)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
