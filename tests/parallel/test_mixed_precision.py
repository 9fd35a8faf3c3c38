"""Mixed precision: bf16 and fp16 autocast train a u-μP model like fp32.

Unit scaling keeps activation gradients near RMS 1, inside fp16's normal range
(``[2^-14, 65504]``), so fp16 needs no loss scaling (no ``GradScaler``). The
standard-parametrisation baseline's gradients fall below that range.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import unit_scaling as uu
from unit_scaling.app.baseline import StandardTransformerDecoder
from unit_scaling.data import VOCAB_SIZE

from ._reference import HEADS, LAYERS, LR, STEPS, WIDTH, global_batches, make_model

FP16_SMALLEST_NORMAL = 2.0**-14


def _linear_output_grads(model: nn.Module) -> list[Tensor]:
    """Collects the gradient of every linear layer's output, in autocast's dtype."""
    grads: list[Tensor] = []

    def hook(module: nn.Module, inputs: Any, output: Tensor) -> None:
        output.register_hook(lambda grad: grads.append(grad.detach().clone()))

    for module in model.modules():
        if isinstance(module, nn.Linear):
            module.register_forward_hook(hook)
    return grads


def _run(model: nn.Module, optimizer: Any, dtype: torch.dtype) -> dict[str, Any]:
    """Train on the shared batches under ``dtype`` autocast; no GradScaler, ever."""
    grads = _linear_output_grads(model)
    losses, first_grads = [], []
    for step, batch in enumerate(global_batches(STEPS)):
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            loss = model.loss(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step == 0:
            first_grads = list(grads)
        grads.clear()
    return {"losses": losses, "grads": first_grads}


def _u_mup(dtype: torch.dtype) -> dict[str, Any]:
    model = make_model()
    return _run(model, uu.optim.AdamW(model.parameters(), lr=LR), dtype)


def _standard(dtype: torch.dtype) -> dict[str, Any]:
    torch.manual_seed(0)
    model = StandardTransformerDecoder(WIDTH, VOCAB_SIZE, LAYERS, HEADS)
    return _run(model, torch.optim.AdamW(model.parameters(), lr=1e-3), dtype)


@pytest.fixture(scope="module")
def fp32() -> dict[str, Any]:
    return _u_mup(torch.float32)


def _max_gap(run: dict[str, Any], reference: dict[str, Any]) -> float:
    return max(
        abs(a - b) for a, b in zip(run["losses"], reference["losses"], strict=True)
    )


def test_bf16_autocast_matches_fp32(fp32: dict[str, Any]) -> None:
    bf16 = _u_mup(torch.bfloat16)
    assert {g.dtype for g in bf16["grads"]} == {torch.bfloat16}  # autocast was on
    assert _max_gap(bf16, fp32) < 2e-3
    assert fp32["losses"][-1] < fp32["losses"][0] - 0.1  # and it learns


def _below_fp16_normal(grad: Tensor) -> float:
    """The fraction of ``grad`` that fp16 flushes to subnormals or zero."""
    return (grad.float().abs() < FP16_SMALLEST_NORMAL).float().mean().item()


def test_fp16_without_loss_scaling_matches_fp32(fp32: dict[str, Any]) -> None:
    fp16 = _u_mup(torch.float16)
    assert all(math.isfinite(loss) for loss in fp16["losses"])
    assert _max_gap(fp16, fp32) < 5e-4
    assert {g.dtype for g in fp16["grads"]} == {torch.float16}
    for grad in fp16["grads"]:
        assert 2**-3 < grad.float().pow(2).mean().sqrt().item() < 2**3
        # At most the first position's attention gradients, zero in exact math.
        assert _below_fp16_normal(grad) < 0.05


def test_standard_parametrisation_gradients_underflow_fp16() -> None:
    # What loss scaling is for: without unit scaling, most activation gradients
    # sit below fp16's normal range at this size already (and shrink with batch
    # size and width).
    fractions = [_below_fp16_normal(g) for g in _standard(torch.float16)["grads"]]
    assert sum(f > 0.5 for f in fractions) > len(fractions) / 2
