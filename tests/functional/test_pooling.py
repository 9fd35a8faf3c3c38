"""Tests for the unit-scaled ``avg_pool{1,2,3}d`` and ``max_pool{1,2,3}d``.

The expected scales are recomputed here independently of the package:

* average pooling is linear, so torch's own pool applied to an identity matrix
  gives its matrix ``M``, and ``alpha = (n_out / ||M||²)^½``,
  ``beta = (n_in / ||M||²)^½``; where the windows tile the input this must also
  equal the textbook ``K^½`` and ``(K·S)^½``;
* max pooling with full windows has ``alpha = 1 / std`` of the maximum of ``K``
  unit normals (quadrature here, checked against closed forms and sampling) and
  ``beta = (n_in / n_out)^½``.

Tolerances: measured RMS values use ``>= 4096`` elements (``rtol=0.1`` > 6σ
for independent elements; overlapping windows correlate neighbours, which the
margin covers).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import unit_scaling.functional as U
from tests.helpers import assert_unit_scale, gradcheck_scaled, randn, unit_backward
from unit_scaling.constraints import apply_constraint
from unit_scaling.functional._windows import max_moments


@dataclass
class Case:
    op: str
    input: tuple[int, ...]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def __str__(self) -> str:
        return f"{self.op}{self.input}{self.args}{self.kwargs}"

    def torch_op(self, x: Tensor, **extra: Any) -> Any:
        return getattr(F, self.op)(x, *self.args, **self.kwargs, **extra)

    def unit_op(self, x: Tensor, **extra: Any) -> Any:
        return getattr(U, self.op)(x, *self.args, **self.kwargs, **extra)


AVG_CASES = [
    Case("avg_pool1d", (16, 32, 256), (4,), {}),
    Case("avg_pool1d", (16, 32, 256), (3, 1, 1), {}),
    Case("avg_pool1d", (16, 32, 255), (3, 2, 1, True, False), {}),
    Case("avg_pool2d", (8, 16, 32, 32), (2,), {}),
    Case("avg_pool2d", (8, 32, 15, 15), (3, 2, 1), {"ceil_mode": True}),
    Case(
        "avg_pool2d",
        (8, 32, 16, 16),
        ((3, 2), (2, 1), (1, 0)),
        {"count_include_pad": False},
    ),
    Case("avg_pool2d", (8, 16, 32, 32), (2,), {"divisor_override": 3}),
    Case("avg_pool3d", (4, 16, 8, 8, 8), (2,), {}),
    Case("avg_pool3d", (4, 16, 9, 9, 9), (3, 2, 1), {"ceil_mode": True}),
    Case("avg_pool2d", (32, 16, 16), (2,), {}),  # unbatched
]
# Max pools with full windows only (no padding, no partial windows): exact alpha.
MAX_FULL_CASES = [
    Case("max_pool1d", (16, 32, 256), (4,), {}),
    Case("max_pool1d", (16, 32, 256), (3, 1), {}),
    Case("max_pool2d", (8, 16, 32, 32), (2,), {}),
    Case("max_pool2d", (8, 16, 33, 33), (3, 2), {"dilation": 2}),
    Case("max_pool3d", (4, 16, 8, 8, 8), (2,), {}),
]
MAX_EDGE_CASES = [
    Case("max_pool1d", (16, 32, 256), (3, 1, 1), {}),
    Case("max_pool2d", (8, 32, 15, 15), (3, 2, 1), {}),
    Case("max_pool2d", (8, 32, 16, 16), (3, 2, 1, 2), {"ceil_mode": True}),
    Case("max_pool3d", (4, 16, 9, 9, 9), (3, 2, 1), {"ceil_mode": True}),
]
CONSTRAINTS = [None, "to_output_scale", "to_grad_input_scale"]


def _spatial(case: Case) -> int:
    return int(case.op[-2])


def _average_scales(case: Case) -> tuple[float, float]:
    """From the pooling matrix, found by pooling an identity matrix with torch."""
    n = _spatial(case)
    spatial = case.input[-n:]
    n_in = math.prod(spatial)
    eye = torch.eye(n_in, dtype=torch.float64).reshape(n_in, 1, *spatial)
    pooled = case.torch_op(eye)
    norm_sq = pooled.pow(2).sum().item()
    n_out = math.prod(pooled.shape[2:])
    return (n_out / norm_sq) ** 0.5, (n_in / norm_sq) ** 0.5


def _max_variance(k: int) -> float:
    """Variance of the maximum of ``k`` unit normals: trapezoid rule in torch."""
    x = torch.linspace(-12, 12, 48_001, dtype=torch.float64)
    phi = torch.exp(-(x**2) / 2) / math.sqrt(2 * math.pi)
    cdf = 0.5 * torch.erfc(-x / math.sqrt(2))
    density = k * phi * cdf ** (k - 1)
    mean = torch.trapezoid(x * density, x)
    return (torch.trapezoid(x**2 * density, x) - mean**2).item()


def _max_full_scales(case: Case) -> tuple[float, float]:
    n = _spatial(case)
    k = case.args[0]
    kernel = math.prod((k,) * n if isinstance(k, int) else k)
    x = torch.zeros(1, 1, *case.input[-n:])
    n_out = math.prod(case.torch_op(x).shape[2:])
    return _max_variance(kernel) ** -0.5, (math.prod(case.input[-n:]) / n_out) ** 0.5


def test_max_moments_match_closed_forms_and_sampling() -> None:
    mean, var = max_moments(2)
    assert mean == pytest.approx(1 / math.sqrt(math.pi), abs=1e-10)
    assert var == pytest.approx(1 - 1 / math.pi, abs=1e-10)
    mean, var = max_moments(3)
    assert mean == pytest.approx(1.5 / math.sqrt(math.pi), abs=1e-10)
    assert var + mean**2 == pytest.approx(1 + math.sqrt(3) / (2 * math.pi), abs=1e-10)
    assert max_moments(1) == pytest.approx((0.0, 1.0), abs=1e-12)
    for k in (4, 9, 64):
        assert max_moments(k)[1] == pytest.approx(_max_variance(k), rel=1e-7)
    gen = torch.Generator().manual_seed(0)
    samples = torch.randn(400_000, 16, generator=gen, dtype=torch.float64).amax(1)
    assert samples.mean().item() == pytest.approx(max_moments(16)[0], abs=3e-3)
    assert samples.var().item() == pytest.approx(max_moments(16)[1], rel=1e-2)


@pytest.mark.parametrize(
    "case",
    [
        Case("avg_pool1d", (2, 3, 64), (4,), {}),
        Case("avg_pool2d", (2, 3, 32, 32), (2,), {}),
        Case("avg_pool3d", (2, 3, 8, 8, 8), ((2, 4, 2),), {}),
    ],
    ids=str,
)
def test_tiling_average_pool_has_the_textbook_scales(case: Case) -> None:
    n = _spatial(case)
    k, s = case.args[0], case.args[1] if len(case.args) > 1 else case.args[0]
    kernel = math.prod((k,) * n if isinstance(k, int) else k)
    stride = math.prod((s,) * n if isinstance(s, int) else s)
    alpha, beta = _average_scales(case)
    assert alpha == pytest.approx(kernel**0.5, rel=1e-12)
    assert beta == pytest.approx((kernel * stride) ** 0.5, rel=1e-12)


def _check_exact(
    case: Case, scales: tuple[float, float], constraint: str | None
) -> dict[str, Tensor]:
    alpha, beta = apply_constraint(constraint, *scales)
    x = randn(*case.input, seed=1)
    y = case.unit_op(x, constraint=constraint)
    grad = unit_backward(y, seed=2)
    x_ref = x.detach().requires_grad_()
    y_ref = case.torch_op(x_ref)
    y_ref.backward(grad)
    torch.testing.assert_close(y, alpha * y_ref)
    torch.testing.assert_close(x.grad, beta * x_ref.grad)
    return {"y": y, "grad": x.grad}


@pytest.mark.parametrize("constraint", CONSTRAINTS)
@pytest.mark.parametrize("case", AVG_CASES, ids=str)
def test_avg_pool_matches_torch_times_scales(
    case: Case, constraint: str | None
) -> None:
    _check_exact(case, _average_scales(case), constraint)


@pytest.mark.parametrize("constraint", CONSTRAINTS)
@pytest.mark.parametrize("case", MAX_FULL_CASES, ids=str)
def test_max_pool_matches_torch_times_scales(
    case: Case, constraint: str | None
) -> None:
    _check_exact(case, _max_full_scales(case), constraint)


@pytest.mark.parametrize("case", AVG_CASES + MAX_FULL_CASES + MAX_EDGE_CASES, ids=str)
def test_pool_unconstrained_is_unit_scaled(case: Case) -> None:
    x = randn(*case.input, seed=3)
    y = case.unit_op(x, constraint=None)
    unit_backward(y, seed=4)
    std = y.detach().double().std().item()
    assert abs(std - 1) < 0.1, f"output std {std:.4f}"
    assert_unit_scale(x.grad, name="input grad")


@pytest.mark.parametrize("op", ["max_pool1d", "max_pool2d", "max_pool3d"])
def test_max_pool_returns_torch_indices(op: str) -> None:
    n = int(op[-2])
    x = randn(2, 4, *(8,) * n, seed=0)
    y, indices = getattr(U, op)(x, 2, return_indices=True)
    y_ref, indices_ref = getattr(F, op)(x, 2, return_indices=True)
    assert torch.equal(indices, indices_ref)
    torch.testing.assert_close(y, max_moments(2**n)[1] ** -0.5 * y_ref)


def test_pool_gradcheck() -> None:
    x = randn(2, 3, 7, 6, dtype=torch.float64, seed=0)
    case = Case("avg_pool2d", (2, 3, 7, 6), (3, 2, 1), {"ceil_mode": True})
    alpha, beta = _average_scales(case)
    assert gradcheck_scaled(
        lambda t: U.avg_pool2d(t, 3, 2, 1, True, constraint=None), [x], alpha, [beta]
    )
    x = randn(2, 3, 12, dtype=torch.float64, seed=1)
    alpha, beta = max_moments(3)[1] ** -0.5, 3**0.5
    assert gradcheck_scaled(
        lambda t: U.max_pool1d(t, 3, constraint=None), [x], alpha, [beta]
    )


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda: U.avg_pool2d(randn(2, 3, 8, 8), (2, 2, 2)),
            r"kernel_size=\(2, 2, 2\)",
        ),
        (lambda: U.max_pool2d(randn(2, 3, 8, 8), 2, (1, 2, 3)), r"stride=\(1, 2, 3\)"),
        (lambda: U.max_pool3d(randn(2, 3, 8, 8), 2, dilation=(1, 2)), "dilation="),
        (lambda: U.avg_pool1d(randn(8), 2), "1 spatial dims, got \\(8,\\)"),
        (lambda: U.max_pool2d(randn(2, 3, 4, 8, 8), 2), "2 spatial dims"),
        (lambda: U.avg_pool3d(randn(2, 3, 8, 8, 8), 2, constraint="x"), "constraint"),
    ],
)
def test_pool_rejects_bad_arguments(call: Callable[[], Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def test_pools_compile_without_graph_breaks() -> None:
    def f(x: Tensor) -> tuple[Tensor, ...]:
        y, indices = U.max_pool2d(x, 3, 2, 1, return_indices=True)
        return (
            U.avg_pool2d(x, 2, constraint=None),
            y,
            indices,
            U.adaptive_avg_pool2d(x, 3),
            U.adaptive_max_pool2d(x, (5, None)),
        )

    x = randn(2, 4, 10, 10, seed=0)
    for ours, expected in zip(torch.compile(f, fullgraph=True)(x), f(x), strict=True):
        torch.testing.assert_close(ours, expected)
