"""The one training loop of the demo, the CLI and the experiments."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from .. import functional as U
from ..parameter import is_unit_scaled

__all__ = ["History", "evaluate", "micro_batch_share", "smooth", "tail_mean", "train"]


@dataclass
class History:
    """Losses recorded by :func:`train`."""

    steps: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    validation_loss: list[float] = field(default_factory=list)
    tokens_per_second: float = math.nan
    seconds: float = 0.0  # wall time of the whole run, evaluations included

    @property
    def diverged(self) -> bool:
        """True if any recorded loss is not finite."""
        return not all(math.isfinite(x) for x in self.train_loss + self.validation_loss)

    @property
    def final_validation(self) -> float:
        """The last validation loss; NaN for a run that diverged."""
        return self.validation_loss[-1] if not self.diverged else math.nan


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
    *,
    accumulate: int = 1,
    loss_scale: float = 1.0,
) -> History:
    """Train for ``steps`` steps, evaluating on ``validation_batches`` periodically.

    Args:
        model: switched to train mode for steps and eval mode for evaluation.
        loss_fn: batch → scalar loss (e.g. ``model.loss``).
        optimizer: stepped once per batch.
        batches: an endless iterator of training batches.
        steps: number of optimizer steps.
        validation_batches: evaluated at step 0, every ``eval_every`` and at the end.
        eval_every: evaluation period in steps (0: only at the start and end).
        description: the progress bar's label.
        progress: show a progress bar (needs ``tqdm``, in the ``app`` extra:
            ``pip install "torch-unit-scaling[app]"``).
        schedule: optional learning-rate multiplier ``step → factor``.
        accumulate: equal micro-batches per step, whose gradients add up to
            one call's on the step's whole batch: for a unit-scaled model each
            micro-batch's loss goes through
            :func:`unit_scaling.functional.micro_batch_loss` (its gradient
            scaled by ``accumulate^-½``; see :mod:`unit_scaling.functional.steps`),
            for a plain one it is divided by ``accumulate`` (the plain mean).
            Either way the recorded loss is the step's mean.
        loss_scale: multiplies the loss before ``backward`` and divides the
            gradients after, as mixed-precision recipes do.

    Stops early (recording NaN) if the loss stops being finite.
    """
    if accumulate < 1:
        raise ValueError(f"accumulate must be >= 1, got {accumulate}")
    share = micro_batch_share(model)
    run_start = time.perf_counter()
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
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        value = 0.0
        for _ in range(accumulate):
            batch = next(batches)
            loss = loss_fn(batch)
            if accumulate > 1:
                loss = share(loss, 1 / accumulate)
            scaled = loss if loss_scale == 1.0 else loss * loss_scale
            scaled.backward()  # type: ignore[no-untyped-call]
            value += loss.item()
            tokens += batch[:, 1:].numel()
        if loss_scale != 1.0:
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.div_(loss_scale)
        optimizer.step()
        elapsed += time.perf_counter() - start
        history.steps.append(step)
        history.train_loss.append(value)
        if not math.isfinite(value):
            history.eval_steps.append(step)
            history.validation_loss.append(math.nan)
            break
        if step == steps or (eval_every and step % eval_every == 0):
            record_validation(step)
            bar.set_postfix(
                loss=f"{value:.3f}", val=f"{history.validation_loss[-1]:.3f}"
            )
        bar.update()
    bar.close()
    history.tokens_per_second = tokens / elapsed if elapsed else math.nan
    history.seconds = time.perf_counter() - run_start
    return history


def micro_batch_share(model: nn.Module) -> Callable[[Tensor, float], Tensor]:
    """How a micro-batch's loss enters the step, ``share(loss, fraction)``: the
    unit-scaled rule (:func:`unit_scaling.functional.micro_batch_loss`) for a
    unit-scaled model, the plain mean's ``loss * fraction`` for a plain one.

    Example::

        >>> share = micro_batch_share(uu.Linear(4, 4))
        >>> share(torch.tensor(2.0, requires_grad=True), 0.25).item()
        0.5
    """
    if is_unit_scaled(model):
        return U.micro_batch_loss
    return lambda loss, fraction: loss * fraction


def smooth(values: list[float], window: int = 10) -> list[float]:
    """Trailing moving average over ``window`` values (the per-step training
    loss is noisy).

    Example::

        >>> smooth([1.0, 3.0, 5.0], window=2)
        [1.0, 2.0, 4.0]
    """
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def tail_mean(values: list[float], n: int = 20) -> float:
    """Mean of the last ``n`` values (the last step alone is noisy).

    Example::

        >>> tail_mean([9.0, 1.0, 3.0], n=2)
        2.0
    """
    tail = values[-n:]
    return sum(tail) / len(tail) if tail else math.nan
