"""A minimal, readable training loop shared by the demo, the CLI and experiments."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["History", "evaluate", "train"]


@dataclass
class History:
    """Losses recorded by :func:`train`."""

    steps: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    validation_loss: list[float] = field(default_factory=list)
    tokens_per_second: float = math.nan

    @property
    def diverged(self) -> bool:
        """True if any recorded loss is not finite."""
        return not all(math.isfinite(x) for x in self.train_loss + self.validation_loss)


class _NoBar:
    """The part of tqdm's bar that :func:`train` uses, doing nothing."""

    def update(self) -> None:
        pass

    def set_postfix(self, **values: str) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(steps: int, description: str, progress: bool) -> Any:
    """A tqdm bar over ``steps``; nothing if ``progress`` is off."""
    if not progress:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError as error:
        raise ImportError(
            "train(progress=True) draws its progress bar with tqdm, which is not "
            'installed: pip install "torch-unit-scaling[app]", or pass '
            "progress=False"
        ) from error
    return tqdm(total=steps, desc=description, leave=False)


@torch.no_grad()
def evaluate(loss_fn: Callable[[Tensor], Tensor], batches: list[Tensor]) -> float:
    """Mean of ``loss_fn`` over fixed ``batches``."""
    return sum(loss_fn(b).item() for b in batches) / len(batches)


def train(
    model: nn.Module,
    loss_fn: Callable[[Tensor], Tensor],
    optimizer: torch.optim.Optimizer,
    batches: Iterator[Tensor],
    steps: int,
    validation_batches: list[Tensor],
    eval_every: int = 50,
    description: str = "train",
    progress: bool = True,
    schedule: Callable[[int], float] | None = None,
) -> History:
    """Train for ``steps`` steps, evaluating on ``validation_batches`` periodically.

    Args:
        model: switched to train mode for steps and eval mode for evaluation.
        loss_fn: batch → scalar loss (e.g. ``model.loss``).
        optimizer: stepped once per batch.
        batches: an endless iterator of training batches.
        steps: number of optimizer steps.
        validation_batches: evaluated at step 0, every ``eval_every`` and at the end.
        eval_every: evaluation period in steps.
        description: the progress bar's label.
        progress: show a progress bar (needs ``tqdm``, in the ``app`` extra:
            ``pip install "torch-unit-scaling[app]"``).
        schedule: optional learning-rate multiplier ``step → factor``.

    Stops early (recording NaN) if the loss stops being finite.
    """
    history = History()
    base_lrs = [group["lr"] for group in optimizer.param_groups]
    tokens = 0
    elapsed = 0.0

    def record_validation(step: int) -> None:
        model.eval()
        history.eval_steps.append(step)
        history.validation_loss.append(evaluate(loss_fn, validation_batches))
        model.train()

    record_validation(0)
    bar = _progress_bar(steps, description, progress)
    for step in range(1, steps + 1):
        if schedule is not None:
            for group, lr in zip(optimizer.param_groups, base_lrs, strict=True):
                group["lr"] = lr * schedule(step)
        batch = next(batches)
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(batch)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        value = loss.item()
        elapsed += time.perf_counter() - start
        tokens += batch[:, 1:].numel()
        history.steps.append(step)
        history.train_loss.append(value)
        if not math.isfinite(value):
            history.eval_steps.append(step)
            history.validation_loss.append(math.nan)
            break
        if step % eval_every == 0 or step == steps:
            record_validation(step)
            bar.set_postfix(
                loss=f"{value:.3f}", val=f"{history.validation_loss[-1]:.3f}"
            )
        bar.update()
    bar.close()
    history.tokens_per_second = tokens / elapsed if elapsed else math.nan
    return history
