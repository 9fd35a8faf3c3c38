"""Tests for ``simulate_format`` and ``simulate_fp8``: which tensors are quantised,
to what, in which pass, and how much it changes each model family's loss."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import unit_scaling.functional as U
from tests.transforms.models import CASES, LAYERS, NanoGPT
from unit_scaling.formats import FP8_E4M3, FP8_E5M2, FPFormat
from unit_scaling.transforms import simulate_format, simulate_fp8, unit_scale

LOGGER = "unit_scaling.transforms.simulate_format"
# Well inside both formats' ranges, with mantissas neither format holds.
_UNREPRESENTABLE = [0.3, -1.1, 2.7, 0.013, -5.3, 17.9, 0.61, -100.3]


def e4m3(x: Tensor) -> Tensor:
    """Round to E4M3 with torch's own cast (the reference)."""
    return x.to(torch.float8_e4m3fn).to(x.dtype)


def e5m2(x: Tensor) -> Tensor:
    return x.to(torch.float8_e5m2).to(x.dtype)


def _unrepresentable(*shape: int, seed: int = 0) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    values = torch.tensor(_UNREPRESENTABLE)
    index = torch.randint(len(_UNREPRESENTABLE), shape, generator=gen)
    noise = 1 + 0.01 * torch.rand(shape, generator=gen)
    x = values[index] * noise
    assert not torch.equal(e4m3(x), x)
    return x


def _assert_e5m2(t: Tensor, name: str) -> None:
    assert torch.equal(e5m2(t), t), f"{name}: gradient not representable in E5M2"


# --------------------------------------------------------------------------- #
# What is quantised.
# --------------------------------------------------------------------------- #


def test_linear_inputs_quantised_forward_and_backward() -> None:
    model = nn.Linear(16, 8, bias=False)
    with torch.no_grad():
        model.weight.copy_(_unrepresentable(8, 16, seed=1))
    quantised = simulate_fp8(model)
    x = _unrepresentable(4, 16).requires_grad_()
    grad = _unrepresentable(4, 8, seed=2) / 7
    out = quantised(x)
    out.backward(grad)

    weight = quantised.weight.detach()
    torch.testing.assert_close(out, F.linear(e4m3(x.detach()), e4m3(weight)))
    # The gradient reaching each input is rounded to E5M2.
    torch.testing.assert_close(x.grad, e5m2(grad @ e4m3(weight)))
    torch.testing.assert_close(quantised.weight.grad, e5m2(grad.T @ e4m3(x.detach())))
    _assert_e5m2(x.grad, "input")
    _assert_e5m2(quantised.weight.grad, "weight")
    # The plain model differs: quantisation really happened.
    assert not torch.allclose(model(x), out)


def test_unit_scaled_linear_inputs_quantised() -> None:
    model = unit_scale(nn.Linear(16, 8, bias=False))
    quantised = simulate_fp8(model)
    x = _unrepresentable(4, 16)
    weight = quantised.weight.detach()
    expected = U.linear(e4m3(x), e4m3(weight), constraint=None)
    torch.testing.assert_close(quantised(x), expected)


class Products(nn.Module):
    def forward(self, a: Tensor, b: Tensor, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        attention = F.scaled_dot_product_attention(q, k, v)
        return (a @ b) + torch.bmm(a, b) + attention


def test_matmul_bmm_attention_inputs_quantised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    a, b = _unrepresentable(4, 8, 8), _unrepresentable(4, 8, 8, seed=1)
    q, k, v = (_unrepresentable(4, 8, 8, seed=s) / 10 for s in (2, 3, 4))
    out = simulate_fp8(Products())(a, b, q, k, v)
    qa, qb = e4m3(a), e4m3(b)
    expected = (qa @ qb) + torch.bmm(qa, qb)
    expected = expected + F.scaled_dot_product_attention(e4m3(q), e4m3(k), e4m3(v))
    torch.testing.assert_close(out, expected)
    quantised = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith("quantising function:") for m in quantised) == 3


