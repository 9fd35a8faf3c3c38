"""What the experiments share: models, the training loop (with the sweeps'
schedule and validation set, :mod:`unit_scaling.app.sweep`), and running many
independent training runs on all CPU cores.

Every run builds its model from a fixed seed, reads the same training batches in
the same order and uses one CPU thread, so a run's numbers do not depend on how
many runs share the machine (``--jobs``).
"""

from __future__ import annotations

import argparse
import functools
import math
import multiprocessing
import os
import textwrap
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

import unit_scaling as uu
from unit_scaling.app import training
from unit_scaling.app.baseline import StandardTransformerDecoder
from unit_scaling.app.sweep import validation_set as validation_set  # (re-exported)
from unit_scaling.app.sweep import warmup_cosine
from unit_scaling.data import VOCAB_SIZE

DOCS = Path(__file__).resolve().parents[1] / "docs" / "results"
HEAD_SIZE = 32
PARAMETRISATIONS = ("SP", "u-μP")
T = TypeVar("T")
R = TypeVar("R")


def model_factory(
    parametrisation: str, width: int, layers: int
) -> Callable[..., nn.Module]:
    """``factory(**multipliers)``: the decoder of the demo, SP (GPT-2 init; no
    multipliers) or u-μP, head size 32; picklable, for a sweep's processes."""
    heads = max(1, width // HEAD_SIZE)
    sizes = dict(vocab_size=VOCAB_SIZE, layers=layers, heads=heads)
    if parametrisation == "u-μP":
        return functools.partial(uu.TransformerDecoder, hidden_size=width, **sizes)
    if parametrisation == "SP":
        return functools.partial(StandardTransformerDecoder, hidden_size=width, **sizes)
    raise ValueError(f"parametrisation must be one of {PARAMETRISATIONS}")


def make_model(parametrisation: str, width: int, layers: int, seed: int) -> nn.Module:
    """The decoder of :func:`model_factory`, built from ``seed``."""
    torch.manual_seed(seed)
    return model_factory(parametrisation, width, layers)()


def optimizer_factory(parametrisation: str) -> Callable[..., torch.optim.Optimizer]:
    """``optimizer(params, lr=lr)``: AdamW without weight decay, with u-μP's
    per-tensor lr rules or torch's one lr."""
    if parametrisation == "u-μP":
        return uu.optim.AdamW
    return functools.partial(torch.optim.AdamW, weight_decay=0.0)


def make_optimizer(
    parametrisation: str, model: nn.Module, lr: float
) -> torch.optim.Optimizer:
    """The optimizer of :func:`optimizer_factory` for ``model``."""
    return optimizer_factory(parametrisation)(model.parameters(), lr=lr)


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
    with the sweeps' learning-rate schedule (:func:`warmup_cosine`) and no
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
        schedule=lambda step: warmup_cosine(step, steps, warmup),
        accumulate=accumulate,
        loss_scale=loss_scale,
    )
    return Curve(
        history.train_loss,
        history.eval_steps,
        history.validation_loss,
        history.seconds,
    )


def optimum(losses: Mapping[float, float]) -> tuple[float, float]:
    """The grid optimum (log2 lr) and a sub-grid estimate: the vertex of the
    parabola through it and its two neighbours, in log2 lr."""
    finite = {k: v for k, v in losses.items() if math.isfinite(v)}
    best = min(finite, key=finite.__getitem__)
    left, right = finite.get(best - 1), finite.get(best + 1)
    if left is None or right is None:
        return best, float(best)
    curvature = left - 2 * finite[best] + right
    if curvature <= 0:
        return best, float(best)
    return best, best + (left - right) / (2 * curvature)


def plot_lr_curves(
    ax: Any, losses: Mapping[int, Mapping[float, float]], cap: float
) -> None:
    """On ``ax``, validation loss against log2 lr, one curve per width (narrow
    to wide, dark to light), each optimum starred; losses above ``cap`` are
    drawn at ``cap`` as ▲ and diverged runs as ×."""
    import matplotlib

    colours = matplotlib.colormaps["viridis"]
    widths = sorted(losses)
    for i, width in enumerate(widths):
        colour = colours(i / max(1, len(widths) - 1) * 0.9)
        row = losses[width]
        xs = sorted(row)
        ys = [min(row[x], cap) if math.isfinite(row[x]) else cap for x in xs]
        ax.plot(xs, ys, "o-", color=colour, markersize=4, label=f"width {width}")
        above = [x for x in xs if row[x] >= cap and math.isfinite(row[x])]
        diverged = [x for x in xs if not math.isfinite(row[x])]
        ax.plot(above, [cap] * len(above), "^", color=colour, markersize=7)
        ax.plot(
            diverged,
            [cap] * len(diverged),
            "x",
            color=colour,
            markersize=10,
            markeredgewidth=2.5,
        )
        best, _ = optimum(row)
        ax.plot(
            best,
            row[best],
            "*",
            color=colour,
            markersize=17,
            markeredgecolor="k",
            zorder=5,
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
    """Re-wrap the plain paragraphs of ``markdown`` (not tables, lists, headings,
    images or code blocks, which must hold no blank line) after numbers have been
    substituted into them."""
    blocks = []
    for block in markdown.strip().split("\n\n"):
        if block.startswith(("|", "-", "#", "!", "```")):
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


def lr_table(losses: dict[int, dict[float, float]], grid: tuple[int, ...]) -> str:
    """Validation loss by width (rows) and log2 learning rate (columns), the
    optimum in bold, with the optimum and the parabola-fitted optimum."""
    rows = []
    for width, row in sorted(losses.items()):
        best, fitted = optimum(row)
        cells = [
            "diverged"
            if not math.isfinite(row[x])
            else f"**{row[x]:.3f}**"
            if x == best
            else f"{row[x]:.3f}"
            for x in grid
        ]
        rows.append((width, *cells, f"2^{best:g}", f"2^{fitted:.2f}"))
    return markdown_table(
        ("width", *(f"2^{x}" for x in grid), "optimum", "fitted"), rows
    )


class LanguageModel(nn.Module):
    """A Hugging Face causal LM with the ``loss(batch)`` the training loop calls
    (the model shifts the labels itself)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def loss(self, batch: Tensor) -> Tensor:
        loss: Tensor = self.model(input_ids=batch, labels=batch).loss
        return loss
