"""Reading the tracked tensors out of a ``scales_graph()``."""

from __future__ import annotations

from torch.fx import Graph, Node

from ..transforms import Metrics


def check_metric(metric: str) -> None:
    """Raise a :class:`ValueError` naming the valid metrics if ``metric`` is not one."""
    if metric not in Metrics.names():
        raise ValueError(
            f"unknown metric {metric!r}; expected one of {Metrics.names()}"
        )


def tracked_nodes(graph: Graph) -> list[Node]:
    """The nodes of ``graph`` that carry ``meta["metrics"]``, in graph order.

    Raises a :class:`ValueError` with advice when ``graph`` is not a scales graph or
    holds no statistics.
    """
    if not isinstance(graph, Graph):
        raise TypeError(
            "expected the torch.fx.Graph returned by `model.scales_graph()`, got "
            f"{type(graph).__name__}"
        )
    nodes = [n for n in graph.nodes if isinstance(n.meta.get("metrics"), Metrics)]
    if not nodes:
        raise ValueError(
            "the graph holds no tensor metrics: wrap the model with "
            "unit_scaling.transforms.track_scales, run a forward (and backward) "
            "pass, then pass `model.scales_graph()`"
        )
    return nodes
