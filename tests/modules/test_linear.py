"""Tests for the unit-scaled linear layers: ``Linear`` and ``LinearReadout``.

Each module must be a thin wrapper: its output and gradients equal those of its
``U.*`` function called with the module's own parameters and settings. Weights are
checked for unit init with a tolerance of 6σ of the sample std of ``N`` normal
draws (relative σ ≈ ``1/sqrt(2N)``).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import unit_scaling as uu
import unit_scaling.functional as U
from tests.helpers import randn, unit_backward


def _assert_unit_init(w: Tensor) -> None:
    tol = 6 / math.sqrt(2 * w.numel())
    std, mean = w.detach().std().item(), w.detach().mean().item()
    assert abs(std - 1) <= tol, f"std {std:.4f} not within {tol:.4f} of 1"
    assert abs(mean) <= 6 / math.sqrt(w.numel()), f"mean {mean:.4f} not ≈ 0"


def _run(fn, *inputs: Tensor) -> tuple[Tensor, list[Tensor]]:
    """Output of ``fn(*inputs)`` and the grads of ``inputs`` under a fixed unit grad."""
    for t in inputs:
        t.grad = None
    out = fn(*inputs)
    unit_backward(out, seed=1)
    return out.detach(), [t.grad.clone() for t in inputs]


# --- Linear ------------------------------------------------------------------------


def test_linear_matches_f_linear_times_fan_in_power() -> None:
    layer = uu.Linear(64, 32)
    x = randn(8, 5, 64, seed=0)
    expected = F.linear(x, layer.weight) * 64**-0.5
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("constraint", ["to_output_scale", None, "gmean"])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_calls_functional(constraint: str | None, bias: bool) -> None:
    layer = uu.Linear(48, 24, bias=bias, constraint=constraint)
    if bias:
        nn.init.normal_(layer.bias)  # zero at init: make it matter
    x = randn(6, 48, seed=0)
    params = [layer.weight] + ([layer.bias] if bias else [])
    y_mod, g_mod = _run(lambda x, *p: layer(x), x, *params)
    y_fn, g_fn = _run(
        lambda x, *p: U.linear(x, layer.weight, layer.bias, constraint), x, *params
    )
    torch.testing.assert_close(y_mod, y_fn, rtol=0, atol=0)
    for a, b in zip(g_mod, g_fn, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_linear_unconstrained_input_grad_uses_fan_out() -> None:
    # With constraint=None the input gradient is scaled fan_out^-½, not fan_in^-½:
    # a module that dropped its constraint would fail here.
    layer = uu.Linear(64, 16, constraint=None)
    x = randn(10, 64, seed=0)
    grad = unit_backward(layer(x))
    torch.testing.assert_close(x.grad, grad @ layer.weight.detach() * 16**-0.5)


def test_linear_init_and_tags() -> None:
    layer = uu.Linear(256, 128, bias=True)
    _assert_unit_init(layer.weight)
    assert isinstance(layer.weight, uu.Parameter)
    assert (layer.weight.mup_type, layer.weight.mup_scaling_depth) == ("weight", None)
    assert isinstance(layer.bias, uu.Parameter)
    assert (layer.bias.mup_type, layer.bias.mup_scaling_depth) == ("bias", None)
    assert torch.count_nonzero(layer.bias) == 0
    assert uu.Linear(4, 4).bias is None  # bias is off by default


def test_linear_reset_parameters_keeps_tags() -> None:
    layer = uu.Linear(128, 64, bias=True)
    weight, bias = layer.weight, layer.bias
    with torch.no_grad():
        weight.mul_(5)
        bias.fill_(3)
    layer.reset_parameters()
    assert layer.weight is weight and layer.bias is bias
    _assert_unit_init(layer.weight)
    assert torch.count_nonzero(layer.bias) == 0
    assert (layer.weight.mup_type, layer.bias.mup_type) == ("weight", "bias")


def test_linear_weight_mup_type_and_dtype() -> None:
    layer = uu.Linear(8, 4, weight_mup_type="output", dtype=torch.float64)
    assert layer.weight.mup_type == "output"
    assert layer.weight.dtype == torch.float64


def test_linear_rejects_unknown_constraint() -> None:
    with pytest.raises(ValueError, match="bogus"):
        uu.Linear(4, 4, constraint="bogus")


# --- LinearReadout -----------------------------------------------------------------


def test_linear_readout_is_mup_readout() -> None:
    layer = uu.LinearReadout(64, 10)
    assert layer.constraint is None
    assert layer.weight.mup_type == "output"
    _assert_unit_init(uu.LinearReadout(256, 128).weight)
    x = randn(12, 64, seed=0)
    y = layer(x)
    # μP readout: output scaled 1/fan_in; unconstrained, so grad input fan_out^-½.
    torch.testing.assert_close(y, F.linear(x, layer.weight) / 64, rtol=1e-5, atol=1e-6)
    grad = unit_backward(y)
    torch.testing.assert_close(x.grad, grad @ layer.weight.detach() * 10**-0.5)


def test_linear_readout_calls_functional() -> None:
    layer = uu.LinearReadout(32, 16, bias=True, constraint="to_output_scale")
    nn.init.normal_(layer.bias)
    x = randn(4, 3, 32, seed=0)
    y_mod, g_mod = _run(lambda x, w, b: layer(x), x, layer.weight, layer.bias)
    y_fn, g_fn = _run(
        lambda x, w, b: U.linear_readout(x, w, b, "to_output_scale"),
        x,
        layer.weight,
        layer.bias,
    )
    torch.testing.assert_close(y_mod, y_fn, rtol=0, atol=0)
    for a, b in zip(g_mod, g_fn, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert layer.bias.mup_type == "bias"
