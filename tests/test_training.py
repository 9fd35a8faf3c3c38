"""The shared training loop: what it records, when it evaluates, its schedule,
divergence, and the progress bar as an optional dependency."""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Iterator

import pytest
import torch
from torch import Tensor

import unit_scaling as uu
from unit_scaling.app.baseline import StandardTransformerDecoder
from unit_scaling.app.training import History, evaluate, train


def _setup() -> tuple[uu.TransformerDecoder, Iterator[Tensor], list[Tensor]]:
    torch.manual_seed(0)
    model = uu.TransformerDecoder(32, 16, layers=1, heads=2)
    # One repeated batch: the loss must fall fast.
    batch = torch.randint(16, (4, 9))
    return model, itertools.repeat(batch), [batch]


def test_train_records_losses_and_evaluates_on_schedule() -> None:
    model, batches, validation = _setup()
    optimizer = uu.optim.AdamW(model.parameters(), lr=2**-5)
    history = train(
        model, model.loss, optimizer, batches, 12, validation, 5, "t", False
    )
    assert history.steps == list(range(1, 13))
    assert len(history.train_loss) == 12
    assert history.eval_steps == [0, 5, 10, 12]
    assert history.validation_loss[-1] < 0.9 * history.validation_loss[0]
    assert not history.diverged
    assert history.tokens_per_second > 0
    assert model.training
    # the last recorded validation loss is evaluate() of the trained model
    model.eval()
    assert evaluate(model.loss, validation) == pytest.approx(
        history.validation_loss[-1]
    )


def test_schedule_scales_the_learning_rate_per_step() -> None:
    model, batches, validation = _setup()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    seen = []

    def schedule(step: int) -> float:
        seen.append(step)
        return 1 / step

    train(
        model, model.loss, optimizer, batches, 4, validation, 10, "t", False, schedule
    )
    assert seen == [1, 2, 3, 4]
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.5 / 4)


def test_a_non_finite_loss_stops_training() -> None:
    model, batches, validation = _setup()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = itertools.count()

    def loss(batch: Tensor) -> Tensor:
        value = model.loss(batch)
        return value * math.nan if next(calls) == 3 else value

    history = train(model, loss, optimizer, batches, 10, validation, 100, "t", False)
    assert history.diverged
    assert history.steps == [1, 2, 3]
    assert math.isnan(history.validation_loss[-1])
    assert History().diverged is False


def test_progress_bar_needs_tqdm_only_when_asked_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)  # as if not installed
    model, batches, validation = _setup()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    history = train(model, model.loss, optimizer, batches, 2, validation, 1, "t", False)
    assert history.steps == [1, 2]
    with pytest.raises(ImportError, match=r"torch-unit-scaling\[app\].*progress=False"):
        train(model, model.loss, optimizer, batches, 2, validation, 1, "t", True)


def _one_sgd_step(
    model: torch.nn.Module, batches: list[Tensor], accumulate: int, loss_scale: float
) -> Tensor:
    """The parameters after one SGD step of ``train`` over ``batches``."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    history = train(
        model,
        model.loss,  # type: ignore[arg-type]
        optimizer,
        iter(batches),
        1,
        batches[:1],
        0,
        "t",
        False,
        accumulate=accumulate,
        loss_scale=loss_scale,
    )
    assert history.eval_steps == [0, 1]  # eval_every=0: start and end only
    assert history.seconds > 0
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.parametrize("plain", [False, True], ids=["unit-scaled", "plain"])
def test_accumulated_micro_batches_step_as_one_call_on_the_whole_batch(
    plain: bool,
) -> None:
    """A step over two micro-batches is the step over their concatenation, for
    a unit-scaled model (each micro-batch's gradient scaled by 2^-1/2) and for
    a plain one (the mean); a power-of-two loss scale is undone exactly."""

    def make() -> torch.nn.Module:
        torch.manual_seed(0)
        if plain:
            return StandardTransformerDecoder(32, 16, layers=1, heads=2)
        return uu.TransformerDecoder(32, 16, layers=1, heads=2)

    g = torch.Generator().manual_seed(1)
    parts = [torch.randint(16, (4, 9), generator=g) for _ in range(2)]
    whole = _one_sgd_step(make(), [torch.cat(parts)], 1, 1.0)
    accumulated = _one_sgd_step(make(), parts, 2, 1.0)
    torch.testing.assert_close(accumulated, whole, rtol=1e-5, atol=1e-6)
    scaled = _one_sgd_step(make(), [torch.cat(parts)], 1, 1024.0)
    assert torch.equal(scaled, whole)


def test_bad_accumulation_is_an_error() -> None:
    with pytest.raises(ValueError, match="accumulate must be >= 1"):
        model, batches, validation = _setup()
        train(
            model,
            model.loss,
            torch.optim.SGD(model.parameters(), lr=0.1),
            batches,
            1,
            validation,
            accumulate=0,
        )
