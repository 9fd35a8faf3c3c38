"""Tests for the unit-scaled matrix products: linear, linear_readout, matmul, bmm,
einsum.

Each case states its expected scales by hand from the rules (a gradient element
sums as many unit terms as there are indices it is summed over). Tolerance: the RMS
of ``N`` unit-variance samples has relative standard deviation ``≈ 1/sqrt(2N)``;
:func:`_assert_unit` allows ``max(0.1, 6/sqrt(2N))``, i.e. at least 6σ.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import unit_scaling.functional as U
from tests.helpers import (
    assert_unit_scale,
    gradcheck_scaled,
    grads,
    randn,
    unit_backward,
)

THREE_SCALE_CONSTRAINTS = [
    None,
    "to_output_scale",
    "to_left_grad_scale",
    "to_right_grad_scale",
    "gmean",
    "hmean",
    "amean",
]
TWO_SCALE_CONSTRAINTS = [
    None,
    "to_output_scale",
    "to_grad_input_scale",
    "gmean",
    "amean",
]


def _assert_unit(t: Tensor, name: str) -> None:
    assert_unit_scale(t, rtol=max(0.1, 6 / (2 * t.numel()) ** 0.5), name=name)


def _constrained(constraint: str | None, *scales: float) -> tuple[float, ...]:
    """The spec's constraints, restated (the last two need exactly 3 scales)."""
    if constraint is None:
        return scales
    n = len(scales)
    shared = {
        "to_output_scale": lambda: scales[0],
        "to_grad_input_scale": lambda: scales[1],
        "to_left_grad_scale": lambda: scales[1],
        "to_right_grad_scale": lambda: scales[2],
        "gmean": lambda: torch.tensor(scales).prod().item() ** (1 / n),
        "hmean": lambda: n / sum(1 / s for s in scales),
        "amean": lambda: sum(scales) / n,
    }[constraint]()
    return (shared,) * n


def _leaves(*tensors: Tensor) -> list[Tensor]:
    return [t.detach().requires_grad_() for t in tensors]


# --- linear -------------------------------------------------------------------


@pytest.mark.parametrize("constraint", TWO_SCALE_CONSTRAINTS)
@pytest.mark.parametrize("input_shape", [(256, 512), (4, 64, 512), (512,)], ids=str)
def test_linear_matches_torch_times_scales(
    input_shape: tuple[int, ...], constraint: str | None
) -> None:
    x, w, b = randn(*input_shape, seed=1), randn(1024, 512, seed=2), randn(1024, seed=3)
    batch = x.numel() // 512
    alpha, beta_x = _constrained(constraint, 512**-0.5, 1024**-0.5)
    beta_w = batch**-0.5
    y = U.linear(x, w, b, constraint=constraint)
    grad = unit_backward(y)
    refs = _leaves(x, w, b)
    y_ref = F.linear(*refs)
    y_ref.backward(grad)
    torch.testing.assert_close(y, alpha * y_ref)
    expected = (beta_x, beta_w, beta_w)
    for got, ref, scale in zip(grads(x, w, b), grads(*refs), expected, strict=True):
        torch.testing.assert_close(got, scale * ref)
    if constraint is None and batch > 1:
        for t, name in zip((y, *grads(x, w, b)), ("y", "x", "w", "b"), strict=True):
            _assert_unit(t, name)


def test_linear_scale_power_and_readout() -> None:
    x, w = randn(64, 256, seed=1), randn(32, 256, seed=2)
    torch.testing.assert_close(U.linear(x, w, scale_power=(0, 0, 0)), F.linear(x, w))
    readout = U.linear_readout(x, w)
    grad = unit_backward(readout)
    x_ref, w_ref = _leaves(x, w)
    F.linear(x_ref, w_ref).backward(grad)
    torch.testing.assert_close(readout, F.linear(x, w) / 256)
    # Unconstrained: the input gradient keeps its own fan_out^-½ scale.
    torch.testing.assert_close(x.grad, 32**-0.5 * x_ref.grad)
    torch.testing.assert_close(w.grad, 64**-0.5 * w_ref.grad)


