"""What ``fp8_training.py`` and ``lr_transfer.py`` share: models, the training
loop, and running many independent training runs on all CPU cores.

Every run builds its model from a fixed seed, reads the same training batches in
the same order and uses one CPU thread, so a run's numbers do not depend on how
many runs share the machine (``--jobs``).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import textwrap
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

import unit_scaling as uu
from unit_scaling.app import training
from unit_scaling.app.baseline import StandardTransformerDecoder
from unit_scaling.data import VOCAB_SIZE, Corpus

DOCS = Path(__file__).resolve().parents[1] / "docs" / "results"
HEAD_SIZE = 32
PARAMETRISATIONS = ("SP", "u-μP")
T = TypeVar("T")
R = TypeVar("R")


def make_model(parametrisation: str, width: int, layers: int, seed: int) -> nn.Module:
    """The decoder of the demo: SP (GPT-2 init) or u-μP, head size 32."""
    torch.manual_seed(seed)
    heads = max(1, width // HEAD_SIZE)
    if parametrisation == "u-μP":
        return uu.TransformerDecoder(width, VOCAB_SIZE, layers, heads)
    if parametrisation == "SP":
        return StandardTransformerDecoder(width, VOCAB_SIZE, layers, heads)
    raise ValueError(f"parametrisation must be one of {PARAMETRISATIONS}")


def make_optimizer(
    parametrisation: str, model: nn.Module, lr: float
) -> torch.optim.Optimizer:
    """AdamW without weight decay: u-μP's per-tensor lr rules, or torch's one lr."""
    if parametrisation == "u-μP":
        return uu.optim.AdamW(model.parameters(), lr=lr)
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)


def lr_factor(step: int, steps: int, warmup: int) -> float:
    """Linear warmup over ``warmup`` steps, then cosine decay to 10% at ``steps``."""
    if step <= warmup:
        return step / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.1 + 0.45 * (1 + math.cos(math.pi * progress))


def validation_set(
    corpus: Corpus, batches: int, batch_size: int, seq_len: int
) -> list[Tensor]:
    """A fixed validation set: the same ``batches`` batches for every run."""
    return [
        corpus.get_batch("validation", batch_size, seq_len, generator=i)
        for i in range(batches)
    ]


@dataclass
class Curve:
    """Losses of one training run."""

    train_loss: list[float] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def diverged(self) -> bool:
        return not all(math.isfinite(x) for x in self.train_loss + self.val_loss)

    @property
    def final_val(self) -> float:
        return self.val_loss[-1] if not self.diverged else math.nan


def train(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Iterable[Tensor],
    steps: int,
    validation: list[Tensor],
    *,
    accumulate: int = 1,
    loss_scale: float = 1.0,
    warmup: int = 0,
    eval_every: int = 0,
) -> Curve:
    """The package's training loop (:func:`unit_scaling.app.training.train`)
    with the experiments' learning-rate schedule (:func:`lr_factor`) and no
    progress bar: ``steps`` optimizer steps of ``accumulate`` micro-batches
    each, ``loss_scale`` as there; the validation loss is measured every
    ``eval_every`` steps (0: only at the start and the end)."""
    history = training.train(
        model,
        model.loss,  # type: ignore[arg-type]
        optimizer,
        iter(batches),
        steps,
        validation,
        eval_every,
        progress=False,
        schedule=lambda step: lr_factor(step, steps, warmup),
        accumulate=accumulate,
        loss_scale=loss_scale,
    )
    return Curve(
        history.train_loss,
        history.eval_steps,
        history.validation_loss,
        history.seconds,
    )


def _one_thread(fn: Callable[[T], R], task: T) -> R:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn(task)
    finally:  # (in-process runs must leave the caller's setting alone)
        torch.set_num_threads(threads)


def _indexed(args: tuple[Callable[[Any], Any], int, Any]) -> tuple[int, Any]:
    fn, index, task = args
    return index, _one_thread(fn, task)


def run_all(
    fn: Callable[[T], R],
    tasks: Sequence[T],
    jobs: int,
    describe: Callable[[T, R], str] = lambda task, result: str(task),
) -> list[R]:
    """``[fn(t) for t in tasks]``, ``jobs`` at a time in fresh processes, one
    CPU thread each; prints a line as each finishes. ``fn`` must be importable
    (a module-level function) when ``jobs > 1``."""
    results: list[Any] = [None] * len(tasks)
    start = time.perf_counter()

    def report(done: int, index: int) -> None:
        elapsed = time.perf_counter() - start
        line = describe(tasks[index], results[index])
        print(f"[{done}/{len(tasks)} {elapsed:5.0f} s] {line}", flush=True)

    if jobs <= 1:
        for index, task in enumerate(tasks):
            results[index] = _one_thread(fn, task)
            report(index + 1, index)
        return results
    # "spawn": forking a process whose OpenMP thread pool is running can hang.
    context = multiprocessing.get_context("spawn")
    with context.Pool(min(jobs, len(tasks))) as pool:
        work = [(fn, i, t) for i, t in enumerate(tasks)]
        for done, (index, result) in enumerate(pool.imap_unordered(_indexed, work)):
            results[index] = result
            report(done + 1, index)
    return results


def run_parser(description: str | None) -> argparse.ArgumentParser:
    """A parser with the options of how an experiment runs, not what it runs
    (``--jobs`` and ``--out``); the experiment's ``Config`` adds the rest
    (:func:`unit_scaling.app.config.parse_config`)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--jobs",
        type=int,
        default=default_jobs(),
        help="runs in parallel, one thread each (default: CPU count)",
    )
    parser.add_argument("--out", type=Path, default=DOCS)
    return parser


def default_jobs() -> int:
    return os.cpu_count() or 1


def timing_note(seconds: float, jobs: int) -> str:
    """How long the run took and on what, for the reports."""
    load = os.getloadavg()[2] if hasattr(os, "getloadavg") else math.nan
    return (
        f"{seconds / 60:.1f} min on {os.cpu_count()} CPU cores ({jobs} "
        f"run{'s' if jobs != 1 else ''} at a time, one thread each; load average "
        f"over the last 15 min: {load:.1f})"
    )


def reflow(markdown: str, width: int = 88) -> str:
    """Re-wrap the plain paragraphs of ``markdown`` (not tables, lists, headings
    or images) after numbers have been substituted into them."""
    blocks = []
    for block in markdown.strip().split("\n\n"):
        if block.startswith(("|", "-", "#", "!")):
            blocks.append(block)
        else:
            blocks.append(
                textwrap.fill(
                    " ".join(block.split()),
                    width,
                    break_long_words=False,
                    break_on_hyphens=False,
                )
            )
    return "\n\n".join(blocks) + "\n"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A markdown table; numeric columns (all but the first) right-aligned."""
    lines = [
        "| " + " | ".join(header) + " |",
        "| --- |" + " ---: |" * (len(header) - 1),
    ]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
