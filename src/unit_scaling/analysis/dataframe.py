"""``graph_to_dataframe``: every tracked tensor's statistics as a table."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from torch.fx import Graph

from .._fx_names import target_name
from ..transforms import Metrics
from ._graph import tracked_nodes
from ._optional import require_plot_extra

if TYPE_CHECKING:  # pandas is imported when a table is made
    import pandas as pd  # type: ignore[import-untyped,unused-ignore]

__all__ = ["graph_to_dataframe"]

_ID_COLUMNS = ["name", "node", "op", "target", "requires_grad", "direction"]


def graph_to_dataframe(graph: Graph) -> pd.DataFrame:
    """The statistics of every tracked tensor, one row per tensor and direction.

    A *long* (tidy) table: a tensor contributes a ``"fwd"`` row (its value) and,
    once a backward pass has reached it, a ``"bwd"`` row (its gradient), in graph
    order. Filter with ``df[df.direction == "bwd"]``, or pivot to one row per
    tensor with ``df.pivot(index="node", columns="direction")``.

    Columns:
        ``name`` (``meta["clean_name"]``), ``node`` (the FX node name, unique),
        ``op`` (FX opcode, e.g. ``"call_function"``), ``target`` (what the node
        computes, e.g. ``"U.linear"``), ``requires_grad`` (a trainable parameter),
        ``direction`` (``"fwd"`` or ``"bwd"``), then every :class:`Metrics.Data`
        field: ``mean_abs``, ``abs_mean``, ``std``, ``abs_max``, ``abs_min``,
        ``numel``, and the fractions ``e4m3_overflow``, ``e4m3_underflow``,
        ``e5m2_overflow``, ``e5m2_underflow`` that FP8 would saturate or flush.

    Args:
        graph: the graph returned by ``model.scales_graph()`` after
            :func:`unit_scaling.transforms.track_scales` (pruned or not).

    Example::

        >>> from unit_scaling.transforms import track_scales
        >>> model = track_scales(uu.Linear(16, 32))
        >>> model(torch.randn(8, 16)).sum().backward()
        >>> df = graph_to_dataframe(model.scales_graph())
        >>> df[["name", "direction"]].head(2)
             name direction
        0  weight       fwd
        1  weight       bwd
        >>> df["std"].head(2).round(1).tolist()
        [1.0, 1.1]
    """
    require_plot_extra()
    import pandas as pd

    rows = []
    for node in tracked_nodes(graph):
        metrics: Metrics = node.meta["metrics"]
        ident = {
            "name": node.meta.get("clean_name", node.name),
            "node": node.name,
            "op": node.op,
            "target": target_name(node),
            "requires_grad": bool(node.meta.get("requires_grad", False)),
        }
        for direction, data in (("fwd", metrics.fwd), ("bwd", metrics.bwd)):
            if data is not None:
                rows.append(
                    {**ident, "direction": direction, **dataclasses.asdict(data)}
                )
    return pd.DataFrame(rows, columns=[*_ID_COLUMNS, *Metrics.names()])
