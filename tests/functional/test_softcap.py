"""Tests for the unit-scaled ``softcap``.

The scales are recomputed here by a different quadrature (torch's trapezoid on a
fine grid, over the variable ``u = x / cap`` so that small caps are resolved)
and checked against their limits: ``tanh``'s constants at ``cap = 1``, 1 for a
large cap, ``1/cap`` and ``(3 sqrt(2π) / (4 cap))^½`` for a small one.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

import unit_scaling.functional as U
from tests.helpers import assert_unit_scale, gradcheck_scaled, randn, unit_backward
from unit_scaling.constraints import apply_constraint
from unit_scaling.functional.softcap import _softcap_scales

CAPS = [0.01, 0.1, 0.5, 1.0, 2.0, 5.0, 30.0]


def _scales(cap: float) -> tuple[float, float]:
    """``E[tanh²(x/c)] = 1 - E[sech²(x/c)]``, and ``sech`` vanishes beyond
    ``|u| = 60``."""
    u = torch.linspace(-60, 60, 1_200_001, dtype=torch.float64)
    density = cap * torch.exp(-((cap * u) ** 2) / 2) / math.sqrt(2 * math.pi)
    sech_sq = torch.cosh(u) ** -2
    tanh_sq = 1 - torch.trapezoid(sech_sq * density, u).item()
    sech_4 = torch.trapezoid(sech_sq**2 * density, u).item()
    return 1 / (cap * math.sqrt(tanh_sq)), sech_4**-0.5


@pytest.mark.parametrize("cap", CAPS)
def test_softcap_scales_match_quadrature(cap: float) -> None:
    assert _softcap_scales(cap) == pytest.approx(_scales(cap), rel=1e-7)


def test_softcap_scales_tend_to_their_limits() -> None:
    assert _softcap_scales(1.0) == pytest.approx((1.592537, 1.467414), abs=1e-6)
    assert _softcap_scales(1e4) == pytest.approx((1.0, 1.0), abs=1e-7)
    alpha, beta = _softcap_scales(1e-3)
    assert alpha == pytest.approx(1e3, rel=1e-3)
    assert beta == pytest.approx((3 * math.sqrt(2 * math.pi) / 4e-3) ** 0.5, rel=1e-3)


@pytest.mark.parametrize("constraint", [None, "to_output_scale", "gmean"])
@pytest.mark.parametrize("cap", [0.1, 1.0, 30.0])
def test_softcap_matches_torch_times_scales(cap: float, constraint: str | None) -> None:
    alpha, beta = apply_constraint(constraint, *_scales(cap))
    x = randn(8, 33, seed=0)
    y = U.softcap(x, cap, constraint=constraint)
    grad = unit_backward(y, seed=1)
    x_ref = x.detach().requires_grad_()
    y_ref = cap * torch.tanh(x_ref / cap)
    y_ref.backward(grad)
    torch.testing.assert_close(y, alpha * y_ref)
    torch.testing.assert_close(x.grad, beta * x_ref.grad)


@pytest.mark.parametrize("cap", CAPS)
def test_softcap_unconstrained_is_unit_scaled(cap: float) -> None:
    # 2^18 samples: the RMS estimate's relative std is < 0.3% for cap >= 0.1; at
    # cap = 0.01 only ~1% of the gradient is nonzero (std of the estimate ~1%).
    x = randn(2**18, seed=2)
    y = U.softcap(x, cap, constraint=None)
    unit_backward(y, seed=3)
    std = y.detach().double().std().item()
    assert abs(std - 1) < 0.02, f"output std {std:.4f}"
    assert_unit_scale(x.grad, rtol=0.05, name="input grad")


def test_softcap_gradcheck_and_compile() -> None:
    x = randn(4, 5, dtype=torch.float64, seed=0)
    alpha, beta = _scales(2.0)
    assert gradcheck_scaled(
        lambda t: U.softcap(t, 2.0, constraint=None), [x], alpha, [beta]
    )
    compiled = torch.compile(lambda t: U.softcap(t, 15.0), fullgraph=True)
    x = randn(16, 8, seed=1)
    torch.testing.assert_close(compiled(x), U.softcap(x, 15.0))


@pytest.mark.parametrize("cap", [0.0, -1.0, float("nan"), "5", True])
def test_softcap_rejects_a_cap_that_is_not_a_positive_number(cap: Any) -> None:
    with pytest.raises(ValueError, match="cap must be a positive number"):
        U.softcap(randn(4), cap)
