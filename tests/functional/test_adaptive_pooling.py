"""Tests for the unit-scaled ``adaptive_{avg,max}_pool{1,2,3}d``.

Expected scales are recomputed independently, as in ``test_pooling``: the
average pool's matrix comes from torch's adaptive average pool applied to an
identity matrix; its nonzero pattern gives each output window's size, and the
max pool's ``alpha`` is ``1 / std`` over the mixture of the maxima of those
sizes (quadrature in torch), ``beta = (n_in / n_out)^½``.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import unit_scaling.functional as U
from tests.functional.test_pooling import CONSTRAINTS, _max_variance
from tests.helpers import assert_unit_scale, gradcheck_scaled, randn, unit_backward
from unit_scaling.constraints import apply_constraint

CASES: list[tuple[str, tuple[int, ...], Any]] = [
    ("adaptive_avg_pool1d", (16, 32, 100), 10),  # K = S = 10
    ("adaptive_avg_pool1d", (16, 32, 100), 7),  # windows of 15 and 16, overlapping
    ("adaptive_avg_pool2d", (8, 32, 32, 32), (5, None)),
    ("adaptive_avg_pool2d", (64, 64, 7, 7), 1),  # global average
    ("adaptive_avg_pool3d", (4, 16, 16, 16, 16), 3),
    ("adaptive_avg_pool2d", (32, 13, 13), 4),  # unbatched
    ("adaptive_max_pool1d", (16, 32, 100), 25),
    ("adaptive_max_pool1d", (64, 32, 100), 7),
    ("adaptive_max_pool2d", (8, 32, 32, 32), (5, 3)),
    ("adaptive_max_pool2d", (64, 64, 7, 7), 1),
    ("adaptive_max_pool3d", (4, 16, 16, 16, 16), 4),
]


def _ids(case: tuple[str, tuple[int, ...], Any]) -> str:
    return f"{case[0]}{case[1]}->{case[2]}"


def _max_mean(k: int) -> float:
    x = torch.linspace(-12, 12, 48_001, dtype=torch.float64)
    phi = torch.exp(-(x**2) / 2) / math.sqrt(2 * math.pi)
    cdf = 0.5 * torch.erfc(-x / math.sqrt(2))
    return torch.trapezoid(x * k * phi * cdf ** (k - 1), x).item()


def _expected_scales(op: str, shape: tuple[int, ...], size: Any) -> tuple[float, float]:
    n = int(op[-2])
    spatial = shape[-n:]
    n_in = math.prod(spatial)
    eye = torch.eye(n_in, dtype=torch.float64).reshape(n_in, 1, *spatial)
    matrix = getattr(F, op.replace("max", "avg"))(eye, size).reshape(n_in, -1).T
    n_out = matrix.shape[0]
    if "avg" in op:
        norm_sq = matrix.pow(2).sum().item()
        return (n_out / norm_sq) ** 0.5, (n_in / norm_sq) ** 0.5
    sizes = (matrix != 0).sum(1).tolist()
    means = [_max_mean(k) for k in sizes]
    second = [_max_variance(k) + m**2 for k, m in zip(sizes, means, strict=True)]
    variance = sum(second) / n_out - (sum(means) / n_out) ** 2
    return variance**-0.5, (n_in / n_out) ** 0.5


@pytest.mark.parametrize("constraint", CONSTRAINTS)
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_adaptive_pool_matches_torch_times_scales(
    case: tuple[str, tuple[int, ...], Any], constraint: str | None
) -> None:
    op, shape, size = case
    alpha, beta = apply_constraint(constraint, *_expected_scales(op, shape, size))
    x = randn(*shape, seed=1)
    y = getattr(U, op)(x, size, constraint=constraint)
    grad = unit_backward(y, seed=2)
    x_ref = x.detach().requires_grad_()
    y_ref = getattr(F, op)(x_ref, size)
    y_ref.backward(grad)
    torch.testing.assert_close(y, alpha * y_ref)
    torch.testing.assert_close(x.grad, beta * x_ref.grad)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_adaptive_pool_unconstrained_is_unit_scaled(
    case: tuple[str, tuple[int, ...], Any],
) -> None:
    op, shape, size = case
    x = randn(*shape, seed=3)
    y = getattr(U, op)(x, size, constraint=None)
    unit_backward(y, seed=4)
    std = y.detach().double().std().item()
    assert abs(std - 1) < 0.1, f"output std {std:.4f}"
    assert_unit_scale(x.grad, name="input grad")


def test_divisible_adaptive_average_has_the_textbook_scales() -> None:
    alpha, beta = _expected_scales("adaptive_avg_pool1d", (1, 1, 100), 10)
    assert (alpha, beta) == pytest.approx((10**0.5, 10.0), rel=1e-12)
    x = randn(4, 3, 100, seed=0)
    y = U.adaptive_avg_pool1d(x, 10, constraint=None)
    torch.testing.assert_close(y, 10**0.5 * F.adaptive_avg_pool1d(x, 10))


def test_adaptive_max_pool_returns_torch_indices() -> None:
    x = randn(2, 4, 9, 9, seed=0)
    y, indices = U.adaptive_max_pool2d(x, 4, return_indices=True)
    y_ref, indices_ref = F.adaptive_max_pool2d(x, 4, return_indices=True)
    assert torch.equal(indices, indices_ref)
    alpha, _ = _expected_scales("adaptive_max_pool2d", (9, 9), 4)
    torch.testing.assert_close(y, alpha * y_ref)


def test_adaptive_pool_gradcheck() -> None:
    x = randn(2, 3, 7, 5, dtype=torch.float64, seed=0)
    alpha, beta = _expected_scales("adaptive_avg_pool2d", (7, 5), (3, 2))
    assert gradcheck_scaled(
        lambda t: U.adaptive_avg_pool2d(t, (3, 2), constraint=None), [x], alpha, [beta]
    )
    x = randn(2, 3, 10, dtype=torch.float64, seed=1)
    alpha, beta = _expected_scales("adaptive_max_pool1d", (10,), 3)
    assert gradcheck_scaled(
        lambda t: U.adaptive_max_pool1d(t, 3, constraint=None), [x], alpha, [beta]
    )


@pytest.mark.parametrize(
    ("op", "input", "size", "match"),
    [
        ("adaptive_avg_pool2d", (2, 3, 8, 8), (2, 2, 2), r"output_size=\(2, 2, 2\)"),
        ("adaptive_max_pool1d", (8,), 2, "1 spatial dims"),
        ("adaptive_avg_pool3d", (8, 8), 2, "3 spatial dims"),
    ],
)
def test_adaptive_pool_rejects_bad_arguments(
    op: str, input: tuple[int, ...], size: Any, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        getattr(U, op)(randn(*input), size)