def test_linear_scales_memoised_per_shape() -> None:
    """Eager ``linear`` memoises its scales per shape; the cache must not change
    results, accept what the uncached path rejects, or mind a list scale_power."""
    x, w = randn(16, 64, seed=1), randn(32, 64, seed=2)
    first = U.linear(x, w, scale_power=(0.5, 0.5, 0.5))
    again = U.linear(x, w, scale_power=[0.5, 0.5, 0.5])  # type: ignore[arg-type]
    torch.testing.assert_close(first, again)
    torch.testing.assert_close(first, F.linear(x, w) / 8)
    # A different batch gets its own weight-gradient scale, not a cached one.
    x2 = randn(4, 64, seed=3).requires_grad_()
    w2 = w.detach().clone().requires_grad_()
    U.linear(x2, w2).backward(torch.ones(4, 32))
    torch.testing.assert_close(w2.grad, 4**-0.5 * torch.ones(4, 32).t() @ x2.detach())
    for _ in range(2):  # rejected on every call, not only the first
        with pytest.raises(ValueError, match="constraint='gmeen'"):
            U.linear(x, w, constraint="gmeen")


def test_linear_compiles_without_cache_warning() -> None:
    """Under torch.compile the scales are traced, not read through lru_cache
    (which Dynamo would warn about)."""
    x, w = randn(4, 16, seed=1), randn(8, 16, seed=2)
    compiled = torch.compile(U.linear, fullgraph=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.testing.assert_close(compiled(x, w), U.linear(x, w))
    assert not [c for c in caught if "lru_cache" in str(c.message)]


def test_linear_non_contiguous_input() -> None:
    x, w = randn(256, 64, seed=1), randn(32, 256, seed=2)
    y = U.linear(x.t(), w)
    grad = unit_backward(y)
    x_ref, w_ref = _leaves(x, w)
    F.linear(x_ref.t(), w_ref).backward(grad)
    torch.testing.assert_close(y, F.linear(x.t(), w) / 16)
    torch.testing.assert_close(x.grad, x_ref.grad / 16)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (((4, 8), (16, 4), None), r"expected input of shape \(\.\.\., in_features\)"),
        (((4, 8), (16, 8), (8,)), r"expected bias of shape \(16,\)"),
        (((), (16, 8), None), "expected input of shape"),
    ],
)
def test_linear_rejects_bad_shapes(
    args: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...] | None], match: str
) -> None:
    x_shape, w_shape, b_shape = args
    b = None if b_shape is None else torch.randn(b_shape)
    with pytest.raises(ValueError, match=match):
        U.linear(torch.randn(x_shape), torch.randn(w_shape), b)


def test_linear_rejects_bad_constraints() -> None:
    with pytest.raises(ValueError, match="exactly 3 scales"):
        U.linear(randn(4, 8), randn(16, 8), constraint="to_left_grad_scale")
    with pytest.raises(ValueError, match="not a known constraint"):
        U.linear(randn(4, 8), randn(16, 8), constraint="geometric")


# --- matmul -------------------------------------------------------------------


@dataclass
class MatmulCase:
    left: tuple[int, ...]
    right: tuple[int, ...]
    scales: tuple[float, float, float]  # alpha, beta_left, beta_right
    path: str
    # rank-1 gradients (a 1-D operand) have too few independent samples to test
    unit: bool = True

    def __str__(self) -> str:
        return f"{self.left}@{self.right}:{self.path}"


MATMUL_CASES = [
    MatmulCase((256, 512), (512, 128), (512**-0.5, 128**-0.5, 256**-0.5), "linear"),
    # every row of the batched left contributes to right's gradient: m = 8·32
    MatmulCase((8, 32, 512), (512, 128), (512**-0.5, 128**-0.5, 256**-0.5), "linear"),
    MatmulCase((512,), (512, 4096), (512**-0.5, 4096**-0.5, 1.0), "linear", False),
    MatmulCase(
        (4, 8, 64, 256), (4, 8, 256, 64), (256**-0.5, 64**-0.5, 64**-0.5), "bmm"
    ),
    # left broadcast over 16 batches: its gradient sums n·16 = 2048 terms
    MatmulCase(
        (64, 256), (16, 256, 128), (256**-0.5, 2048**-0.5, 64**-0.5), "broadcast"
    ),
    # batch 16x8: left expanded 8x (32·8 terms), right 16x (64·16 terms)
    MatmulCase(
        (16, 1, 64, 256), (8, 256, 32), (256**-0.5, 256**-0.5, 1024**-0.5), "broadcast"
    ),
    MatmulCase((64, 256), (256,), (256**-0.5, 1.0, 64**-0.5), "broadcast", False),
    MatmulCase((256,), (256,), (256**-0.5, 1.0, 1.0), "broadcast", False),
]


