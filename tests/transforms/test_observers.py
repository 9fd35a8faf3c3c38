"""Observers (``transforms._capture.observers``): out of every pass's sight, and
back after the node that holds the value they observe."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn
from torch.fx import GraphModule, Node

from unit_scaling._torch_internals import is_fake_tensor
from unit_scaling.transforms._capture.engine import Transform, apply_transform
from unit_scaling.transforms._capture.observers import register_observer
from unit_scaling.transforms._capture.targets import calibrated_scale

_SEEN: list[Tensor] = []


@register_observer
def _observe(tensor: Tensor, label: str) -> None:
    if not is_fake_tensor(tensor):
        _SEEN.append(tensor.detach().clone())


class _Net(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        y = torch.relu(x)
        _observe(y, "relu")
        return y * 2


def _relu(gm: GraphModule) -> Node:
    assert not [n for n in gm.graph.nodes if n.target is _observe]  # unseen
    return next(n for n in gm.graph.nodes if n.target is torch.relu)


def _replace(gm: GraphModule) -> GraphModule:
    relu = _relu(gm)
    with gm.graph.inserting_after(relu):
        new = gm.graph.call_function(torch.clamp, (relu.args[0],), {"min": 0})
    relu.replace_all_uses_with(new)
    gm.graph.erase_node(relu)
    return gm


def _scale(gm: GraphModule) -> GraphModule:
    relu = _relu(gm)
    with gm.graph.inserting_after(relu):
        scaled = gm.graph.call_function(calibrated_scale, (relu, 3.0))
    relu.replace_all_uses_with(scaled, delete_user_cb=lambda user: user is not scaled)
    return gm


def _remove(gm: GraphModule) -> GraphModule:
    relu = _relu(gm)
    (user,) = relu.users
    user.args = (relu.args[0], *user.args[1:])  # (the value is gone)
    gm.graph.erase_node(relu)
    return gm


@pytest.mark.parametrize(
    ("graph_pass", "expected"),
    [
        (_replace, lambda x: x.clamp(min=0)),
        (_scale, lambda x: 3 * x.relu()),
        (_remove, None),
    ],
)
def test_an_observer_follows_its_value_through_a_pass(
    graph_pass: Callable[[GraphModule], GraphModule],
    expected: Callable[[Tensor], Tensor] | None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = apply_transform(_Net(), Transform(name="test", graph_pass=graph_pass))
    x = torch.randn(8)
    _SEEN.clear()
    with caplog.at_level(logging.WARNING, logger="unit_scaling.transforms"):
        model(x)
    if expected is None:
        assert not _SEEN
        assert "monitor observer fell back at" in caplog.text
    else:
        assert len(_SEEN) == 1 and torch.equal(_SEEN[0], expected(x))
        assert not caplog.text