def test_other_ops_keep_their_precision() -> None:
    class Elementwise(nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            return F.gelu(x) * 1.7 + x.softmax(-1)

    x = _unrepresentable(4, 16)
    expected = F.gelu(x) * 1.7 + x.softmax(-1)
    torch.testing.assert_close(simulate_fp8(Elementwise())(x), expected, rtol=0, atol=0)


def test_custom_format() -> None:
    # Through an identity matrix a linear layer returns its quantised input.
    fmt = FPFormat(3, 1, "nearest")
    model = nn.Linear(16, 16, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.eye(16))
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    out = simulate_format(model, fmt, fmt)(x)
    torch.testing.assert_close(out, fmt.quantise(x), rtol=0, atol=0)
    assert out.unique().numel() < x.unique().numel()  # a coarse grid


def test_stochastic_rounding_format() -> None:
    fmt = FPFormat(4, 3, "stochastic")
    model = nn.Linear(16, 16, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.eye(16))
    x = torch.full((64, 16), 0.3)
    out = simulate_format(model, fmt, fmt)(x)
    low, high = 0.28125, 0.3125  # the E4M3 neighbours of 0.3
    assert set(out.unique().tolist()) == {low, high}
    assert out.mean().item() == pytest.approx(0.3, abs=0.01)  # unbiased


def test_bad_formats_raise() -> None:
    with pytest.raises(TypeError, match="fwd_format"):
        simulate_format(nn.Linear(2, 2), "E4M3", FP8_E5M2)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="bwd_format"):
        simulate_format(nn.Linear(2, 2), FP8_E4M3, (5, 2))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"nn\.Module"):
        simulate_fp8(lambda x: x)  # type: ignore[arg-type]


def test_input_module_not_mutated() -> None:
    model = NanoGPT()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    quantised = simulate_fp8(model)
    for name, value in quantised.state_dict().items():
        assert torch.equal(value, state[name]), name  # weights are not rescaled
    CASES["nanogpt"].run(quantised)[0].sum().backward()
    for name, value in model.state_dict().items():
        assert torch.equal(value, state[name]), name
    assert all(p.grad is None for p in model.parameters())
    assert "forward" not in vars(model)


def test_nanogpt_quantises_every_product(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    CASES["nanogpt"].run(simulate_fp8(unit_scale(NanoGPT())))
    messages = [r.getMessage() for r in caplog.records]
    quantised = [m for m in messages if m.startswith("quantising function:")]
    # c_attn, attention, c_proj, two MLP linears per layer; the LM head.
    assert len(quantised) == 5 * LAYERS + 1, quantised


# --------------------------------------------------------------------------- #
# Each model family: a quantisation-sized change of the loss.
# --------------------------------------------------------------------------- #

MAX_RELATIVE_CHANGE = 0.05


# Unit-scaled, every family; plain (HF initialisation), the three whose matrix
# products differ (nn.Linear, HF Conv1D's addmm, nn.MultiheadAttention).
_LOSS_CASES = [(name, True) for name in CASES] + [
    (name, False) for name in ("nanogpt", "gpt2", "encoder")
]


@pytest.mark.parametrize(
    ("name", "unit_scaled"),
    _LOSS_CASES,
    ids=[f"{n}-{'unit_scaled' if u else 'plain'}" for n, u in _LOSS_CASES],
)
def test_loss_changes_by_quantisation_sized_amount(
    name: str, unit_scaled: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    case = CASES[name]
    model = case.make()
    if unit_scaled:
        model = unit_scale(model)
    quantised = simulate_fp8(model)
    exact = case.loss(case.run(model), 0)
    approximate = case.loss(case.run(quantised), 0)
    approximate.backward()
    relative = abs(approximate.item() - exact.item()) / abs(exact.item())
    assert 0 < relative < MAX_RELATIVE_CHANGE, f"{name}: relative change {relative}"
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("quantising function:") for m in messages)
    for param_name, p in quantised.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), param_name