def _check_product(
    op: Callable[..., Tensor],
    ref_op: Callable[..., Tensor],
    tensors: list[Tensor],
    scales: tuple[float, ...],
    constraint: str | None,
    check_unit: bool,
) -> None:
    """``op`` equals ``ref_op`` times ``scales[0]``; gradients times ``scales[1:]``."""
    out_scale, *grad_scales = _constrained(constraint, *scales)
    y = op(*tensors, constraint=constraint)
    grad = unit_backward(y)
    refs = _leaves(*tensors)
    y_ref = ref_op(*refs)
    y_ref.backward(grad)
    torch.testing.assert_close(y, out_scale * y_ref)
    for i, (got, ref, scale) in enumerate(
        zip(grads(*tensors), grads(*refs), grad_scales, strict=True)
    ):
        torch.testing.assert_close(got, scale * ref, msg=f"operand {i} gradient")
    if check_unit:
        _assert_unit(y, "output")
        for i, t in enumerate(grads(*tensors)):
            _assert_unit(t, f"operand {i} gradient")


@pytest.mark.parametrize("constraint", [None, "to_output_scale"])
@pytest.mark.parametrize("case", MATMUL_CASES, ids=str)
def test_matmul_matches_torch_times_scales(
    case: MatmulCase, constraint: str | None
) -> None:
    tensors = [randn(*case.left, seed=1), randn(*case.right, seed=2)]
    check_unit = constraint is None and case.unit
    _check_product(U.matmul, torch.matmul, tensors, case.scales, constraint, check_unit)


@pytest.mark.parametrize("constraint", THREE_SCALE_CONSTRAINTS)
@pytest.mark.parametrize("case", [MATMUL_CASES[0], MATMUL_CASES[3]], ids=str)
def test_matmul_every_constraint(case: MatmulCase, constraint: str | None) -> None:
    tensors = [randn(*case.left, seed=1), randn(*case.right, seed=2)]
    _check_product(U.matmul, torch.matmul, tensors, case.scales, constraint, False)


def test_matmul_paths_gradcheck() -> None:
    def f64(*shape: int) -> Tensor:
        return torch.randn(*shape, dtype=torch.float64, requires_grad=True)

    for left, right, scales in [
        ((3, 4), (4, 5), (4**-0.5, 5**-0.5, 3**-0.5)),  # linear path
        ((2, 3, 4), (2, 4, 5), (4**-0.5, 5**-0.5, 3**-0.5)),  # bmm path
        ((3, 4), (2, 4, 5), (4**-0.5, 10**-0.5, 3**-0.5)),  # broadcasting
        ((4,), (4, 5), (4**-0.5, 5**-0.5, 1.0)),  # 1-D left
    ]:
        assert gradcheck_scaled(
            lambda a, b: U.matmul(a, b, constraint=None),
            [f64(*left), f64(*right)],
            scales[0],
            scales[1:],
        )


@pytest.mark.parametrize(
    ("left", "right", "match"),
    [
        ((), (4,), "expected operands of shape"),
        ((4,), (), "expected operands of shape"),
        ((3, 4), (5, 6), "expected operands of shape"),
        ((2, 3, 4), (5, 4, 6), "batch dimensions .* do not broadcast"),
    ],
)
def test_matmul_rejects_bad_shapes(
    left: tuple[int, ...], right: tuple[int, ...], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        U.matmul(torch.randn(left), torch.randn(right))


# --- bmm ----------------------------------------------------------------------


@pytest.mark.parametrize("constraint", THREE_SCALE_CONSTRAINTS)
def test_bmm_matches_torch_times_scales(constraint: str | None) -> None:
    tensors = [randn(8, 64, 256, seed=1), randn(8, 256, 32, seed=2)]
    scales = (256**-0.5, 32**-0.5, 64**-0.5)
    _check_product(U.bmm, torch.bmm, tensors, scales, constraint, constraint is None)


def test_bmm_gradcheck() -> None:
    a = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, 4, 5, dtype=torch.float64, requires_grad=True)
    assert gradcheck_scaled(
        lambda a, b: U.bmm(a, b, constraint=None), [a, b], 0.5, [5**-0.5, 3**-0.5]
    )


