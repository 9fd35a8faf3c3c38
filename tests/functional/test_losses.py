"""Tests for the unit-scaled ``cross_entropy`` and ``mse_loss``."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import unit_scaling.functional as U
from benchmarks.op_counts import OpCounter
from tests.helpers import gradcheck_scaled, randn, unit_backward


def _rms(t: Tensor) -> float:
    return t.detach().double().pow(2).mean().sqrt().item()


def _targets(shape: tuple[int, ...], classes: int, seed: int = 0) -> Tensor:
    return torch.randint(classes, shape, generator=torch.Generator().manual_seed(seed))


def _backward(loss: Tensor) -> Tensor:
    """Backpropagate 1 through a scalar loss, unit-normal noise otherwise."""
    if loss.dim() == 0:
        grad = torch.ones_like(loss)
        loss.backward(grad)
        return grad
    return unit_backward(loss, seed=7)


# (logits shape, target shape): (N, V), (N, V, d1) and (V,) with V at dim 1 / 0.
CE_SHAPES = [((512, 1000), (512,)), ((16, 64, 32), (16, 32)), ((1000,), ())]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize(("shape", "target_shape"), CE_SHAPES[:2])
def test_cross_entropy_unit_scale(
    shape: tuple[int, ...], target_shape: tuple[int, ...], reduction: str
) -> None:
    # For near-uniform predictions the logit gradient row softmax - onehot has RMS
    # sqrt(V-1)/V exactly; unit-normal logits are not quite uniform (≤ 5% at V≥64).
    x = randn(*shape, seed=0)
    _backward(U.cross_entropy(x, _targets(target_shape, shape[1]), reduction=reduction))
    assert x.grad is not None
    assert abs(_rms(x.grad) - 1) < 0.08, f"logit grad RMS {_rms(x.grad):.4f}"


@pytest.mark.parametrize("mult", [0.25, 0.5])
def test_cross_entropy_grad_carries_mult(mult: float) -> None:
    # Documented: the chain rule's factor mult stays in the logit gradient.
    x = randn(512, 1000, seed=0)
    U.cross_entropy(x, _targets((512,), 1000), mult=mult).backward()
    assert x.grad is not None
    assert _rms(x.grad) == pytest.approx(mult, rel=0.05)


def _check_cross_entropy(
    x: Tensor, target: Tensor, mult: float = 1.0, **kwargs: Any
) -> None:
    """Forward equals torch's; gradient equals V/sqrt(V-1) times the sum-loss one."""
    classes = x.shape[1] if x.dim() >= 2 else x.shape[0]
    reduction = kwargs.pop("reduction", "mean")
    x_ref = x.detach().clone().requires_grad_()
    loss = U.cross_entropy(x, target, reduction=reduction, mult=mult, **kwargs)
    loss_ref = F.cross_entropy(mult * x_ref, target, reduction=reduction, **kwargs)
    torch.testing.assert_close(loss, loss_ref)
    grad = _backward(loss)
    # The sum-reduced loss's gradient: undo torch's 1/count for the mean.
    count = (target != kwargs.get("ignore_index", -100)).sum()
    (loss_ref * (count if reduction == "mean" else 1)).backward(grad)
    assert x.grad is not None and x_ref.grad is not None
    torch.testing.assert_close(x.grad, classes / math.sqrt(classes - 1) * x_ref.grad)


@pytest.mark.parametrize("mult", [1.0, 0.5, 3.0])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize(("shape", "target_shape"), CE_SHAPES)
def test_cross_entropy_matches_torch(
    shape: tuple[int, ...], target_shape: tuple[int, ...], reduction: str, mult: float
) -> None:
    classes = shape[1] if len(shape) >= 2 else shape[0]
    x, target = randn(*shape, seed=0), _targets(target_shape, classes)
    _check_cross_entropy(x, target, mult=mult, reduction=reduction)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ignore_index", [-100, 3])
