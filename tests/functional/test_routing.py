"""Tests for the unit-scaled ``index_add``, ``scatter_add``, ``gather`` and
``index_select``.

Scales are restated by hand from the rules: a combination's output is scaled
``(1 + r)^-½`` (``r^-½`` when ``input_is_zero``) with ``r`` the number of source
elements per output element; a selection's input gradient is scaled
``picks^-½``. Unit scale is measured under uniformly random indices with
``>= 2^15`` elements (``rtol=0.1``; the routing counts are Poisson, so the
estimates are noisier than for independent elements, and the margin covers it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor

import unit_scaling.functional as U
from tests.helpers import assert_unit_scale, gradcheck_scaled, randn, unit_backward
from unit_scaling.constraints import apply_constraint


def _index(high: int, *shape: int, seed: int = 0) -> Tensor:
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("constraint", [None, "to_output_scale", "gmean"])
@pytest.mark.parametrize(
    ("input_is_zero", "alpha"), [(False, 1.0), (True, 1.0), (True, 0.5)]
)
def test_index_add_matches_torch_times_scales(
    input_is_zero: bool, alpha: float, constraint: str | None
) -> None:
    # 96 source rows into 32 rows: r = 3
    sigma = 3**-0.5 if input_is_zero else 4**-0.5
    sigma, beta_x, beta_s = apply_constraint(constraint, sigma, 1.0, 1.0)
    x = (torch.zeros(32, 16) if input_is_zero else torch.randn(32, 16)).requires_grad_()
    source, index = randn(96, 16, seed=1), _index(32, 96)
    y = U.index_add(
        x,
        0,
        index,
        source,
        alpha=alpha,
        constraint=constraint,
        input_is_zero=input_is_zero,
    )
    grad = unit_backward(y, seed=2)
    refs = [t.detach().requires_grad_() for t in (x, source)]
    y_ref = torch.index_add(refs[0], 0, index, refs[1], alpha=alpha)
    y_ref.backward(grad)
    torch.testing.assert_close(y, sigma * y_ref)
    torch.testing.assert_close(x.grad, beta_x * refs[0].grad)
    torch.testing.assert_close(source.grad, beta_s * refs[1].grad)


@pytest.mark.parametrize("constraint", [None, "to_output_scale"])
@pytest.mark.parametrize("input_is_zero", [False, True])
def test_scatter_add_matches_torch_times_scales(
    input_is_zero: bool, constraint: str | None
) -> None:
    # index and src (64, 8) into (32, 8): r = 512 / 256 = 2
    sigma = 2**-0.5 if input_is_zero else 3**-0.5
    sigma, beta_x, beta_s = apply_constraint(constraint, sigma, 1.0, 1.0)
    x = (torch.zeros(32, 8) if input_is_zero else torch.randn(32, 8)).requires_grad_()
    src, index = randn(64, 8, seed=1), _index(32, 64, 8)
    y = U.scatter_add(x, 0, index, src, constraint, input_is_zero)
    grad = unit_backward(y, seed=2)
    refs = [t.detach().requires_grad_() for t in (x, src)]
    y_ref = torch.scatter_add(refs[0], 0, index, refs[1])
    y_ref.backward(grad)
    torch.testing.assert_close(y, sigma * y_ref)
    torch.testing.assert_close(x.grad, beta_x * refs[0].grad)
    torch.testing.assert_close(src.grad, beta_s * refs[1].grad)


@pytest.mark.parametrize("sparse_grad", [False, True])
def test_gather_and_index_select_scale_only_the_input_gradient(
    sparse_grad: bool,
) -> None:
    x, index = randn(64, 16, seed=0), _index(64, 256, 16)
    y = U.gather(x, 0, index, sparse_grad=sparse_grad)
    torch.testing.assert_close(y, torch.gather(x, 0, index), rtol=0, atol=0)
    grad = unit_backward(y, seed=1)
    x_ref = x.detach().requires_grad_()
    torch.gather(x_ref, 0, index, sparse_grad=sparse_grad).backward(grad)
    # picks = 4096 / 1024 = 4
    torch.testing.assert_close(x.grad.to_dense(), 0.5 * x_ref.grad.to_dense())

    x, index = randn(16, 64, seed=2), _index(64, 16)
    y = U.index_select(x, 1, index)
    torch.testing.assert_close(y, torch.index_select(x, 1, index), rtol=0, atol=0)
    grad = unit_backward(y, seed=3)
    x_ref = x.detach().requires_grad_()
    torch.index_select(x_ref, 1, index).backward(grad)
    torch.testing.assert_close(x.grad, 2 * x_ref.grad)  # picks = 16 / 64


def test_mixture_of_experts_routing_is_unit_scaled() -> None:
    """Top-2 routing of 4096 tokens: dispatch, then combine into zeros."""
    tokens, experts = randn(4096, 64, seed=0), randn(8192, 64, seed=1)
    slots = _index(4096, 8192, seed=2)
    dispatched = U.index_select(tokens, 0, slots)  # (8192, 64)
    combined = U.index_add(
        torch.zeros(4096, 64), 0, slots, experts, constraint=None, input_is_zero=True
    )
    assert_unit_scale(dispatched, name="dispatched")
    assert_unit_scale(combined, name="combined")
    unit_backward(dispatched, seed=3)
    unit_backward(combined, seed=4)
    assert_unit_scale(tokens.grad, name="tokens grad")
    assert_unit_scale(experts.grad, name="experts grad")

    src, index = randn(4096, 32, seed=5), _index(512, 4096, 32, seed=6)
    base = randn(512, 32, seed=7)
    y = U.scatter_add(base, 0, index, src, constraint=None)
    assert_unit_scale(y, name="scatter_add output")
    gathered = U.gather(base, 0, index)
    unit_backward(gathered, seed=8)
    assert_unit_scale(base.grad, name="gather input grad")


def test_integer_tensors_are_routed_plainly() -> None:
    counts, index = torch.zeros(8, dtype=torch.long), _index(8, 32)
    ones = torch.ones(32, dtype=torch.long)
    assert torch.equal(
        U.index_add(counts, 0, index, ones), counts.index_add(0, index, ones)
    )
    assert torch.equal(
        U.scatter_add(counts, 0, index, ones), counts.scatter_add(0, index, ones)
    )
    assert torch.equal(U.gather(index, 0, index % 4), index.gather(0, index % 4))
    assert torch.equal(U.index_select(index, 0, index % 4), index[index % 4])


def test_routing_gradcheck() -> None:
    def f64(*shape: int) -> Tensor:
        return randn(*shape, dtype=torch.float64)

    x, source, index = f64(4, 3), f64(6, 3), _index(4, 6)
    sigma = (1 + 6 / 4) ** -0.5
    assert gradcheck_scaled(
        lambda x, s: U.index_add(x, 0, index, s, alpha=2.0, constraint=None),
        [x, source],
        sigma,
        [1.0, 1.0],
    )
    index2 = _index(4, 5, 2)
    sigma = (1 + 10 / 12) ** -0.5  # every scale is sigma under the default
    assert gradcheck_scaled(
        lambda x, s: U.scatter_add(x, 0, index2, s),
        [x, f64(5, 2)],
        sigma,
        [sigma, sigma],
    )
    assert gradcheck_scaled(
        lambda x: U.gather(x, 0, index2), [f64(4, 2)], 1.0, [(8 / 10) ** 0.5]
    )
    assert gradcheck_scaled(
        lambda x: U.index_select(x, 0, index), [f64(4, 2)], 1.0, [(4 / 6) ** 0.5]
    )


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda: U.index_add(randn(4, 3), 0, _index(4, 2, 2), randn(2, 3)),
            r"1-D index.*index \(2, 2\)",
        ),
        (
            lambda: U.index_add(randn(4, 3), 0, _index(4, 2), randn(2, 3, 1)),
            r"source \(2, 3, 1\)",
        ),
        (
            lambda: U.scatter_add(randn(4, 3), 0, _index(4, 2), randn(2, 3)),
            "same number of dims",
        ),
        (lambda: U.gather(randn(4, 3), 0, _index(4, 2)), "same number of dims"),
        (lambda: U.index_select(randn(4, 3), 0, _index(4, 2, 2)), "1-D index"),
        (
            lambda: U.index_add(
                randn(4, 3), 0, _index(4, 2), randn(2, 3), constraint="x"
            ),
            "constraint",
        ),
    ],
)
def test_routing_rejects_bad_shapes(call: Callable[[], Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def test_routing_compiles_without_graph_breaks() -> None:
    def f(x: Tensor, s: Tensor, index: Tensor) -> tuple[Tensor, ...]:
        return (
            U.index_add(torch.zeros_like(x), 0, index, s, input_is_zero=True),
            U.scatter_add(x, 0, index[:, None].expand(-1, 4), s),
            U.gather(x, 0, index[:, None].expand(-1, 4)),
            U.index_select(x, 0, index),
        )

    x, s, index = randn(8, 4, seed=0), randn(16, 4, seed=1), _index(8, 16)
    compiled = torch.compile(f, fullgraph=True)
    for ours, expected in zip(compiled(x, s, index), f(x, s, index), strict=True):
        torch.testing.assert_close(ours, expected)