@pytest.mark.parametrize(
    ("input", "mat2"),
    [((3, 4), (4, 5)), ((2, 3, 4), (3, 4, 5)), ((2, 3, 4), (2, 5, 6))],
)
def test_bmm_rejects_bad_shapes(input: tuple[int, ...], mat2: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match=r"input of shape \(b, m, k\) and mat2"):
        U.bmm(randn(*input), randn(*mat2))


# --- einsum -------------------------------------------------------------------


@dataclass
class EinsumCase:
    equation: str
    shapes: tuple[tuple[int, ...], ...]
    scales: tuple[float, ...]  # alpha, beta_1, ..., beta_n

    def __str__(self) -> str:
        return self.equation


EINSUM_CASES = [
    EinsumCase(
        "bij,bjk->bik", ((8, 64, 256), (8, 256, 32)), (256**-0.5, 32**-0.5, 64**-0.5)
    ),
    EinsumCase("ij,jk", ((256, 512), (512, 128)), (512**-0.5, 128**-0.5, 256**-0.5)),
    # right's gradient sums over the 8 ellipsis batches and 32 rows
    EinsumCase(
        "...ij,jk->...ik", ((8, 32, 512), (512, 128)), (512**-0.5, 128**-0.5, 256**-0.5)
    ),
    EinsumCase(
        "bhqd,bhkd->bhqk",
        ((2, 4, 64, 32), (2, 4, 64, 32)),
        (32**-0.5, 64**-0.5, 64**-0.5),
    ),
    # no contraction; the size-1 operand is broadcast 16x, so its gradient sums 16
    EinsumCase("ij,ij->ij", ((1, 4096), (16, 4096)), (1.0, 16**-0.5, 1.0)),
    # out sums j,k (128·32); grads sum k,l (32·256), i,l (64·256), i,j (64·128)
    EinsumCase(
        "ij,jk,kl->il",
        ((64, 128), (128, 32), (32, 256)),
        (4096**-0.5, 8192**-0.5, 16384**-0.5, 8192**-0.5),
    ),
    EinsumCase("ij->j", ((4096, 64),), (4096**-0.5, 1.0)),
]


@pytest.mark.parametrize("constraint", [None, "to_output_scale", "gmean"])
@pytest.mark.parametrize("case", EINSUM_CASES, ids=str)
def test_einsum_matches_torch_times_scales(
    case: EinsumCase, constraint: str | None
) -> None:
    tensors = [randn(*shape, seed=i) for i, shape in enumerate(case.shapes)]
    _check_product(
        lambda *ts, constraint: U.einsum(case.equation, *ts, constraint=constraint),
        lambda *ts: torch.einsum(case.equation, *ts),
        tensors,
        case.scales,
        constraint,
        constraint is None,
    )


def test_einsum_accepts_a_list_of_operands_and_spaces() -> None:
    a, b = randn(4, 8, seed=1), randn(8, 3, seed=2)
    torch.testing.assert_close(U.einsum("ij, jk -> ik", [a, b]), U.matmul(a, b))


def test_einsum_gradcheck() -> None:
    ts = [
        torch.randn(*s, dtype=torch.float64, requires_grad=True)
        for s in [(2, 3), (3, 4), (4, 5)]
    ]
    assert gradcheck_scaled(
        lambda *xs: U.einsum("ij,jk,kl->il", *xs, constraint=None),
        ts,
        12**-0.5,
        [20**-0.5, 10**-0.5, 6**-0.5],
    )


