"""Tests for ``add`` and the residual ops ``residual_split/add/apply``.

Expected scales are restated from the rules (not imported from the code).
Tolerances: the RMS of ``N`` unit-variance samples has relative standard deviation
about ``1/sqrt(2N)``; every tensor checked for unit scale here has ``N >= 4096``,
so ``rtol=0.1`` is more than 6 standard deviations.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import unit_scaling.functional as U
from tests.helpers import assert_unit_scale, gradcheck_scaled, randn, unit_backward
from unit_scaling.scale import scale_bwd

ADD_SHAPES = [
    # (input, other, output scale, input grad scale, other grad scale)
    ((64, 1024), (64, 1024), 2**-0.5, 1.0, 1.0),
    ((16, 4096), (4096,), 2**-0.5, 1.0, 16**-0.5),
    ((8, 1, 4096), (1, 4, 4096), 2**-0.5, 4**-0.5, 8**-0.5),
    ((64, 1024), (1,), 1.0, 1.0, (64 * 1024) ** -0.5),
]
ADD_CONSTRAINTS = [
    None,
    "to_output_scale",
    "to_left_grad_scale",
    "to_right_grad_scale",
    "gmean",
    "hmean",
    "amean",
]


def _constrained(constraint: str | None, *scales: float) -> tuple[float, ...]:
    shared = {
        "to_output_scale": scales[0],
        "to_left_grad_scale": scales[1],
        "to_right_grad_scale": scales[2],
        "gmean": math.prod(scales) ** (1 / 3),
        "hmean": 3 / sum(1 / s for s in scales),
        "amean": sum(scales) / 3,
    }
    return scales if constraint is None else (shared[constraint],) * 3


@pytest.mark.parametrize("shapes", ADD_SHAPES, ids=str)
@pytest.mark.parametrize("constraint", ADD_CONSTRAINTS)
def test_add_matches_plain_add_times_scales(
    shapes: tuple[tuple[int, ...], tuple[int, ...], float, float, float],
    constraint: str | None,
) -> None:
    a_shape, b_shape, *scales = shapes
    out_scale, a_scale, b_scale = _constrained(constraint, *scales)
    a, b = randn(*a_shape, seed=1), randn(*b_shape, seed=2)
    y = U.add(a, b, constraint=constraint)
    grad = unit_backward(y)
    a_ref, b_ref = a.detach().requires_grad_(), b.detach().requires_grad_()
    y_ref = a_ref + b_ref
    y_ref.backward(grad)
    torch.testing.assert_close(y, out_scale * y_ref)
    torch.testing.assert_close(a.grad, a_scale * a_ref.grad)
    torch.testing.assert_close(b.grad, b_scale * b_ref.grad)


@pytest.mark.parametrize("shapes", ADD_SHAPES[:3], ids=str)
def test_add_unconstrained_is_unit_scaled(
    shapes: tuple[tuple[int, ...], tuple[int, ...], float, float, float],
) -> None:
    a, b = randn(*shapes[0], seed=1), randn(*shapes[1], seed=2)
    y = U.add(a, b, constraint=None)
    unit_backward(y)
    assert_unit_scale(y, name="output")
    assert_unit_scale(a.grad, name="input grad")
    assert_unit_scale(b.grad, name="other grad")


def test_add_default_constraint_gives_unit_output_and_true_gradient() -> None:
    a, b = randn(64, 1024, seed=1), randn(64, 1024, seed=2)
    y = U.add(a, b)
    unit_backward(y)
    assert_unit_scale(y)
    # The true gradient of 2^-1/2 (a + b) is 2^-1/2 times the output gradient.
    torch.testing.assert_close(a.grad, b.grad)
    assert_unit_scale(a.grad * 2**0.5)


def test_add_alpha_is_part_of_the_function() -> None:
    a, b = randn(8, 16, seed=1), randn(8, 16, seed=2)
    y = U.add(a, b, alpha=3.0)
    grad = unit_backward(y)
    torch.testing.assert_close(y, 2**-0.5 * torch.add(a, b, alpha=3.0))
    torch.testing.assert_close(b.grad, 3 * 2**-0.5 * grad)


def test_add_passes_non_float_tensors_through_unscaled() -> None:
    x = randn(4, 8)
    y = U.add(x, 2.0)
    y.sum().backward()
    torch.testing.assert_close(y, x + 2.0)
    torch.testing.assert_close(x.grad, torch.ones(4, 8))
    torch.testing.assert_close(U.add(3, x), 3 + x)
    assert U.add(3, 4) == 7
    assert U.add(3, 4, alpha=2) == 11
    assert U.add((1, 2), (3,)) == (1, 2, 3)
    positions = torch.arange(4)
    assert torch.equal(U.add(positions, positions), 2 * positions)


def test_add_gradcheck() -> None:
    a = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, requires_grad=True)
    assert gradcheck_scaled(
        lambda x, y: U.add(x, y, constraint=None), [a, b], 2**-0.5, [1.0, 3**-0.5]
    )


def test_add_rejects_bad_constraints_and_positional_alpha() -> None:
    a, b = randn(4), randn(4)
    with pytest.raises(ValueError, match="not a known constraint"):
        U.add(a, b, constraint="to_input_scale")
    with pytest.raises(ValueError, match=r"'to_grad_input_scale'.*exactly 2 scales"):
        U.add(a, b, constraint="to_grad_input_scale")
    with pytest.raises(TypeError):
        U.add(a, b, 2.0)  # type: ignore[misc]  # alpha is keyword-only, as in torch


def _weights(tau: float) -> tuple[float, float]:
    return tau / math.sqrt(1 + tau**2), 1 / math.sqrt(1 + tau**2)


@pytest.mark.parametrize("tau", [0.0, 0.01, 0.5, 1.0, 3.0])
def test_residual_split_forward_views_and_weighted_gradient(tau: float) -> None:
    x = randn(32, 64)
    residual, skip = U.residual_split(x, tau)
    assert torch.equal(residual, x) and torch.equal(skip, x)
    assert residual.data_ptr() == skip.data_ptr() == x.data_ptr()  # no copies
    g_residual, g_skip = torch.randn(32, 64), torch.randn(32, 64)
    torch.autograd.backward([residual, skip], [g_residual, g_skip])
    a, b = _weights(tau)
    torch.testing.assert_close(x.grad, a * g_residual + b * g_skip)


def test_residual_split_with_one_output_used() -> None:
    a, b = _weights(0.5)
    x = randn(8, 16)
    residual, _ = U.residual_split(x, 0.5)
    grad = unit_backward(residual)
    torch.testing.assert_close(x.grad, a * grad)
    x.grad = None
    _, skip = U.residual_split(x, 0.5)
    grad = unit_backward(skip)
    torch.testing.assert_close(x.grad, b * grad)


@pytest.mark.parametrize("tau", [0.01, 0.5, 2.0])
def test_residual_add_forward_weights_and_passes_gradient(tau: float) -> None:
    a, b = _weights(tau)
    residual, skip = randn(64, 1024, seed=1), randn(64, 1024, seed=2)
    y = U.residual_add(residual, skip, tau)
    grad = unit_backward(y)
    torch.testing.assert_close(y, a * residual + b * skip)
    torch.testing.assert_close(residual.grad, grad)
    torch.testing.assert_close(skip.grad, grad)
    assert_unit_scale(y)


def test_residual_add_broadcast_operand_gets_summed_gradient() -> None:
    residual, skip = randn(8, 16), randn(16)
    grad = unit_backward(U.residual_add(residual, skip, 0.5))
    torch.testing.assert_close(skip.grad, grad.sum(0))


@pytest.mark.parametrize("tau", [0.01, 0.5, 1.0, 4.0])
def test_residual_apply_is_unit_scaled(tau: float) -> None:
    x, weight = randn(256, 512, seed=1), randn(512, 512, seed=2)
    y = U.residual_apply(lambda r: U.linear(r, weight), x, tau)
    unit_backward(y)
    assert_unit_scale(y, name="output")
    assert_unit_scale(x.grad, name="input grad")


def test_residual_apply_has_the_true_input_gradient_of_the_weighted_sum() -> None:
    """``x`` gets the true gradient of ``a·f(x) + b·x``; the branch's own parameters
    see the unweighted output gradient, i.e. ``1/a`` times their true gradient (a
    constant per-branch factor, which is what keeps them unit-scaled)."""
    a, b = _weights(0.5)
    x, weight = randn(16, 32, seed=1), randn(32, 32, seed=2)
    y = U.residual_apply(lambda r: torch.tanh(F.linear(r, weight)), x, 0.5)
    grad = unit_backward(y)
    x_ref, w_ref = x.detach().requires_grad_(), weight.detach().requires_grad_()
    y_ref = a * torch.tanh(F.linear(x_ref, w_ref)) + b * x_ref
    y_ref.backward(grad)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(weight.grad, w_ref.grad / a)


def test_residual_ops_gradcheck() -> None:
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    # split + add together compute a·tanh(x) + b·x with its true gradient.
    assert gradcheck_scaled(
        lambda t: U.residual_apply(torch.tanh, t, 0.7), [x], 1.0, [1.0]
    )
    # split alone: undo each output's gradient weight to get the identity.
    a, b = _weights(0.7)

    def split(t: Tensor) -> tuple[Tensor, Tensor]:
        residual, skip = U.residual_split(t, 0.7)
        return scale_bwd(residual, 1 / a), scale_bwd(skip, 1 / b)

    assert torch.autograd.gradcheck(split, (x,))


@pytest.mark.parametrize("op", ["residual_split", "residual_add", "residual_apply"])
def test_residual_ops_reject_negative_tau(op: str) -> None:
    x = randn(4)
    calls = {
        "residual_split": lambda: U.residual_split(x, -1.0),
        "residual_add": lambda: U.residual_add(x, x, -1.0),
        "residual_apply": lambda: U.residual_apply(torch.tanh, x, float("nan")),
    }
    with pytest.raises(ValueError, match=r"tau=.*non-negative"):
        calls[op]()


def test_residual_block_compiles_fullgraph_and_matches_eager() -> None:
    """One compile for a small pre-norm block: embedding, the residual ops, a
    norm, a linear layer, ``add`` and a reduction."""
    tokens = torch.randint(0, 16, (4, 8), generator=torch.Generator().manual_seed(0))

    def block(emb: Tensor, w: Tensor, norm_w: Tensor, bias: Tensor) -> Tensor:
        def branch(r: Tensor) -> Tensor:
            return U.linear(U.rms_norm(r, (32,), norm_w), w)

        x = U.embedding(tokens, emb)
        y = U.residual_apply(branch, x, 0.5)
        return U.mean(U.add(y, bias, constraint=None), -1)

    inputs = [randn(16, 32, seed=1), randn(32, 32, seed=2), randn(32, seed=3)]
    inputs.append(randn(32, seed=4))
    compiled = torch.compile(block, fullgraph=True)
    results = []
    for fn in (block, compiled):
        xs = [t.detach().clone().requires_grad_() for t in inputs]
        y = fn(*xs)
        unit_backward(y)
        results.append([y.detach(), *(t.grad for t in xs)])
    for eager, comp in zip(*results, strict=True):
        torch.testing.assert_close(comp, eager)
