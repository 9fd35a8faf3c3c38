"""Tests for the unit-scaled activations, ``softmax`` and ``dropout``.

The scaling rules are restated here from the spec (not imported from the code), so
a wrong constant or weight in the implementation fails the exactness tests, and
the unit-scale tests check that the rules do what they claim on random data.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import unit_scaling.functional as U
from benchmarks.op_counts import OpCounter
from tests.helpers import gradcheck_scaled, randn, unit_backward
from unit_scaling.constraints import apply_constraint
from unit_scaling.functional import activation

UNARY_CONSTRAINTS = [None, "to_output_scale", "to_grad_input_scale", "gmean", "amean"]
SHAPES = [(2**16,), (64, 1024), (8, 16, 512)]
RELU_OUT = math.sqrt(2 / (1 - 1 / math.pi))
RELU_GRAD = math.sqrt(2)


def _interp(w: float, lower: float, upper: float) -> float:
    return float(lower ** (1 - w) * upper**w)


def _std(t: Tensor) -> float:
    return t.detach().double().std().item()


def _rms(t: Tensor) -> float:
    return t.detach().double().pow(2).mean().sqrt().item()


def _gaussian_expectation(f: Callable[[Tensor], Tensor]) -> float:
    """E[f(x)] for x ~ N(0, 1), by the trapezoid rule (tails beyond 12σ vanish)."""
    x = torch.linspace(-12, 12, 240_001, dtype=torch.float64)
    density = torch.exp(-(x**2) / 2) / math.sqrt(2 * math.pi)
    return torch.trapezoid(f(x) * density, x).item()


def _tanh_scales() -> tuple[float, float]:
    mean_sq = _gaussian_expectation(lambda x: torch.tanh(x) ** 2)
    grad_sq = _gaussian_expectation(lambda x: (1 - torch.tanh(x) ** 2) ** 2)
    return mean_sq**-0.5, grad_sq**-0.5


def _sigmoid_scales() -> tuple[float, float]:
    mean = _gaussian_expectation(torch.sigmoid)
    var = _gaussian_expectation(lambda x: torch.sigmoid(x) ** 2) - mean**2
    grad_sq = _gaussian_expectation(
        lambda x: (torch.sigmoid(x) * (1 - torch.sigmoid(x))) ** 2
    )
    return var**-0.5, grad_sq**-0.5


@dataclass(frozen=True)
class Unary:
    """An activation, its plain torch counterpart and its (alpha, beta) rule."""

    name: str
    scaled: Callable[[Tensor, float, str | None], Tensor]
    plain: Callable[[Tensor, float], Tensor]
    scales: Callable[[float], tuple[float, float]]
    mults: tuple[float, ...]
    # Unconstrained output std and grad RMS must be within this of 1: tight where
    # the scales are derived exactly, looser for gelu/silu's empirical models.
    rtol: float

    def __repr__(self) -> str:
        return self.name


def _gelu_scales(m: float) -> tuple[float, float]:
    w = 1 / (1 + 0.25 / m**2)
    return _interp(w, 2, RELU_OUT), _interp(w, 2, RELU_GRAD)


def _silu_scales(m: float) -> tuple[float, float]:
    return (
        _interp(1 / (1 + 0.25 / m**2), 2, RELU_OUT),
        _interp(1 / (1 + 1 / m**2), 2, RELU_GRAD),
    )


UNARY = [
    Unary(
        "gelu",
        lambda x, m, c: U.gelu(x, mult=m, constraint=c),
        lambda x, m: F.gelu(x * m) / m,
        _gelu_scales,
        (0.25, 1.0, 4.0),
        rtol=0.08,
    ),
    Unary(
        "gelu_tanh",
        lambda x, m, c: U.gelu(x, mult=m, constraint=c, approximate="tanh"),
        lambda x, m: F.gelu(x * m, approximate="tanh") / m,
        _gelu_scales,
        (0.5, 2.0),
        rtol=0.08,
    ),
    Unary(
        "silu",
        lambda x, m, c: U.silu(x, mult=m, constraint=c),
        lambda x, m: F.silu(x * m) / m,
        _silu_scales,
        (0.25, 1.0, 4.0),
        rtol=0.08,
    ),
    Unary(
        "relu",
        lambda x, m, c: U.relu(x, constraint=c),
        lambda x, m: F.relu(x),
        lambda m: (RELU_OUT, RELU_GRAD),
        (1.0,),
        rtol=0.03,
    ),
    Unary(
        "tanh",
        lambda x, m, c: U.tanh(x, constraint=c),
        lambda x, m: torch.tanh(x),
        lambda m: _tanh_scales(),
        (1.0,),
        rtol=0.03,
    ),
    Unary(
        "sigmoid",
        lambda x, m, c: U.sigmoid(x, constraint=c),
        lambda x, m: torch.sigmoid(x),
        lambda m: _sigmoid_scales(),
        (1.0,),
        rtol=0.03,
    ),
]
UNARY_MULTS = [
    pytest.param(op, m, id=f"{op.name}-{m}") for op in UNARY for m in op.mults
]


@pytest.mark.parametrize("constraint", UNARY_CONSTRAINTS)
@pytest.mark.parametrize(("op", "mult"), UNARY_MULTS)
def test_unary_unit_scale(op: Unary, mult: float, constraint: str | None) -> None:
    alpha, beta = op.scales(mult)
    alpha_c, beta_c = apply_constraint(constraint, alpha, beta)
    for i, shape in enumerate(SHAPES):
        x = randn(*shape, seed=i)
        y = op.scaled(x, mult, constraint)
        unit_backward(y, seed=100 + i)
        assert x.grad is not None
        # Unit scale up to the factor the constraint deliberately introduces.
        out = _std(y) * alpha / alpha_c
        grad = _rms(x.grad) * beta / beta_c
        assert abs(out - 1) <= op.rtol, f"{op} {shape}: output std {out:.4f}"
        assert abs(grad - 1) <= op.rtol, f"{op} {shape}: grad RMS {grad:.4f}"


@pytest.mark.parametrize("constraint", UNARY_CONSTRAINTS)
@pytest.mark.parametrize(("op", "mult"), UNARY_MULTS)
def test_unary_matches_torch_times_scales(
    op: Unary, mult: float, constraint: str | None
) -> None:
    alpha, beta = apply_constraint(constraint, *op.scales(mult))
    x = randn(8, 33, seed=0)
    x_ref = x.detach().clone().requires_grad_()
    y = op.scaled(x, mult, constraint)
    y_ref = op.plain(x_ref, mult)
    torch.testing.assert_close(y, alpha * y_ref)
    grad = unit_backward(y, seed=1)
    y_ref.backward(grad)
    assert x.grad is not None and x_ref.grad is not None
    torch.testing.assert_close(x.grad, beta * x_ref.grad)


@pytest.mark.parametrize("constraint", [None, "to_output_scale"])
@pytest.mark.parametrize("op", UNARY, ids=repr)
def test_unary_gradcheck(op: Unary, constraint: str | None) -> None:
    mult = op.mults[0]
    alpha, beta = apply_constraint(constraint, *op.scales(mult))
    x = randn(4, 5, dtype=torch.float64, seed=0)
    assert gradcheck_scaled(
        lambda t: op.scaled(t, mult, constraint), [x], alpha, [beta]
    )


def test_tanh_and_sigmoid_constants_match_quadrature() -> None:
    # The docstrings state these values; a change of either side fails here.
    tanh_out, tanh_grad = _tanh_scales()
    sigmoid_out, sigmoid_grad = _sigmoid_scales()
    assert tanh_out == pytest.approx(1.592537, abs=1e-6)
    assert tanh_grad == pytest.approx(1.467414, abs=1e-6)
    assert sigmoid_out == pytest.approx(4.801313, abs=1e-6)
    assert sigmoid_grad == pytest.approx(4.722646, abs=1e-6)


def test_silu_glu_unit_scale_and_exactness() -> None:
    for mult in (0.25, 1.0, 4.0):
        scale = _interp(1 / (1 + 1 / mult**2), 2, RELU_GRAD)
        x, gate = randn(256, 256, seed=0), randn(256, 256, seed=1)
        y = U.silu_glu(x, gate, mult=mult)
        grad = unit_backward(y, seed=2)
        assert x.grad is not None and gate.grad is not None
        for name, t in (
            ("output", y),
            ("input grad", x.grad),
            ("gate grad", gate.grad),
        ):
            assert abs(_rms(t) - 1) <= 0.06, f"mult={mult} {name}: RMS {_rms(t):.4f}"

        x_ref = x.detach().clone().requires_grad_()
        gate_ref = gate.detach().clone().requires_grad_()
        y_ref = x_ref * F.silu(gate_ref * mult) / mult
        torch.testing.assert_close(y, scale * y_ref)
        y_ref.backward(grad)
        assert x_ref.grad is not None and gate_ref.grad is not None
        torch.testing.assert_close(x.grad, scale * x_ref.grad)
        torch.testing.assert_close(gate.grad, scale * gate_ref.grad)


def test_silu_glu_gradcheck() -> None:
    scale = _interp(1 / (1 + 1 / 2.0**2), 2, RELU_GRAD)
    x, gate = randn(3, 4, dtype=torch.float64), randn(3, 4, dtype=torch.float64)
    assert gradcheck_scaled(
        lambda a, b: U.silu_glu(a, b, mult=2.0), [x, gate], scale, [scale, scale]
    )


@pytest.mark.parametrize("mult", [1.0, 0.5, 3.0])
def test_silu_glu_double_backward(mult: float) -> None:
    x = randn(3, 4, dtype=torch.float64).requires_grad_()
    gate = randn(3, 4, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradgradcheck(
        lambda a, b: U.silu_glu(a, b, mult=mult), [x, gate]
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_silu_glu_makes_its_zero_once_per_dtype(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 0-d zero that the scaled products add to is made on the first call
    only (a fill kernel per call otherwise), stays zero and never changes what
    the op computes."""
    monkeypatch.setattr(activation, "_ZEROS", {})
    x, gate = randn(16, 8, dtype=dtype, seed=0), randn(16, 8, dtype=dtype, seed=1)
    with torch.inference_mode():  # the first zero, made here, serves outside too
        U.silu_glu(x.detach(), gate.detach())
    with OpCounter() as counter:
        y = U.silu_glu(x, gate, mult=0.5)
        grad = unit_backward(y, seed=2)
    assert not {"new_zeros", "zeros", "fill_", "zero_"} & set(counter.counts)
    (((device, zero_dtype), zero),) = activation._ZEROS.items()
    assert (device.type, zero_dtype) == ("cpu", dtype)
    assert zero.shape == () and zero.item() == 0 and not zero.is_inference()
    x_ref = x.detach().clone().requires_grad_()
    gate_ref = gate.detach().clone().requires_grad_()
    y_ref = U.silu_glu(x_ref, gate_ref, mult=0.5)
    assert torch.equal(y, y_ref) and y.dtype == dtype
    y_ref.backward(grad)
    assert x.grad is not None and torch.equal(x.grad, x_ref.grad)
    assert gate.grad is not None and torch.equal(gate.grad, gate_ref.grad)