@pytest.mark.parametrize(
    ("equation", "shapes", "match"),
    [
        ("ij,jk->ik", [(3, 4)], r"2 operand term\(s\) but 1 operand"),
        ("i1,jk", [(3, 4), (4, 5)], "may contain only letters and one '...'"),
        ("i....j", [(3, 4)], "may contain only letters and one '...'"),
        ("ij,jk->il", [(3, 4), (4, 5)], "output labels must be distinct and appear"),
        ("ij,jk->ii", [(3, 4), (4, 5)], "output labels must be distinct and appear"),
        ("ij,jk", [(3, 4), (5, 6)], "label 'j' has sizes 4 and 5"),
        ("ijk,jk", [(3, 4), (4, 5)], "does not match an operand of shape"),
        ("ij->j->i", [(3, 4)], "more than one '->'"),
    ],
)
def test_einsum_rejects_bad_equations(
    equation: str, shapes: list[tuple[int, ...]], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        U.einsum(equation, *(randn(*s) for s in shapes))


def test_einsum_rejects_sublist_format_and_bad_constraint() -> None:
    a = randn(3, 4)
    with pytest.raises(TypeError, match="equation must be a string"):
        U.einsum(a, [0, 1], [1])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exactly 3 scales"):
        U.einsum(
            "ij,jk,kl", a, randn(4, 5), randn(5, 6), constraint="to_left_grad_scale"
        )


# --- autocast and compile -----------------------------------------------------


AUTOCAST_CASES = {
    # name: (shapes, op, reference, output scale, gradient scales)
    "linear": (
        ((16, 64), (32, 64)),
        U.linear,
        F.linear,
        64**-0.5,
        (64**-0.5, 16**-0.5),  # the weight gradient is never constrained
    ),
    "matmul_linear": (((16, 64), (64, 32)), U.matmul, torch.matmul, 64**-0.5, None),
    "matmul_bmm": (((2, 16, 64), (2, 64, 32)), U.matmul, torch.matmul, 64**-0.5, None),
    "matmul_broadcast": (
        ((16, 64), (2, 64, 32)),
        U.matmul,
        torch.matmul,
        64**-0.5,
        None,
    ),
    "bmm": (((2, 16, 64), (2, 64, 32)), U.bmm, torch.bmm, 64**-0.5, None),
    "einsum": (
        ((2, 16, 64), (2, 64, 32)),
        lambda a, b: U.einsum("bij,bjk->bik", a, b),
        lambda a, b: torch.einsum("bij,bjk->bik", a, b),
        64**-0.5,
        None,
    ),
}


@pytest.mark.parametrize("name", list(AUTOCAST_CASES))
def test_autocast_bf16(name: str) -> None:
    shapes, op, ref, scale, grad_scales = AUTOCAST_CASES[name]
    tensors = [randn(*s, seed=i) for i, s in enumerate(shapes)]
    refs = _leaves(*tensors)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = op(*tensors)
        y_ref = ref(*refs)
    assert y.dtype == torch.bfloat16
    grad = unit_backward(y)
    y_ref.backward(grad)
    torch.testing.assert_close(
        y, (scale * y_ref.float()).bfloat16(), rtol=2e-2, atol=2e-2
    )
    for got, expected, grad_scale in zip(
        grads(*tensors), grads(*refs), grad_scales or (scale, scale), strict=True
    ):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, grad_scale * expected, rtol=2e-2, atol=2e-2)


def test_products_compile_fullgraph_and_match_eager() -> None:
    """One compile covering linear, matmul's fused paths, bmm and einsum."""

    def products(x: Tensor, w: Tensor, b: Tensor, q: Tensor, k: Tensor) -> Tensor:
        h = U.linear(x, w, b)
        scores = U.matmul(q, k.transpose(-2, -1))
        mixed = U.bmm(scores, q)
        h = h + U.einsum("bij,jk->bik", mixed, w.t())
        return U.matmul(h, w.t(), constraint=None)

    inputs = [randn(2, 8, 16, seed=1), randn(16, 16, seed=2), randn(16, seed=3)]
    inputs += [randn(2, 8, 16, seed=4), randn(2, 8, 16, seed=5)]
    compiled = torch.compile(products, fullgraph=True)
    results = []
    for fn in (products, compiled):
        xs = _leaves(*inputs)
        y = fn(*xs)
        unit_backward(y)
        results.append([y.detach(), *grads(*xs)])
    for eager, comp in zip(*results, strict=True):
        torch.testing.assert_close(comp, eager)
