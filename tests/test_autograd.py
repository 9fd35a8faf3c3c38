"""The package's autograd functions: no per-call signature binding, and
``torch.func`` transforms (vmap, grad) still work through them."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch.fx import GraphModule

import unit_scaling.functional as U
from tests.helpers import compiled_grad, in_place_function
from unit_scaling import _autograd
from unit_scaling._autograd import Function
from unit_scaling.scale import scale_bwd, scale_fwd


def test_apply_skips_signature_binding(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(3, 8, requires_grad=True)

    def no_binding(*args: object, **kwargs: object) -> None:
        raise AssertionError("inspect.signature called on the eager path")

    monkeypatch.setattr(inspect, "signature", no_binding)
    y = U.linear(x, w)
    residual, skip = U.residual_split(y, 0.5)
    out = U.residual_add(residual, skip, 0.5)
    scale_bwd(scale_fwd(out, 2.0), 3.0).sum().backward()
    assert x.grad is not None and w.grad is not None


def test_vmap_matches_batched_call() -> None:
    x, w = torch.randn(5, 3, 8), torch.randn(4, 8)
    batched = torch.func.vmap(lambda a: U.linear(a, w))(x)
    torch.testing.assert_close(batched, U.linear(x, w))
    left, right = torch.randn(5, 2, 3, 4), torch.randn(5, 2, 4, 6)
    per_sample = torch.func.vmap(U.bmm)(left, right)
    torch.testing.assert_close(per_sample, U.matmul(left, right))
    res, skip = torch.func.vmap(lambda a: U.residual_split(a, 0.5))(x)
    torch.testing.assert_close(res, x)
    torch.testing.assert_close(skip, x)


def test_func_grad_matches_backward() -> None:
    x, w = torch.randn(6, 8), torch.randn(4, 8)
    grad = torch.func.grad(lambda weight: U.linear(x, weight).square().sum())(w)
    w_eager = w.clone().requires_grad_()
    U.linear(x, w_eager).square().sum().backward()
    assert w_eager.grad is not None
    torch.testing.assert_close(grad, w_eager.grad)
    grad_x = torch.func.grad(lambda t: scale_bwd(t, 3.0).sum())(x)
    torch.testing.assert_close(grad_x, torch.full_like(x, 3.0))


def test_compiled_gradient_of_an_output_made_in_place() -> None:
    # torch 2.11's Dynamo drops it (all zeros) unless the forward returns a
    # fresh tensor; every version must give the true gradient.
    graphs: list[GraphModule] = []
    torch.testing.assert_close(
        compiled_grad(in_place_function(Function), graphs), torch.full((3,), 2.0)
    )
    assert graphs, "torch.compile ran eagerly"


def test_fresh_outputs_under_compile_only(monkeypatch: pytest.MonkeyPatch) -> None:
    # The 2.11 workaround, forced on any torch: the compiled forward returns a
    # new tensor on the output's memory; the eager path does not run it.
    monkeypatch.setattr(_autograd, "COMPILED_FUNCTION_OUTPUTS_NEED_FRESH_TENSORS", True)
    function = in_place_function(Function)
    graphs: list[GraphModule] = []
    torch.testing.assert_close(compiled_grad(function, graphs), torch.full((3,), 2.0))
    forward_graphs = [
        sub
        for gm in graphs
        for name, sub in gm.named_children()
        if name.startswith("fwd_body")
    ]
    targets = [node.target for gm in forward_graphs for node in gm.graph.nodes]
    assert torch.ops.aten._unsafe_view.default in targets
    x = torch.ones(3, requires_grad=True)
    with torch.profiler.profile() as prof:
        function.apply(x, 2.0)
    assert "aten::_unsafe_view" not in {event.name for event in prof.events()}
    # Without gradients Dynamo inlines the forward itself, passing a ctx unless
    # the signature shows none is taken: the wrapper must show forward's.
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: function.apply(t, 2.0), fullgraph=True)
    torch.testing.assert_close(compiled(torch.ones(3)), torch.full((3,), 4.0))
    torch._dynamo.reset()
