"""In-place ops keep torch's semantics and gradients under ``unit_scale``.

Models write ``h += f(x)``, ``x.mul_(c)``, ``nn.ReLU(inplace=True)`` and
``input += skip``; the transform makes them out of place (``_unit.inplace``) and, where
something else may hold the mutated tensor, writes the result back.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import unit_scaling.functional as U
from tests.helpers import unit_backward
from unit_scaling.transforms import unit_scale
from unit_scaling.transforms._unit.inplace import functionalize_inplace


class InPlace(nn.Module):
    """Every kind of in-place op, on outputs of ops unit scaling replaces."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.a = nn.Linear(width, width)
        self.b = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        h = self.a(x)
        h += x  # a residual add written in place
        h.mul_(0.5)
        g = F.silu(h, inplace=False)
        y = self.b(g)
        y.add_(1.0)
        z = F.relu(y, inplace=True)
        z = torch.relu_(z)
        return z + y  # y was changed in place by relu: torch's semantics


def _plain_reference(model: InPlace, x: Tensor) -> Tensor:
    """What the forward computes, written out of place."""
    h = (model.a(x) + x) * 0.5
    y = F.relu(model.b(F.silu(h)) + 1.0)
    return y + y


def test_inplace_ops_compute_what_torch_computes() -> None:
    """With the transform's rescaling undone (a plain copy of its weights), the
    graph after functionalisation computes the same as the eager module."""

    def backend(gm: torch.fx.GraphModule, example_inputs: object) -> object:
        assert functionalize_inplace(gm.graph) >= 5
        gm.recompile()
        targets = {str(n.target) for n in gm.graph.nodes}
        assert not {"add_", "mul_", "relu_"} & targets
        return gm.forward

    model = InPlace()
    x = torch.randn(4, 16)
    expected = _plain_reference(model, x)
    out = torch.compile(model, backend=backend)(x)
    torch.testing.assert_close(out, expected)


def test_unit_scaled_inplace_model_runs_and_has_gradients() -> None:
    model = unit_scale(InPlace())
    x = torch.randn(8, 16, requires_grad=True)
    out = model(x)
    unit_backward(out)
    assert x.grad is not None and torch.isfinite(x.grad).all()
    for name, param in model.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name


def test_inplace_add_on_a_unit_scaled_linear_output() -> None:
    """``U.linear``'s output is no view: ``y += 1`` works and has torch's grad."""
    x = torch.randn(4, 3, 8, requires_grad=True)
    w = torch.randn(6, 8, requires_grad=True)
    y = U.linear(x, w, constraint=None)
    y += 1
    y.sum().backward()
    grads = x.grad, w.grad
    x2, w2 = x.detach().requires_grad_(), w.detach().requires_grad_()
    (U.linear(x2, w2, constraint=None) + 1).sum().backward()
    torch.testing.assert_close(grads[0], x2.grad)
    torch.testing.assert_close(grads[1], w2.grad)


def test_input_mutated_in_place_is_seen_by_the_caller() -> None:
    """``input += skip`` on the forward's argument: the caller's tensor holds
    the result afterwards, as in eager PyTorch."""

    class AddToInput(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, input: Tensor) -> Tensor:
            input += self.fc(input)
            return input * 2

    model = unit_scale(AddToInput())
    x = torch.randn(4, 16)
    before = x.clone()
    model(x)
    residual, skip = U.residual_split(before, 0.5)
    branch = U.linear(residual, model.fc.weight, model.fc.bias, constraint=None)
    torch.testing.assert_close(x, U.residual_add(branch, skip, 0.5))


def test_view_mutated_in_place_updates_its_base() -> None:
    class SliceUpdate(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x: Tensor) -> Tensor:
            h = self.fc(x) * 1.0
            h[:, :4].mul_(0)  # through a view: h itself must change
            return h

    model = unit_scale(SliceUpdate())
    out = model(torch.randn(4, 16))
    assert torch.all(out[:, :4] == 0) and torch.any(out[:, 4:] != 0)


@pytest.mark.parametrize("inplace", [True, False])
def test_activation_inplace_keyword(inplace: bool) -> None:
    model = unit_scale(nn.Sequential(nn.Linear(8, 16), nn.ReLU(inplace=inplace)))
    x = torch.randn(4, 8)
    expected = U.relu(U.linear(x, model[0].weight, model[0].bias, constraint=None))
    torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-6)
