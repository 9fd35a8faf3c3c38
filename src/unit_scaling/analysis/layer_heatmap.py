"""``plot_layer_heatmap``: the scales of a big model at one moment, on one screen.

A per-tensor plot of a 12-layer transformer has hundreds of rows. Its layers
repeat the same ops, so here each op of a layer is one row and each layer one
column: a cell is one tensor, and a row read left to right shows how an op's
scale drifts with depth.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from torch.fx import Graph, Node

from .._fx_names import module_path
from ..transforms import Metrics, prune_non_float_tensors, prune_same_scale_tensors
from ._graph import check_metric, tracked_nodes
from ._optional import require_plot_extra

if TYPE_CHECKING:  # pandas and matplotlib are imported when a plot is drawn
    import numpy as np
    import pandas as pd  # type: ignore[import-untyped,unused-ignore]
    from matplotlib.figure import Figure

__all__ = ["LayerPath", "parse_layer_path", "plot_layer_heatmap"]

# The monitor's kinds of tensor, by the panel that shows them.
_DIRECTIONS = {
    "activation": "fwd",
    "weight": "fwd",
    "activation_grad": "bwd",
    "weight_grad": "bwd",
}
_PANEL_TITLES = {"fwd": "forward: values", "bwd": "backward: gradients"}


class LayerPath(NamedTuple):
    """A dotted path split at its layer index (see :func:`parse_layer_path`)."""

    stack: str
    """The path of the list of layers, e.g. ``"transformer.h"``."""
    layer: int | None
    """The layer index, ``None`` for a tensor outside the layers."""
    within: str
    """The rest of the path: inside the layer, or all of it outside one."""


def parse_layer_path(path: str) -> LayerPath:
    """Split a module path or parameter name at its first integer component,
    the index of the layer it belongs to.

    Example::

        >>> parse_layer_path("transformer.h.7.attn.c_attn.weight")
        LayerPath(stack='transformer.h', layer=7, within='attn.c_attn.weight')
        >>> parse_layer_path("lm_head")
        LayerPath(stack='', layer=None, within='lm_head')
    """
    parts = path.split(".")
    for i, part in enumerate(parts):
        if re.fullmatch(r"\d+", part):
            return LayerPath(".".join(parts[:i]), int(part), ".".join(parts[i + 1 :]))
    return LayerPath("", None, path)


@dataclasses.dataclass
class _Tensor:
    path: str  # a module path or a parameter name
    op: str  # what made it inside that module; "" when the path says it all
    position: float  # in execution order: a parameter just before its first use
    is_parameter: bool
    scales: dict[str, float]  # by direction, "fwd" and "bwd"


def _scale(data: Metrics.Data, metric: str) -> float:
    if metric == "rms":
        return math.sqrt(data.std**2 + data.abs_mean**2)
    return float(getattr(data, metric))


def _module_paths(graph: Graph) -> dict[Node, str]:
    """Each node's module path. A node made outside any module (one a transform
    inserted, such as ``unit_scale``'s transpose of a weight) takes that of its
    first input that has one, so that it stays in its layer."""
    paths: dict[Node, str] = {}
    for node in graph.nodes:
        if node.op == "placeholder":  # named by its path: a parameter's module
            paths[node] = str(node.meta.get("clean_name", node.name)).rpartition(".")[0]
        else:
            inherited = (paths[i] for i in node.all_input_nodes if paths.get(i))
            paths[node] = module_path(node) or next(inherited, "")
    return paths


def _graph_tensors(graph: Graph, metric: str, prune_same_scale: bool) -> list[_Tensor]:
    if metric != "rms":
        check_metric(metric)
    tracked_nodes(graph)  # validates the graph before pruning copies it
    graph = prune_non_float_tensors(graph)
    if prune_same_scale:
        graph = prune_same_scale_tensors(graph)
    order = {node: i for i, node in enumerate(graph.nodes)}
    paths = _module_paths(graph)
    tensors = []
    for node in tracked_nodes(graph):
        metrics: Metrics = node.meta["metrics"]
        name = str(node.meta.get("clean_name", node.name))
        scales = {"fwd": _scale(metrics.fwd, metric)}
        if metrics.bwd is not None:
            scales["bwd"] = _scale(metrics.bwd, metric)
        if node.op == "placeholder":  # a parameter or an input: named by its path
            uses = [order[user] - 0.5 for user in node.users]
            path, op, position = name, "", min(uses, default=order[node])
        else:
            path = paths[node]
            op, position = re.sub(r"_\d+$", "", name), order[node]
        is_parameter = bool(node.meta.get("requires_grad", False))
        tensors.append(_Tensor(path, op, position, is_parameter, scales))
    return tensors


def _table_tensors(source: object, step: int | None, metric: str) -> list[_Tensor]:
    import pandas as pd

    from ._scales_table import checked_table

    table = checked_table(source, "plot_layer_heatmap")
    rows = table[table["kind"].isin(list(_DIRECTIONS))]
    if step is None and len(rows):
        step = int(rows["step"].max())
    rows = rows[(rows["step"] == step) & (rows["statistic"] == metric)]
    if rows.empty:
        steps = sorted(pd.unique(table["step"]).tolist())
        raise ValueError(
            f"plot_layer_heatmap: the table has no {metric!r} rows of kinds "
            f"{list(_DIRECTIONS)} at step {step}; steps recorded: {steps}"
        )
    first_seen = {tensor: i for i, tensor in enumerate(pd.unique(rows["tensor"]))}
    tensors: dict[tuple[str, bool], _Tensor] = {}
    for tensor, kind, value in rows[["tensor", "kind", "value"]].itertuples(
        index=False
    ):
        is_parameter = kind.startswith("weight")
        module = tensor.rpartition(".")[0]
        position: float = first_seen[tensor]
        if is_parameter and module in first_seen:
            position = first_seen[module] - 0.5
        entry = tensors.setdefault(
            (tensor, is_parameter), _Tensor(tensor, "", position, is_parameter, {})
        )
        entry.scales[_DIRECTIONS[kind]] = float(value)
    return list(tensors.values())


@dataclasses.dataclass
class _Grid:
    labels: list[str]
    is_parameter: list[bool]
    columns: list[str]
    cells: dict[str, np.ndarray]  # log₂ scales by direction, rows × columns


def _grid(tensors: list[_Tensor]) -> _Grid:
    """One row per op of a layer (the n-th use of the same op in the same
    place of a layer is the same row), one column per layer; tensors outside
    the layers in rows of their own, in an ``embed`` column before the first
    layer's first tensor or a ``head`` column after it."""
    import numpy as np

    from ._scales_table import log2

    tensors = sorted(tensors, key=lambda t: t.position)
    paths = [parse_layer_path(t.path) for t in tensors]
    first_layer = min(
        (
            t.position
            for t, p in zip(tensors, paths, strict=True)
            if p.layer is not None
        ),
        default=math.inf,
    )
    stacks = {p.stack for p in paths if p.layer is not None}
    uses: collections.Counter[tuple[object, ...]] = collections.Counter()
    rows: dict[tuple[object, ...], tuple[int, str, bool]] = {}
    placed = []
    for tensor, path in zip(tensors, paths, strict=True):
        if path.layer is None:
            column = "embed" if tensor.position < first_layer else "head"
            group, within = (0 if column == "embed" else 2), path.within
        else:
            column, group = str(path.layer), 1
            within = f"{path.stack}.*.{path.within}" if len(stacks) > 1 else path.within
        op = "" if within.rpartition(".")[2] == tensor.op else tensor.op
        base = (path.stack, within, op, tensor.is_parameter)
        uses[base, column] += 1
        row = (*base, uses[base, column])
        label = ": ".join(part for part in (within, op) if part) or "(layer output)"
        if uses[base, column] > 1:
            label += f" #{uses[base, column]}"
        rows.setdefault(row, (group, label, tensor.is_parameter))
        placed.append((row, column, tensor))
    order = sorted(rows, key=lambda r: rows[r][0])  # stable: first seen first
    layers = sorted({int(c) for _, c, _ in placed if c not in ("embed", "head")})
    columns = [str(layer) for layer in layers]
    columns = ["embed"] * any(c == "embed" for _, c, _ in placed) + columns
    columns += ["head"] * any(c == "head" for _, c, _ in placed)
    row_index = {row: i for i, row in enumerate(order)}
    column_index = {column: j for j, column in enumerate(columns)}
    cells = {d: np.full((len(order), len(columns)), np.nan) for d in ("fwd", "bwd")}
    for row, column, tensor in placed:
        for direction, scale in tensor.scales.items():
            cells[direction][row_index[row], column_index[column]] = log2(scale)
    return _Grid(
        [rows[r][1] for r in order], [rows[r][2] for r in order], columns, cells
    )


