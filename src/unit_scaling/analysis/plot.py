"""``plot``: the scale of every tensor of a model, forward and backward, on one axis."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from torch.fx import Graph, Node

from .._fx_names import module_path
from ..formats import FP8_E4M3, FP8_E5M2
from ..transforms import Metrics, prune_non_float_tensors, prune_same_scale_tensors
from ._graph import check_metric, tracked_nodes
from ._optional import require_plot_extra
from .layer_heatmap import plot_layer_heatmap

if TYPE_CHECKING:  # matplotlib is imported when a plot is drawn
    from matplotlib.axes import Axes
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

__all__ = ["plot"]

_FWD_COLOUR = "#1f6fb4"
_BWD_COLOUR = "#e8710a"
_BAD_COLOUR = "#c0392b"
_LANE = 0.18  # vertical offset of the forward / backward marker within a row
# Past this many rows a per-tensor plot is taller than a screen and its labels
# blur; the per-layer heatmap shows the same tensors in a fraction of the space.
_MAX_PER_TENSOR_ROWS = 120
# Error bars span [abs_min, abs_max]: meaningful only for metrics of magnitude.
_MAGNITUDE_METRICS = {"mean_abs", "abs_mean", "std", "abs_max", "abs_min"}
# The normal ranges of the FP8 formats, shaded so that a marker's position shows
# at a glance whether the tensor would fit (E4M3 is usual for values, E5M2 for
# gradients).
_FP8_RANGES = (
    ("E5M2", FP8_E5M2.min_absolute_normal, FP8_E5M2.max_absolute_value, "#e9f2e6"),
    ("E4M3", FP8_E4M3.min_absolute_normal, FP8_E4M3.max_absolute_value, "#cfe5c8"),
)


@dataclasses.dataclass
class _Row:
    node: Node
    label: str
    is_parameter: bool
    fwd: Metrics.Data
    bwd: Metrics.Data | None


def _value(data: Metrics.Data | None, metric: str) -> float | None:
    return None if data is None else float(getattr(data, metric))


def _drawable(values: Iterable[float | None]) -> list[float]:
    """The values that a log axis can show: finite and positive."""
    return [v for v in values if v is not None and math.isfinite(v) and v > 0]


def _rows(graph: Graph, metric: str, show_zero_tensors: bool) -> list[_Row]:
    rows = []
    for node in tracked_nodes(graph):
        metrics: Metrics = node.meta["metrics"]
        values = (_value(metrics.fwd, metric), _value(metrics.bwd, metric))
        if not show_zero_tensors and all(v is None or v == 0 for v in values):
            continue
        rows.append(
            _Row(
                node,
                _label(node),
                bool(node.meta.get("requires_grad", False)),
                metrics.fwd,
                metrics.bwd,
            )
        )
    return rows


def _check_recorded(rows: list[_Row], metric: str) -> None:
    """A ``block_*`` metric exists only where a block format was tracked."""
    if not metric.startswith("block_"):
        return
    values = [_value(d, metric) for r in rows for d in (r.fwd, r.bwd)]
    if not any(v is not None and not math.isnan(v) for v in values):
        raise ValueError(
            f"plot: {metric!r} was not recorded: track the model with "
            "track_scales(model, block_format=...) to measure a block format"
        )


def _limits(
    rows: list[_Row], metric: str, xmin: float | None, xmax: float | None
) -> tuple[float, float]:
    """Axis limits around the markers (and the largest elements).

    The smallest element of a large tensor is often many octaves below its scale;
    letting it set the limit would squash the markers, so ``abs_min`` bars are
    clipped at the left edge instead.
    """
    directions = [d for row in rows for d in (row.fwd, row.bwd) if d is not None]
    markers = _drawable(_value(d, metric) for d in directions)
    largest = _drawable(d.abs_max for d in directions)
    if metric not in _MAGNITUDE_METRICS:
        largest = []
    lo = min(markers, default=1.0) / 2**5
    hi = max(markers + largest, default=1.0) * 2
    lo, hi = xmin if xmin is not None else lo, xmax if xmax is not None else hi
    if not (lo > 0 and hi > lo):
        raise ValueError(
            f"xmin={lo} and xmax={hi} must satisfy 0 < xmin < xmax on a log axis"
        )
    return lo, hi


def _label(node: Node) -> str:
    """``meta["clean_name"]``, prefixed by the producing module's path when that
    adds information (parameters already carry theirs)."""
    name = str(node.meta.get("clean_name", node.name))
    path = "" if node.op == "placeholder" else module_path(node)
    if not path or path.split(".")[-1] == re.sub(r"_\d+$", "", name):
        return name
    return f"{path}: {name}"


def _draw_direction(
    ax: Axes,
    rows: list[_Row],
    direction: str,
    metric: str,
    limits: tuple[float, float],
    error_bars: bool,
    show_zero_tensors: bool,
) -> None:
    colour, marker, offset = (
        (_FWD_COLOUR, "o", -_LANE) if direction == "fwd" else (_BWD_COLOUR, "s", _LANE)
    )
    xs, ys, zeros, bad = [], [], [], []
    for i, row in enumerate(rows):
        data: Metrics.Data | None = getattr(row, direction)
        value = _value(data, metric)
        if data is None or value is None:
            continue
        y = i + offset
        if not math.isfinite(value):
            bad.append(y)
        elif value == 0:
            if show_zero_tensors:
                zeros.append(y)
        else:
            xs.append(value)
            ys.append(y)
            if error_bars and data.abs_max > 0 and math.isfinite(data.abs_max):
                lo = max(data.abs_min, limits[0])
                ax.plot(
                    [lo, min(data.abs_max, limits[1])],
                    [y, y],
                    color=colour,
                    alpha=0.35,
                    lw=1.0,
                    solid_capstyle="butt",
                    zorder=2,
                )
    ax.scatter(xs, ys, s=22, marker=marker, color=colour, zorder=4, linewidths=0)
    if zeros:
        ax.scatter(
            [limits[0]] * len(zeros),
            zeros,
            s=22,
            marker=marker,
            facecolors="none",
            edgecolors=colour,
            zorder=4,
            clip_on=False,
        )
    if bad:
        ax.scatter(
            [limits[1]] * len(bad),
            bad,
            s=40,
            marker="X",
            color=_BAD_COLOUR,
            zorder=5,
            clip_on=False,
        )


def _draw_arrows(ax: Axes, rows: list[_Row], metric: str) -> None:
    """Arrows from each input's scale to its output's (forward, in the output's
    row) and from each output gradient's scale to the input gradient's (backward,
    in the input's row)."""
    index = {row.node: i for i, row in enumerate(rows)}

    def arrow(start: float | None, end: float | None, y: float, colour: str) -> None:
        ends = _drawable([start, end])
        if len(ends) != 2:
            return
        x0, x1 = ends
        if abs(math.log2(x1 / x0)) < 1 / 8:  # too short to read
            return
        ax.annotate(
            "",
            xy=(x1, y),
            xytext=(x0, y),
            arrowprops={
                "arrowstyle": "-|>,head_length=0.4,head_width=0.18",
                "color": colour,
                "lw": 0.7,
                "alpha": 0.55,
                "shrinkA": 0,
                "shrinkB": 3,
            },
            zorder=3,
        )

    for i, row in enumerate(rows):
        for source in row.node.all_input_nodes:
            j = index.get(source)
            if j is None:
                continue
            src = rows[j]
            arrow(
                _value(src.fwd, metric), _value(row.fwd, metric), i - _LANE, _FWD_COLOUR
            )
            arrow(
                _value(row.bwd, metric), _value(src.bwd, metric), j + _LANE, _BWD_COLOUR
            )


def _draw_fp8_ranges(ax: Axes) -> list[Patch]:
    from matplotlib.patches import Patch

    handles = []
    for name, lo, hi, colour in _FP8_RANGES:
        ax.axvspan(lo, hi, color=colour, zorder=0, lw=0)
        handles.append(Patch(color=colour, label=f"{name} normal range"))
    ax.axvline(1.0, color="#555555", lw=0.8, zorder=1)
    return handles


def plot(
    graph: Graph,
    title: str = "",
    metric: str = "mean_abs",
    prune_same_scale: bool = True,
    show_arrows: bool = True,
    show_error_bars: bool = True,
    show_zero_tensors: bool = False,
    xmin: float | None = None,
    xmax: float | None = None,
    *,
    show_fp8_ranges: bool = True,
    ax: Axes | None = None,
    per_tensor: bool | None = None,
) -> Axes:
    """Plot the scale of every tensor of a tracked model, forward and backward.

    One row per floating-point tensor of ``graph`` (top to bottom in execution
    order), labelled with its ``meta["clean_name"]`` (parameters in grey italics).
    In each row a blue circle marks ``metric`` of the tensor and an orange square
    the same metric of its gradient, on a log₂ axis; a thin bar spans the smallest
    to the largest absolute element (``abs_min`` to ``abs_max``). Arrows show how
    each op changes the scale: forward from each input's value to the output's
    (in the output's row), backward from the output's gradient to each input's
    gradient (in the input's row). Shaded bands mark the normal ranges of FP8
    E4M3 and E5M2, and a vertical line marks 1, where a unit-scaled model keeps
    its tensors. A non-finite value is a red cross at the right edge.

    A model with more than 120 such rows is drawn compactly instead, by
    :func:`plot_layer_heatmap`: one row per op of a layer, one column per layer
    (``per_tensor=True`` keeps one row per tensor).

    Args:
        graph: the graph returned by ``model.scales_graph()`` after
            :func:`unit_scaling.transforms.track_scales` and a forward (and
            backward) pass. Nodes that are not floating-point tensors are pruned.
        title: the axes title.
        metric: which :class:`Metrics.Data` field to plot (``Metrics.names()``).
        prune_same_scale: drop nodes that keep their only input's scale (views,
            reshapes) with :func:`prune_same_scale_tensors`.
        show_arrows: draw the scale-change arrows.
        show_error_bars: draw the ``abs_min``–``abs_max`` bars (magnitude metrics).
        show_zero_tensors: keep rows whose metric is zero in both directions,
            drawing zeros as hollow markers at the left edge (a log axis has no 0).
        xmin, xmax: x-axis limits. Default: the data's range, padded.
        show_fp8_ranges: shade the FP8 normal ranges.
        ax: axes to draw on. Default: a new figure whose height grows with the
            number of rows.
        per_tensor: one row per tensor (``True``) or the per-layer heatmap of
            ``metric`` (``False``; it draws two panels, so ``ax`` must be
            ``None``). Default: per tensor if there are at most 120 rows or
            ``ax`` is given.

    Returns:
        The :class:`matplotlib.axes.Axes` drawn on (``ax.figure.savefig(...)``);
        for the per-layer heatmap, its forward panel.

    Example::

        >>> from unit_scaling.transforms import track_scales
        >>> model = track_scales(uu.TransformerDecoder(64, 256, layers=2, heads=4))
        >>> model.loss(torch.randint(256, (4, 33))).backward()
        >>> ax = plot(model.scales_graph(), title="u-μP decoder")
        >>> ax.figure.savefig("scales.png", dpi=150)
    """
    require_plot_extra()
    import matplotlib.pyplot as plt

    check_metric(metric)
    tracked_nodes(graph)  # validates the graph before pruning copies it
    graph = prune_non_float_tensors(graph)
    if prune_same_scale:
        graph = prune_same_scale_tensors(graph)
    rows = _rows(graph, metric, show_zero_tensors)
    _check_recorded(rows, metric)
    if per_tensor is None:
        per_tensor = ax is not None or len(rows) <= _MAX_PER_TENSOR_ROWS
    if not per_tensor:
        if ax is not None:
            raise ValueError(
                "plot: the per-layer heatmap (per_tensor=False) draws two panels "
                "on a figure of its own; pass ax=None, or per_tensor=True to draw "
                "one row per tensor into ax"
            )
        figure = plot_layer_heatmap(
            graph, metric=metric, prune_same_scale=False, title=title
        )
        return figure.axes[0]
    own_figure = ax is None
    if ax is None:
        height = max(3.0, 0.19 * len(rows) + 1.6)
        _, ax = plt.subplots(figsize=(10, height), layout="constrained")
    error_bars = show_error_bars and metric in _MAGNITUDE_METRICS
    limits = _limits(rows, metric, xmin, xmax)

    handles: list[Line2D | Patch] = []
    if show_fp8_ranges:
        handles += _draw_fp8_ranges(ax)
    for direction in ("fwd", "bwd"):
        _draw_direction(
            ax, rows, direction, metric, limits, error_bars, show_zero_tensors
        )
    if show_arrows:
        _draw_arrows(ax, rows, metric)

    ax.set_xscale("log", base=2)
    ax.set_xlim(*limits)
    ax.set_ylim(max(len(rows), 1) - 0.5, -0.5)
    ax.set_yticks(range(len(rows)), [row.label for row in rows])
    fontsize = 8 if len(rows) > 25 else 9
    for label, row in zip(ax.get_yticklabels(), rows, strict=True):
        label.set_fontsize(fontsize)
        if row.is_parameter:
            label.set_color("#666666")
            label.set_fontstyle("italic")
    ax.tick_params(axis="y", length=0)
    ax.tick_params(axis="x", top=True, labeltop=len(rows) > 30, labelsize=8)
    ax.grid(axis="x", color="#bbbbbb", alpha=0.5, lw=0.5)
    for y in range(len(rows) + 1):
        ax.axhline(y - 0.5, color="#eeeeee", lw=0.5, zorder=0.5)
    ax.set_xlabel(f"{Metrics.get_full_name(metric)} (log₂ scale)")
    ax.spines[["left", "right"]].set_visible(False)

    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], ls="", marker="o", color=_FWD_COLOUR, label="forward (tensor)"),
        Line2D([], [], ls="", marker="s", color=_BWD_COLOUR, label="backward (grad)"),
        *handles,
    ]
    legend = {"handles": handles, "fontsize": 8, "handletextpad": 0.3}
    if own_figure:
        # Below the axes, so it can never hide a marker; the figure's
        # constrained layout makes room for it.
        ax.figure.legend(
            **legend, loc="outside lower center", ncol=len(handles), frameon=False
        )
    else:
        ax.legend(**legend, loc="lower left", framealpha=0.9)
    ax.set_title(title, loc="left", fontweight="bold")
    return ax