def test_silu_glu_zero_is_fresh_for_meta_tensors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(activation, "_ZEROS", {})
    x, gate = torch.empty(4, 3, device="meta"), torch.empty(4, 3, device="meta")
    assert U.silu_glu(x, gate).shape == (4, 3)
    assert activation._ZEROS == {}


def test_silu_glu_one_input_needs_grad() -> None:
    x, gate = torch.randn(8, 4), torch.randn(8, 4, requires_grad=True)
    U.silu_glu(x, gate).sum().backward()
    assert gate.grad is not None and x.grad is None
    gate_ref = gate.detach().clone().requires_grad_()
    (x * F.silu(gate_ref)).sum().backward()
    assert gate_ref.grad is not None
    ratio = gate.grad / gate_ref.grad
    torch.testing.assert_close(ratio, torch.full_like(ratio, ratio[0, 0].item()))


def _softmax_scales(mult: float, n: int) -> tuple[float, float]:
    w = 1 / (1 + 4 / mult**2)
    return _interp(w, n, n**0.5), _interp(w, n / mult, (n / mult) ** 0.5)


@pytest.mark.parametrize("mult", [0.25, 1.0, 4.0])
@pytest.mark.parametrize("n", [16, 256, 4096])
def test_softmax_unit_scale(n: int, mult: float) -> None:
    # The empirical model is exact only in the flat and one-hot limits; in
    # between it stays within a factor 1.5 (worst near mult=1 at large n).
    x = randn(2**18 // n, n, seed=0)
    y = U.softmax(x, dim=-1, mult=mult, constraint=None)
    unit_backward(y, seed=1)
    assert x.grad is not None
    for name, value in (("output RMS", _rms(y)), ("grad RMS", _rms(x.grad))):
        assert 1 / 1.5 < value < 1.5, f"n={n} mult={mult}: {name} {value:.4f}"


def test_softmax_scale_follows_the_model_between_limits() -> None:
    # For large n and mult=1, sum(exp(x)) ≈ n·e^½ and RMS(exp(x)) = e, so the output
    # RMS is e^½/n times alpha = n^0.9: e^½·n^-0.1 (0.718 at n=4096), not 1.
    n = 4096
    x = randn(64, n, seed=0)
    y = U.softmax(x, dim=-1, constraint=None)
    assert _rms(y) == pytest.approx(math.exp(0.5) * n**-0.1, rel=0.03)


@pytest.mark.parametrize("constraint", UNARY_CONSTRAINTS)
@pytest.mark.parametrize(("mult", "dim"), [(1.0, -1), (0.5, 0), (3.0, 1)])
def test_softmax_matches_torch_times_scales(
    mult: float, dim: int, constraint: str | None
) -> None:
    x = randn(6, 10, 7, seed=0)
    alpha, beta = apply_constraint(constraint, *_softmax_scales(mult, x.shape[dim]))
    x_ref = x.detach().clone().requires_grad_()
    y = U.softmax(x, dim, mult=mult, constraint=constraint)
    y_ref = F.softmax(x_ref * mult, dim)
    torch.testing.assert_close(y, alpha * y_ref)
    grad = unit_backward(y, seed=1)
    y_ref.backward(grad)
    assert x.grad is not None and x_ref.grad is not None
    torch.testing.assert_close(x.grad, beta * x_ref.grad)


def test_softmax_dtype_and_implicit_dim() -> None:
    x = torch.randn(5, 8)
    y = U.softmax(x, -1, dtype=torch.float64, constraint=None)
    assert y.dtype == torch.float64
    torch.testing.assert_close(
        y, _softmax_scales(1.0, 8)[0] * F.softmax(x.double(), -1)
    )
    with pytest.warns(UserWarning, match="implicit dimension"):
        y_implicit = U.softmax(x)  # torch's rule: dim=1 for a 2-D input
    torch.testing.assert_close(y_implicit, _softmax_scales(1.0, 8)[0] * F.softmax(x, 1))


def test_softmax_gradcheck() -> None:
    alpha, beta = _softmax_scales(2.0, 6)
    x = randn(3, 6, dtype=torch.float64)
    assert gradcheck_scaled(
        lambda t: U.softmax(t, -1, mult=2.0, constraint=None), [x], alpha, [beta]
    )


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_unit_scale_and_exactness(p: float) -> None:
    x = randn(2**16, seed=0)
    y = U.dropout(x, p)
    grad = unit_backward(y, seed=1)
    assert x.grad is not None
    assert abs(_std(y) - 1) < 0.05
    assert abs(_rms(x.grad) - 1) < 0.05
    kept = y != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 0.01
    torch.testing.assert_close(y, torch.where(kept, x / math.sqrt(1 - p), 0.0))
    torch.testing.assert_close(x.grad, torch.where(kept, grad / math.sqrt(1 - p), 0.0))


def test_dropout_identity_cases_and_gradcheck() -> None:
    x = torch.randn(10)
    assert U.dropout(x, 0.5, training=False) is x
    assert U.dropout(x, 0.0) is x
    assert torch.equal(U.dropout(x, 1.0), torch.zeros(10))

    def fixed_mask_dropout(t: Tensor) -> Tensor:
        with torch.random.fork_rng():
            torch.manual_seed(0)
            return U.dropout(t, 0.3)

    scale = 0.7**0.5
    x64 = randn(20, dtype=torch.float64)
    assert gradcheck_scaled(fixed_mask_dropout, [x64], scale, [scale])


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda x: U.gelu(x, constraint="bogus"), ValueError, "constraint='bogus'"),
        (lambda x: U.relu(x, constraint="to_left_grad_scale"), ValueError, "3 scales"),
        (lambda x: U.silu(x, mult=0.0), ValueError, "mult must be a positive"),
        (lambda x: U.gelu(x, mult=-1.0), ValueError, "mult must be a positive"),
        (lambda x: U.softmax(x, -1, mult=0.0), ValueError, "mult must be a positive"),
        (lambda x: U.softmax(x, -1, constraint="x"), ValueError, "constraint='x'"),
        (lambda x: U.tanh(x, constraint="x"), ValueError, "constraint='x'"),
        (lambda x: U.sigmoid(x, constraint="x"), ValueError, "constraint='x'"),
        (lambda x: U.dropout(x, p=1.5), ValueError, "p must be a probability"),
        (lambda x: U.silu_glu(x, x[:2]), ValueError, r"same shape.*\(4, 3\).*\(2, 3\)"),
    ],
)
def test_bad_arguments_raise(
    call: Callable[[Tensor], Tensor], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        call(torch.randn(4, 3))


def test_compile_fullgraph_matches_eager() -> None:
    def activations(x: Tensor, gate: Tensor) -> tuple[Tensor, ...]:
        return (
            U.gelu(x, mult=2.0, constraint=None),
            U.silu(x),
            U.silu_glu(x, gate, mult=0.5),
            U.relu(x, constraint="gmean"),
            U.tanh(x),
            U.sigmoid(x),
            U.softmax(x, -1, mult=2.0),
            U.dropout(x, 0.5, training=False),
        )

    compiled = torch.compile(activations, fullgraph=True)
    inputs = [randn(16, 32, seed=0), randn(16, 32, seed=1)]
    inputs_ref = [t.detach().clone().requires_grad_() for t in inputs]
    outputs, outputs_ref = compiled(*inputs), activations(*inputs_ref)
    for y, y_ref in zip(outputs, outputs_ref, strict=True):
        torch.testing.assert_close(y, y_ref)
    torch.stack(outputs).sum().backward()
    torch.stack(outputs_ref).sum().backward()
    for t, t_ref in zip(inputs, inputs_ref, strict=True):
        torch.testing.assert_close(t.grad, t_ref.grad)


def _seeded_dropout(t: Tensor, inplace: bool) -> Tensor:
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return U.dropout(t, 0.3, True, inplace)


# Every function with torch's `inplace` argument, called positionally as in torch.
INPLACE: dict[str, Callable[[Tensor, bool], Tensor]] = {
    "relu": lambda t, inplace: U.relu(t, inplace),
    "relu-unconstrained": lambda t, inplace: U.relu(t, inplace, constraint=None),
    "silu": lambda t, inplace: U.silu(t, inplace),
    "silu-mult": lambda t, inplace: U.silu(t, inplace, mult=2.0),
    "silu-unconstrained": lambda t, inplace: U.silu(t, inplace, constraint=None),
    "dropout": _seeded_dropout,
}


@pytest.mark.parametrize("name", sorted(INPLACE))
def test_inplace_overwrites_input_with_the_same_result_and_gradient(
    name: str,
) -> None:
    op = INPLACE[name]
    x = randn(8, 33, seed=0)
    x_ref = x.detach().clone().requires_grad_()
    h = x * 1.0  # a non-leaf, which torch allows to be overwritten
    y = op(h, True)
    y_ref = op(x_ref * 1.0, False)
    assert y is h
    torch.testing.assert_close(h, y_ref, rtol=0, atol=0)
    grad = unit_backward(y, seed=1)
    y_ref.backward(grad)
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=0, atol=0)
    if "unconstrained" not in name:  # the backward is the true gradient
        x64 = randn(4, 5, dtype=torch.float64, seed=2)
        assert torch.autograd.gradcheck(lambda t: op(t * 1.0, True), [x64])


@pytest.mark.parametrize("name", sorted(INPLACE))
def test_inplace_on_a_leaf_that_requires_grad_raises_like_torch(name: str) -> None:
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        INPLACE[name](randn(4, 3), True)
    with torch.no_grad():
        x = torch.randn(4, 3)
        expected = INPLACE[name](x.clone(), False)
        assert INPLACE[name](x, True) is x
        torch.testing.assert_close(x, expected)
