"""The ops whose scales are computed by loops (pooling, interpolation, softcap)
compile without graph breaks, under static and dynamic shapes, to graphs in
which each scale is a constant.

``functional._scaling.memoise`` relies on Dynamo specialising ``range`` bounds and
``math.fsum`` items, and on ``torch.compiler.assume_constant_result``; with
dynamic shapes, tracing the loops symbolically instead would put hundreds of
symbolic operations in the graph (and take minutes), so this fails loudly if a
torch upgrade changes that behaviour.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor

import unit_scaling.functional as U
from tests.helpers import randn

OPS: dict[str, Callable[[Tensor], Any]] = {
    "max_pool2d": lambda x: U.max_pool2d(x, 3, 2, 1),
    "avg_pool2d": lambda x: U.avg_pool2d(x, 3, 2, 1, ceil_mode=True),
    "adaptive_max_pool2d": lambda x: U.adaptive_max_pool2d(x, 3),
    "adaptive_avg_pool2d": lambda x: U.adaptive_avg_pool2d(x, (2, None)),
    "interpolate-scale": lambda x: U.interpolate(x, scale_factor=1.5, mode="bilinear"),
    "interpolate-size": lambda x: U.interpolate(
        x, size=7, mode="bicubic", antialias=True
    ),
    "interpolate-area": lambda x: U.interpolate(x, size=(3, 5), mode="area"),
    "softcap": lambda x: U.softcap(x, 5.0, constraint=None),
}


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("name", sorted(OPS))
def test_loop_scaled_ops_compile_to_constant_scales(name: str, dynamic: bool) -> None:
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Tensor]) -> Any:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    op = OPS[name]
    compiled = torch.compile(op, backend=backend, fullgraph=True, dynamic=dynamic)
    for size in (8, 12):
        x = randn(2, 3, size, size, seed=size)
        torch.testing.assert_close(compiled(x), op(x))
    for gm in graphs:
        calls = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
        assert len(calls) < 25, f"{len(calls)} ops: the scale was traced, not folded"
