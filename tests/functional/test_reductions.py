"""Tests for the unit-scaled ``sum`` and ``mean``.

The rule (output ``n^-½ · sum``, gradient ``1 · ∂y`` relative to the plain sum,
before the constraint) is restated here. Tolerance: outputs checked for unit
scale have ``N >= 4096`` elements, so ``rtol=0.1`` is > 9σ of the RMS estimate
(``1/sqrt(2N)``).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import unit_scaling.functional as U
from tests.helpers import assert_unit_scale, gradcheck_scaled, randn, unit_backward

CASES = [
    # (input shape, dim, keepdim, n reduced per output element)
    ((4096, 64), -1, False, 64),
    ((16, 4096, 16), (0, 2), False, 256),
    ((16, 4096, 16), [2, 0], True, 256),
    ((64, 4096), 0, True, 64),
]
CONSTRAINTS = [None, "to_output_scale", "to_grad_input_scale", "gmean", "amean"]


def _scales(constraint: str | None, n: int) -> tuple[float, float]:
    """(output, grad) scales relative to the plain sum, after the constraint."""
    alpha, beta = n**-0.5, 1.0
    return {
        None: (alpha, beta),
        "to_output_scale": (alpha, alpha),
        "to_grad_input_scale": (beta, beta),
        "gmean": ((alpha * beta) ** 0.5,) * 2,
        "amean": ((alpha + beta) / 2,) * 2,
    }[constraint]


@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("constraint", CONSTRAINTS)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_reduction_matches_plain_sum_times_scales(
    case: tuple[tuple[int, ...], Any, bool, int], constraint: str | None, op: str
) -> None:
    shape, dim, keepdim, n = case
    x = randn(*shape, seed=1)
    y = getattr(U, op)(x, dim, keepdim, constraint=constraint)
    grad = unit_backward(y)
    out_scale, grad_scale = _scales(constraint, n)
    x_ref = x.detach().requires_grad_()
    y_ref = torch.sum(x_ref, dim, keepdim)
    y_ref.backward(grad)
    torch.testing.assert_close(y, out_scale * y_ref)
    torch.testing.assert_close(x.grad, grad_scale * x_ref.grad)
    if constraint in (None, "to_output_scale"):
        assert_unit_scale(y, name="output")
    if constraint is None:
        assert_unit_scale(x.grad, name="input grad")


def test_mean_relative_to_plain_mean() -> None:
    x = randn(512, 128)
    y = U.mean(x, -1, constraint=None)
    grad = unit_backward(y)
    torch.testing.assert_close(y, 128**0.5 * x.detach().mean(-1))
    torch.testing.assert_close(x.grad, grad.unsqueeze(-1).expand(512, 128))


@pytest.mark.parametrize("dim", [None, ()])
def test_full_reduction_and_dtype(dim: Any) -> None:
    x = randn(8, 32)
    y = U.sum(x, dim, dtype=torch.float64)
    assert y.dtype == torch.float64 and y.shape == ()
    torch.testing.assert_close(y, x.detach().double().sum() / 16)
    y = U.mean(x, dim, keepdim=dim is None)
    assert y.shape == torch.sum(x, dim, keepdim=dim is None).shape


def test_zero_dim_input() -> None:
    x = torch.tensor(3.0)
    torch.testing.assert_close(U.sum(x, 0), x)
    torch.testing.assert_close(U.mean(x), x)


def test_reductions_gradcheck() -> None:
    x = torch.randn(3, 4, 5, dtype=torch.float64, requires_grad=True)
    assert gradcheck_scaled(
        lambda t: U.sum(t, (0, 2), constraint=None), [x], 15**-0.5, [1.0]
    )
    assert gradcheck_scaled(lambda t: U.mean(t, 1), [x], 0.5, [0.5])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dim": 3}, r"dim=3 is out of range .* \[-3, 2\]"),
        ({"dim": (0, -3)}, r"dim=\(0, -3\) repeats a dimension"),
        ({"constraint": "to_left_grad_scale"}, "exactly 3 scales"),
        ({"constraint": "median"}, "not a known constraint"),
    ],
)
@pytest.mark.parametrize("op", ["sum", "mean"])
def test_reductions_reject_bad_arguments(
    op: str, kwargs: dict[str, Any], match: str
) -> None:
    error = IndexError if "out of range" in match else ValueError
    with pytest.raises(error, match=match):
        getattr(U, op)(randn(2, 3, 4), **kwargs)
