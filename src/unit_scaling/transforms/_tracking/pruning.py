"""Pruning a scales graph (from ``track_scales``) down to its informative nodes."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Any

from torch.fx import Graph, Node
from torch.fx.node import Target, map_arg

from .metrics import Metrics

__all__ = [
    "prune_non_float_tensors",
    "prune_same_scale_tensors",
    "prune_selected_nodes",
]

logger = logging.getLogger("unit_scaling.transforms.track_scales")


def _float_args(args: Iterable[Any]) -> list[Node]:
    return [
        a
        for a in args
        if isinstance(a, Node) and a.meta.get("outputs_float_tensor", False)
    ]


def _require_tracked(graph: Graph) -> None:
    # An empty graph is what scales_graph() returns before a forward pass.
    if graph.nodes and not any("clean_name" in n.meta for n in graph.nodes):
        raise ValueError(
            "the graph must come from `model.scales_graph()` of a module wrapped "
            "with unit_scaling.transforms.track_scales; other FX graphs lack the "
            "metadata that pruning relies on"
        )


def _remove(graph: Graph, node: Node, replacement: Node | None) -> None:
    """Erase ``node``, pointing its users at ``replacement`` (possibly ``None``)."""
    for user in list(node.users):
        user.args = map_arg(user.args, lambda n: replacement if n is node else n)
        user.kwargs = map_arg(user.kwargs, lambda n: replacement if n is node else n)
    graph.erase_node(node)


def prune_non_float_tensors(graph: Graph) -> Graph:
    """A copy of ``graph`` without the nodes that don't output floating-point tensors.

    Users of a removed node are rewired to its only floating-point input, if it
    has exactly one (else to ``None``).
    """
    _require_tracked(graph)
    graph = _copy(graph)
    for node in list(graph.nodes):
        if node.op == "output" or node.meta.get("outputs_float_tensor", False):
            continue
        inputs = _float_args(node.all_input_nodes)
        logger.info("pruning non-float node: %s", node)
        _remove(graph, node, inputs[0] if len(inputs) == 1 else None)
    return graph


def _same_scale(a: Metrics, b: Metrics, rtol: float) -> bool:
    def close(x: Metrics.Data | None, y: Metrics.Data | None) -> bool:
        if x is None or y is None:
            return x is None and y is None
        return math.isclose(x.mean_abs, y.mean_abs, rel_tol=rtol)

    return close(a.fwd, b.fwd) and close(a.bwd, b.bwd)


def prune_same_scale_tensors(graph: Graph, rtol: float = 2**-16) -> Graph:
    """A copy of ``graph`` without nodes that keep the scale of their only float input.

    Removes uninformative nodes such as reshapes. A node with several
    floating-point inputs is never removed. ``rtol`` is the relative change of
    ``mean_abs`` (forward and backward) below which the scale counts as the same.
    """
    _require_tracked(graph)
    graph = _copy(graph)
    for node in list(graph.nodes):
        metrics = node.meta.get("metrics")
        inputs = _float_args(node.all_input_nodes)
        if metrics is None or len(inputs) != 1:
            continue
        source = inputs[0].meta.get("metrics")
        if source is not None and _same_scale(metrics, source, rtol):
            logger.info("pruning same-scale node: %s", node)
            _remove(graph, node, inputs[0])
    return graph


def prune_selected_nodes(graph: Graph, targets: Iterable[Target]) -> Graph:
    """A copy of ``graph`` without the nodes calling any of ``targets``."""
    targets = set(targets)
    graph = _copy(graph)
    for node in list(graph.nodes):
        if node.op != "output" and node.target in targets:
            logger.info("pruning node: %s", node)
            inputs = _float_args(node.all_input_nodes)
            _remove(graph, node, inputs[0] if len(inputs) == 1 else None)
    return graph


def _copy(graph: Graph) -> Graph:
    new = Graph()
    value_map: dict[Node, Node] = {}
    out = new.graph_copy(graph, value_map)
    for output in graph.find_nodes(op="output"):
        new.output(out).meta.update(output.meta)
    return new