def plot_layer_heatmap(
    source: Graph | pd.DataFrame,
    *,
    step: int | None = None,
    metric: str = "rms",
    prune_same_scale: bool = True,
    title: str = "",
    path: str | Path | None = None,
) -> Figure:
    """The log₂ scale of every op of every layer: forward and backward heatmaps.

    Rows are the ops of a layer, columns the layers (parsed from module paths:
    ``"transformer.h.7.attn"`` is in layer 7, see :func:`parse_layer_path`), so
    a model of any depth fits on one screen. Tensors outside the layers (the
    embedding, the final norm and the readout) have rows of their own, in an
    ``embed`` column before the layers or a ``head`` column after them. Colours
    diverge from white at unit scale: red above, blue below; the colour bar is
    in binades and marks the normal ranges of FP8 E4M3 and E5M2. A hatched cell
    has no tensor, a hollow circle is a tensor of zeros, a red cross one without
    a finite scale. Parameters (labelled in grey italics) show their value
    forward and their gradient backward.

    Args:
        source: the graph returned by ``model.scales_graph()`` after
            :func:`unit_scaling.transforms.track_scales` and a forward and
            backward pass, or the table of ``unit_scaling.monitor`` (kinds
            ``activation`` and ``weight`` forward, ``activation_grad`` and
            ``weight_grad`` backward).
        step: the table's step to show (default: the last); ignored for a graph.
        metric: the scale shown: ``"rms"`` (``sqrt(std² + abs_mean²)`` for a
            graph), another :class:`Metrics.Data` field for a graph, or another
            statistic of the table.
        prune_same_scale: for a graph, drop nodes that keep their only input's
            scale (views, reshapes) with :func:`prune_same_scale_tensors`.
        title: the figure title.
        path: if given, save the figure there as a PNG.

    Returns:
        The :class:`matplotlib.figure.Figure`: ``figure.axes[0]`` the forward
        panel, ``figure.axes[1]`` the backward one (when there are gradients),
        each with its grid in ``.images[0]``.

    Example::

        >>> from unit_scaling.transforms import track_scales
        >>> model = track_scales(uu.TransformerDecoder(64, 256, layers=4, heads=4))
        >>> model.loss(torch.randint(256, (4, 33))).backward()
        >>> figure = plot_layer_heatmap(model.scales_graph(), title="u-μP decoder")
        >>> [t.get_text() for t in figure.axes[0].get_xticklabels()]
        ['embed', '0', '1', '2', '3', 'head']
        >>> figure.savefig("layers.png", dpi=150)
    """
    require_plot_extra()
    import matplotlib.pyplot as plt
    import numpy as np

    from . import _heatmap

    if isinstance(source, Graph):
        tensors = _graph_tensors(source, metric, prune_same_scale)
    else:
        tensors = _table_tensors(source, step, metric)
    grid = _grid(tensors)
    directions = [d for d in ("fwd", "bwd") if (~np.isnan(grid.cells[d])).any()]
    rows, columns = len(grid.labels), len(grid.columns)
    panel_width = max(2.4, 0.26 * columns)
    label_width = 0.055 * max(len(label) for label in grid.labels)
    figure, axes = plt.subplots(
        1,
        len(directions),
        sharey=True,
        squeeze=False,
        figsize=(
            label_width + panel_width * len(directions) + 1.8,
            _heatmap.rows_height(rows) + 1.4,
        ),
        layout="constrained",
    )
    norm = _heatmap.binade_norm(*grid.cells.values())
    name = "RMS" if metric == "rms" else metric
    for ax, direction in zip(axes[0], directions, strict=True):
        image = _heatmap.draw(ax, grid.cells[direction], norm)
        _heatmap.label_columns(ax, grid.columns, panel_width / columns)
        ax.set_xlabel("layer", fontsize=8)
        ax.set_title(_PANEL_TITLES[direction], loc="left", fontsize=10)
    _heatmap.label_rows(
        axes[0, 0], grid.labels, _heatmap.rows_height(rows) / rows, grid.is_parameter
    )
    _heatmap.binade_colorbar(
        image,
        list(axes[0]),
        _heatmap.rows_height(rows),
        f"log₂ {name} (binades from 1)",
        fp8_ranges=True,
    )
    if title:
        figure.suptitle(title, x=0.01, ha="left", fontweight="bold")
    if path is not None:
        figure.savefig(path, dpi=110)
    return figure
