"""Tests for the scale primitives ``scale_fwd`` and ``scale_bwd``."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from tests.helpers import gradcheck_scaled, randn, unit_backward
from unit_scaling.scale import scale_bwd, scale_fwd


@pytest.mark.parametrize("scale", [0.25, 3.0, -2.0])
def test_scale_fwd_scales_output_only(scale: float) -> None:
    x = randn(4, 8)
    y = scale_fwd(x, scale)
    grad = unit_backward(y)
    torch.testing.assert_close(y, scale * x.detach())
    torch.testing.assert_close(x.grad, grad)


@pytest.mark.parametrize("scale", [0.25, 3.0, -2.0])
def test_scale_bwd_scales_gradient_only(scale: float) -> None:
    x = randn(4, 8)
    y = scale_bwd(x, scale)
    grad = unit_backward(y)
    assert torch.equal(y, x)
    assert y.data_ptr() == x.data_ptr()  # a view: nothing allocated forwards
    torch.testing.assert_close(x.grad, scale * grad)


def test_tensor_scales_broadcast() -> None:
    x = randn(4, 8)
    s = torch.linspace(0.5, 2.0, 8)
    y = scale_fwd(x, s)
    torch.testing.assert_close(y, x.detach() * s)
    grad = unit_backward(scale_bwd(x, s), seed=1)
    torch.testing.assert_close(x.grad, grad * s)


@pytest.mark.parametrize("fn", [scale_fwd, scale_bwd])
@pytest.mark.parametrize("one", [1, 1.0])
def test_python_one_is_a_no_op(fn: object, one: float) -> None:
    x = randn(3)
    assert fn(x, one) is x  # type: ignore[operator]


def test_tensor_one_is_not_inspected() -> None:
    # Looking inside a tensor scale would sync with the device; it is applied.
    x = randn(3)
    y = scale_fwd(x, torch.tensor(1.0))
    assert y is not x
    torch.testing.assert_close(y, x.detach())


def test_gradients_compose() -> None:
    x = randn(5)
    y = scale_bwd(scale_fwd(scale_bwd(x, 2.0), 3.0), 0.5)
    grad = unit_backward(y)
    torch.testing.assert_close(y, 3 * x.detach())
    torch.testing.assert_close(x.grad, grad)  # 0.5 · 2 = 1


def test_gradcheck() -> None:
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    assert gradcheck_scaled(lambda t: scale_fwd(t, 0.25), [x], 0.25, [1.0])
    assert gradcheck_scaled(lambda t: scale_bwd(t, 4.0), [x], 1.0, [4.0])
    # The same factor both ways is a true multiply.
    assert torch.autograd.gradcheck(lambda t: scale_fwd(scale_bwd(t, 4.0), 4.0), (x,))


def test_compile_fullgraph_matches_eager() -> None:
    def f(x: Tensor, s: Tensor) -> Tensor:
        return scale_bwd(scale_fwd(x, 0.5), 3.0) * scale_fwd(x, s)

    x, s = randn(4, 8), torch.full((8,), 2.0)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    grads = []
    for fn in (f, compiled):
        x.grad = None
        y = fn(x, s)
        unit_backward(y)
        grads.append((y.detach(), x.grad))
    torch.testing.assert_close(grads[1], grads[0])