def test_cross_entropy_ignore_index(ignore_index: int, reduction: str) -> None:
    target = _targets((64, 8), 10)
    target[::3] = ignore_index
    x = randn(64, 10, 8, seed=0)
    _check_cross_entropy(x, target, ignore_index=ignore_index, reduction=reduction)
    assert x.grad is not None
    assert torch.all(x.grad.movedim(1, -1)[target == ignore_index] == 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize(("shape", "target_shape"), CE_SHAPES)
def test_cross_entropy_mean_is_bitwise_the_scaled_sum(
    shape: tuple[int, ...], target_shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    """The mean is the sum times ``1/B`` (``B`` counted on the device, by aten's
    nll_loss for float32 ``(N, C)`` logits), its gradient the sum's times the
    scale: bit for bit, whichever way ``B`` is counted."""
    classes = shape[1] if len(shape) >= 2 else shape[0]
    x, target = randn(*shape, dtype=dtype, seed=0), _targets(target_shape, classes)
    if target.dim():
        target.view(-1)[::5] = -100
    loss = U.cross_entropy(x, target)
    grad = _backward(loss)
    x_ref = x.detach().clone().requires_grad_()
    total = F.cross_entropy(x_ref, target, reduction="sum")
    count = (target != -100).sum()
    assert torch.equal(loss, total * count.reciprocal().to(dtype))
    total.backward(grad * (classes / math.sqrt(classes - 1)))
    assert x.grad is not None and torch.equal(x.grad, x_ref.grad)


def test_cross_entropy_mean_under_autocast_is_bitwise_torchs_cast() -> None:
    """Autocast runs F.cross_entropy in float32; the mean does the same."""
    x = randn(16, 40, seed=0).bfloat16().detach().requires_grad_()
    target = _targets((16,), 40)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = U.cross_entropy(x, target)
        total = F.cross_entropy(x, target, reduction="sum")
    assert loss.dtype == total.dtype == torch.float32
    assert torch.equal(loss, total / 16)  # B = 16: the reciprocal is exact


def test_cross_entropy_mean_counts_the_targets_inside_nll_loss() -> None:
    """For float32 (N, C) logits aten's nll_loss counts the targets it sums
    (its total_weight): no pass over the targets of its own."""
    x, target = randn(8, 10, seed=0), _targets((8,), 10)
    with OpCounter() as counter:
        U.cross_entropy(x, target)
    assert dict(counter.counts) == {
        "_log_softmax": 1,
        "nll_loss_forward": 1,
        "reciprocal": 1,
        "mul": 1,  # the 1 / B
    }


def test_cross_entropy_mean_of_all_ignored_is_nan_like_torch() -> None:
    x, target = randn(4, 5), torch.full((4,), -100)
    assert torch.isnan(U.cross_entropy(x, target))
    assert torch.isnan(F.cross_entropy(x, target))


def test_cross_entropy_gradcheck() -> None:
    x = randn(6, 5, dtype=torch.float64, seed=0)
    target = torch.tensor([0, 4, -100, 2, 1, -100])
    scale = 5 / math.sqrt(4)
    assert gradcheck_scaled(
        lambda logits, t: U.cross_entropy(logits, t, mult=2.0),
        [x, target],
        output_scale=1 / 4,  # four targets are not ignored
        grad_scales=[scale, 1.0],
    )


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"weight": torch.ones(5)}, ValueError, "'weight' argument"),
        ({"label_smoothing": 0.1}, ValueError, "'label_smoothing' argument"),
        ({"size_average": True}, ValueError, "'size_average' argument"),
        ({"reduce": False}, ValueError, "'reduce' argument"),
        ({"reduction": "avg"}, ValueError, "reduction='avg' is not valid"),
        ({"target": torch.randn(4, 5).softmax(-1)}, ValueError, "probability targets"),
        ({"target": torch.zeros(4)}, TypeError, "integer dtype.*float32"),
        ({"target": torch.zeros(4, dtype=torch.bool)}, TypeError, "integer dtype"),
        ({"target": torch.zeros(3, dtype=torch.long)}, ValueError, r"\(4, 5\).*\(3,\)"),
        ({"input": torch.tensor(1.0)}, ValueError, "0-d tensor"),
    ],
)
def test_cross_entropy_bad_arguments_raise(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    args: dict[str, Any] = {
        "input": torch.randn(4, 5),
        "target": torch.zeros(4, dtype=torch.long),
    }
    args.update(kwargs)
    with pytest.raises(error, match=match):
        U.cross_entropy(**args)


MSE_SHAPES = [(2**16,), (256, 256), (16, 64, 64)]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("shape", MSE_SHAPES)
def test_mse_loss_unit_scale(shape: tuple[int, ...], reduction: str) -> None:
    x, y = randn(*shape, seed=0), randn(*shape, seed=1)
    _backward(U.mse_loss(x, y, reduction=reduction))
    assert x.grad is not None and y.grad is not None
    assert abs(_rms(x.grad) - 1) < 0.03, f"input grad RMS {_rms(x.grad):.4f}"
    assert abs(_rms(y.grad) - 1) < 0.03, f"target grad RMS {_rms(y.grad):.4f}"


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_loss_matches_torch(reduction: str) -> None:
    x, y = randn(7, 9, seed=0), randn(7, 9, seed=1)
    x_ref, y_ref = (t.detach().clone().requires_grad_() for t in (x, y))
    loss = U.mse_loss(x, y, reduction=reduction)
    loss_ref = F.mse_loss(x_ref, y_ref, reduction=reduction)
    torch.testing.assert_close(loss, loss_ref)
    grad = _backward(loss)
    # Gradients are those of the sum-reduced loss (torch's mean divides by numel).
    (loss_ref * (x.numel() if reduction == "mean" else 1)).backward(grad)
    for t, t_ref in ((x, x_ref), (y, y_ref)):
        assert t.grad is not None and t_ref.grad is not None
        torch.testing.assert_close(t.grad, 8**-0.5 * t_ref.grad)


def test_mse_loss_gradcheck_and_empty_mean() -> None:
    x, y = randn(3, 4, dtype=torch.float64), randn(3, 4, dtype=torch.float64)
    assert gradcheck_scaled(U.mse_loss, [x, y], 1 / 12, [8**-0.5, 8**-0.5])
    assert torch.isnan(U.mse_loss(torch.zeros(0), torch.zeros(0)))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: U.mse_loss(torch.zeros(4, 3), torch.zeros(3)), r"\(4, 3\).*\(3,\)"),
        (lambda: U.mse_loss(torch.zeros(3), torch.zeros(3), True), "'size_average'"),
        (
            lambda: U.mse_loss(torch.zeros(3), torch.zeros(3), reduce=True),
            "'reduce' argument",
        ),
        (
            lambda: U.mse_loss(torch.zeros(3), torch.zeros(3), reduction="max"),
            "reduction='max' is not valid",
        ),
    ],
)
def test_mse_loss_bad_arguments_raise(call: Callable[[], Tensor], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def test_compile_fullgraph_matches_eager() -> None:
    # fullgraph=True also proves the mean's count stays on the device (no .item()).
    def losses(logits: Tensor, target: Tensor, x: Tensor, y: Tensor) -> Tensor:
        return U.cross_entropy(logits, target, ignore_index=0, mult=2.0) + U.mse_loss(
            x, y
        )

    compiled = torch.compile(losses, fullgraph=True)
    inputs = [randn(32, 10, seed=0), _targets((32,), 10), randn(64), randn(64, seed=1)]
    inputs_ref = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    loss, loss_ref = compiled(*inputs), losses(*inputs_ref)
    torch.testing.assert_close(loss, loss_ref)
    loss.backward()
    loss_ref.backward()
    for t, t_ref in zip(inputs, inputs_ref, strict=True):
        if t.requires_grad:
            torch.testing.assert_close(t.grad, t_ref.grad)
