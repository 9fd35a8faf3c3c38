"""Tests for ``step_mean`` and ``micro_batch_loss``: a loss's share of a step."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

import unit_scaling as uu
import unit_scaling.functional as U
from tests.helpers import gradcheck_scaled


def _rms(t: Tensor) -> float:
    return t.detach().double().pow(2).mean().sqrt().item()


def _ce_sum(
    seed: int = 0, rows: int = 256, classes: int = 100
) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, classes, generator=g, requires_grad=True)
    return logits, torch.randint(classes, (rows,), generator=g)


@pytest.mark.parametrize(
    "step_count",
    [1024, 1024.0, torch.tensor(1024.0), torch.tensor(1024), torch.tensor([1024.0])],
    ids=["int", "float", "float-tensor", "int-tensor", "1-element"],
)
def test_step_mean_is_the_loss_over_the_step_with_the_gradient_of_its_share(
    step_count: Tensor | float,
) -> None:
    logits, targets = _ce_sum()
    total = U.cross_entropy(logits, targets, reduction="sum")
    out = U.step_mean(total, 256, step_count)
    assert torch.equal(out, total / step_count)  # torch's division, bit for bit
    out.sum().backward()
    plain = logits.detach().clone().requires_grad_()
    U.cross_entropy(plain, targets, reduction="sum").backward()
    assert plain.grad is not None and logits.grad is not None
    torch.testing.assert_close(logits.grad, plain.grad * 0.5, rtol=1e-6, atol=0)


def test_step_mean_of_the_whole_step_keeps_unit_scale() -> None:
    logits, targets = _ce_sum()
    count = (targets != -100).sum()
    U.step_mean(
        U.cross_entropy(logits, targets, reduction="sum"), count, count
    ).backward()
    assert logits.grad is not None
    assert _rms(logits.grad) == pytest.approx(1.0, rel=0.1)


def test_step_mean_gradient_checks_in_float64() -> None:
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)

    def fn(x: Tensor) -> Tensor:
        return U.step_mean(x.pow(2).sum(), 5, 20)

    # forward: sum/20; backward scale sqrt(5/20) instead of 1/20
    assert gradcheck_scaled(fn, [x], output_scale=1 / 20, grad_scales=[0.5])


@pytest.mark.parametrize("k", [2, 4])
def test_micro_batches_accumulate_to_the_whole_batch_gradient(k: int) -> None:
    torch.manual_seed(0)
    model = uu.TransformerDecoder(
        64, 128, layers=2, heads=4, **uu.RECOMMENDED.multipliers
    )
    batch = torch.randint(128, (8, 17), generator=torch.Generator().manual_seed(1))
    model.loss(batch).backward()
    full = {
        n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
    }
    model.zero_grad()
    for part in batch.chunk(k):
        U.micro_batch_loss(model.loss(part), 1 / k).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None
        error = (p.grad - full[name]).norm() / full[name].norm()
        assert error < 1e-5, (name, float(error))


def test_a_plain_mean_of_micro_batches_is_sqrt_k_too_small() -> None:
    """What the rule replaces: loss / k leaves the step k^-1/2 of the batch's."""
    torch.manual_seed(0)
    model = uu.TransformerDecoder(64, 128, layers=2, heads=4)
    batch = torch.randint(128, (8, 17), generator=torch.Generator().manual_seed(1))
    model.loss(batch).backward()
    full = model.projection.weight.grad.clone()  # type: ignore[union-attr]
    model.zero_grad()
    for part in batch.chunk(4):
        (model.loss(part) / 4).backward()
    ratio = model.projection.weight.grad.norm() / full.norm()  # type: ignore[union-attr]
    assert float(ratio) == pytest.approx(0.5, rel=1e-4)


def test_micro_batch_loss_values_sum_to_the_mean_and_gradients_take_the_root() -> None:
    logits, targets = _ce_sum()
    loss = U.cross_entropy(logits, targets)
    out = U.micro_batch_loss(loss, 0.25)
    assert out.item() == pytest.approx(loss.item() / 4, rel=1e-7)
    out.backward()
    assert logits.grad is not None
    assert _rms(logits.grad) == pytest.approx(0.5, rel=0.1)
    again = logits.detach().clone().requires_grad_()
    U.micro_batch_loss(U.cross_entropy(again, targets), torch.tensor(0.25)).backward()
    torch.testing.assert_close(again.grad, logits.grad)


def test_a_whole_step_is_the_loss_itself() -> None:
    loss = torch.tensor(2.0, requires_grad=True)
    assert U.micro_batch_loss(loss, 1) is loss


@pytest.mark.parametrize("fraction", [0, -0.5, 1.5, math.nan, math.inf])
def test_a_fraction_outside_zero_one_is_an_error(fraction: float) -> None:
    with pytest.raises(ValueError, match="fraction"):
        U.micro_batch_loss(torch.tensor(1.0, requires_grad=True), fraction)


def test_bad_counts_and_losses_are_errors() -> None:
    loss = torch.tensor(3.0, requires_grad=True)
    with pytest.raises(TypeError, match="loss"):
        U.step_mean(3.0, 1, 2)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="loss"):
        U.step_mean(torch.tensor(3), 1, 2)
    with pytest.raises(ValueError, match="step_count must hold one number"):
        U.step_mean(loss, 1, torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="count must be a finite count"):
        U.step_mean(loss, -1, 2)
    with pytest.raises(TypeError, match="step_count must be a number"):
        U.step_mean(loss, 1, "2")  # type: ignore[arg-type]
