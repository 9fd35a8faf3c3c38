"""Tests for ``unit_scaling.core.functional``."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from tests.helpers import gradcheck_scaled, randn, unit_backward
from unit_scaling.core.functional import (
    logarithmic_interpolation,
    rms,
    scale_elementwise,
    transformer_residual_scaling_rule,
)


@pytest.mark.parametrize(
    ("constraint", "expected"),
    [
        (None, (3.0, 0.5)),
        ("to_output_scale", (3.0, 3.0)),
        ("to_grad_input_scale", (0.5, 0.5)),
        ("gmean", (1.5**0.5, 1.5**0.5)),
        ("amean", (1.75, 1.75)),
    ],
)
def test_scale_elementwise_values_and_gradients(
    constraint: str | None, expected: tuple[float, float]
) -> None:
    out_scale, grad_scale = expected
    scaled_sin = scale_elementwise(torch.sin, 3.0, 0.5, constraint)
    x = randn(64)
    y = scaled_sin(x)
    grad = unit_backward(y)
    torch.testing.assert_close(y, out_scale * torch.sin(x.detach()))
    torch.testing.assert_close(x.grad, grad_scale * torch.cos(x.detach()) * grad)


def test_scale_elementwise_passes_extra_arguments() -> None:
    scaled = scale_elementwise(F.leaky_relu, 2.0, 2.0)
    x = torch.tensor([-1.0, 1.0])
    torch.testing.assert_close(scaled(x, negative_slope=0.5), torch.tensor([-1.0, 2.0]))
    scaled_pow = scale_elementwise(torch.pow, 0.5, 0.5)
    torch.testing.assert_close(scaled_pow(torch.tensor([3.0]), 2), torch.tensor([4.5]))


def test_scale_elementwise_gradcheck() -> None:
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    assert gradcheck_scaled(
        scale_elementwise(torch.tanh, 2.0, 0.25, None), [x], 2.0, [0.25]
    )


def test_scale_elementwise_with_unit_scales_is_the_function() -> None:
    x = randn(4)
    assert torch.equal(scale_elementwise(torch.exp, 1.0, 1.0)(x), torch.exp(x))


def test_scale_elementwise_rejects_bad_constraints_at_creation() -> None:
    with pytest.raises(ValueError, match="exactly 3 scales"):
        scale_elementwise(torch.sin, 1.0, 2.0, "to_left_grad_scale")
    with pytest.raises(ValueError, match="not a known constraint"):
        scale_elementwise(torch.sin, 1.0, 2.0, "output")


def test_scale_elementwise_compiles_fullgraph() -> None:
    scaled = scale_elementwise(torch.tanh, 2.0, 0.5, None)

    def f(x: Tensor) -> Tensor:
        return scaled(x) + rms(x)

    x = randn(4, 8)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    results = []
    for fn in (f, compiled):
        x.grad = None
        y = fn(x)
        unit_backward(y)
        results.append((y.detach(), x.grad))
    torch.testing.assert_close(results[1], results[0])


@pytest.mark.parametrize(
    ("alpha", "expected"),
    [(0.0, 2.0), (1.0, 32.0), (0.5, 8.0), (0.25, 4.0), (2.0, 512.0)],
)
def test_logarithmic_interpolation(alpha: float, expected: float) -> None:
    assert logarithmic_interpolation(alpha, 2.0, 32.0) == pytest.approx(expected)


def test_rms_values_dims_keepdim_eps() -> None:
    x = torch.tensor([[3.0, -4.0], [1.0, 1.0]])
    torch.testing.assert_close(rms(x), torch.tensor(math.sqrt(27 / 4)))
    torch.testing.assert_close(rms(x, dims=(1,)), torch.tensor([12.5**0.5, 1.0]))
    assert rms(x, dims=(0,), keepdim=True).shape == (1, 2)
    torch.testing.assert_close(
        rms(x, dims=(1,), eps=3.5), torch.tensor([4.0, 4.5**0.5])
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rms_accumulates_in_fp32_for_half_inputs(dtype: torch.dtype) -> None:
    # 300² = 90000 overflows fp16 (max 65504); squaring in fp32 does not.
    big = torch.full((8,), 300.0, dtype=dtype)
    assert rms(big).dtype == dtype
    assert rms(big).item() == 300.0
    if dtype == torch.float16:
        assert torch.isinf(big.square().mean().sqrt())  # the naive way fails


def _tau_by_hand(index: int, layers: int, mult: float, ratio: float) -> float:
    a_mlp_sq = mult**2 * 2 / (1 + ratio**2)
    a_attn_sq = ratio**2 * a_mlp_sq
    n_attn, n_mlp = (index + 1) // 2, index // 2
    own = a_attn_sq if index % 2 == 0 else a_mlp_sq
    return math.sqrt(own / (layers / 2 + n_attn * a_attn_sq + n_mlp * a_mlp_sq))


def test_transformer_residual_scaling_rule_hand_computed() -> None:
    # mult 2, ratio 0.5: a_mlp² = 4·2/1.25 = 6.4, a_attn² = 0.25·6.4 = 1.6; L = 6
    tau = transformer_residual_scaling_rule(residual_mult=2.0, residual_attn_ratio=0.5)
    assert tau(0, 6) == pytest.approx(math.sqrt(1.6 / 3))
    assert tau(1, 6) == pytest.approx(math.sqrt(6.4 / (3 + 1.6)))
    assert tau(2, 6) == pytest.approx(math.sqrt(1.6 / (3 + 1.6 + 6.4)))
    assert tau(3, 6) == pytest.approx(math.sqrt(6.4 / (3 + 2 * 1.6 + 6.4)))
    assert tau(5, 6) == pytest.approx(math.sqrt(6.4 / (3 + 3 * 1.6 + 2 * 6.4)))


@pytest.mark.parametrize(("mult", "ratio"), [(1.0, 1.0), (0.5, 2.0), (3.0, 0.25)])
def test_transformer_residual_scaling_rule_formula(mult: float, ratio: float) -> None:
    tau = transformer_residual_scaling_rule(mult, ratio)
    for index in range(8):
        assert tau(index, 8) == pytest.approx(_tau_by_hand(index, 8, mult, ratio))


def test_transformer_residual_scaling_rule_defaults() -> None:
    tau = transformer_residual_scaling_rule()
    assert tau(0, 4) == pytest.approx(2**-0.5)  # 1 / sqrt(2)
    assert tau(3, 4) == pytest.approx(1 / math.sqrt(2 + 2 + 1))
