"""Heatmaps of log₂ scales: one colour scale centred on unit scale, a colour bar
in binades (with the FP8 ranges marked), and tick labels that stay readable at
hundreds of rows. Shared by :mod:`.training_scales` and :mod:`.layer_heatmap`.

Imported when a plot is drawn, after ``require_plot_extra()``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import matplotlib
import numpy as np
from matplotlib import transforms
from matplotlib.axes import Axes
from matplotlib.colorbar import Colorbar
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.image import AxesImage

from ..formats import FP8_E4M3, FP8_E5M2

__all__ = [
    "ROW_INCHES",
    "binade_colorbar",
    "binade_norm",
    "draw",
    "label_columns",
    "label_rows",
    "rows_height",
]

ROW_INCHES = 0.16
"""The height of a row while the figure stays under its largest height."""
_MAX_HEIGHT = 30.0  # inches: past this, rows get thinner and labels sparser
_MIN_SPAN = 4  # binades either side of unit scale the colours span at least
_MISSING = "#d0d0d0"  # hatching where a tensor is absent
_ZERO = "#303030"
_NON_FINITE = "#c0392b"
# Normal ranges: a tensor whose RMS lies inside keeps most of its elements out
# of the subnormals and below the largest value.
_FP8_RANGES = (
    ("E4M3", FP8_E4M3.min_absolute_normal, FP8_E4M3.max_absolute_value, "#2e7d32"),
    ("E5M2", FP8_E5M2.min_absolute_normal, FP8_E5M2.max_absolute_value, "#7b5ea7"),
)


def rows_height(rows: int) -> float:
    """Inches for ``rows`` heatmap rows: :data:`ROW_INCHES` each, capped."""
    return min(ROW_INCHES * max(rows, 1), _MAX_HEIGHT)


def binade_norm(*grids: np.ndarray) -> Normalize:
    """A colour scale symmetric about 0 (unit scale), in whole binades, spanning
    the finite values of ``grids``."""
    finite = [np.abs(g[np.isfinite(g)]) for g in grids]
    largest = max((float(f.max()) for f in finite if f.size), default=0.0)
    span = max(_MIN_SPAN, math.ceil(largest))
    return Normalize(-span, span)


def draw(ax: Axes, grid: np.ndarray, norm: Normalize) -> AxesImage:
    """Draw the log₂ scales ``grid`` (rows × columns) as coloured cells.

    NaN is a cell without a tensor (hatched), ``-inf`` a tensor of zeros (a
    hollow circle), ``+inf`` one with no finite scale (a red cross).
    """
    cmap = matplotlib.colormaps["RdBu_r"].with_extremes(bad=(0, 0, 0, 0))
    image = ax.imshow(
        np.ma.masked_invalid(grid),
        cmap=cmap,
        norm=norm,
        aspect="auto",
        interpolation="nearest",
    )
    ax.patch.set_facecolor("white")
    ax.patch.set_edgecolor(_MISSING)
    ax.patch.set_hatch("////")
    size = 16 if grid.shape[0] <= 60 else 6
    zeros, non_finite = np.nonzero(grid == -np.inf), np.nonzero(grid == np.inf)
    if zeros[0].size:
        ax.scatter(
            zeros[1],
            zeros[0],
            s=size,
            facecolors="none",
            edgecolors=_ZERO,
            linewidths=0.8,
            zorder=3,
        )
    if non_finite[0].size:
        ax.scatter(
            non_finite[1],
            non_finite[0],
            s=size,
            color=_NON_FINITE,
            marker="X",
            linewidths=0.8,
            zorder=3,
        )
    ax.tick_params(length=0)
    ax.spines[:].set_visible(False)
    return image


def label_rows(
    ax: Axes,
    labels: Sequence[str],
    inches_per_row: float,
    muted: Sequence[bool] = (),
) -> None:
    """Row labels as large as the rows allow (8 pt down to 5.5 pt), then only
    every k-th. ``muted`` rows (parameters) are grey italics."""
    row_points = inches_per_row * 72
    fontsize = min(8.0, max(5.5, row_points / 1.25))
    every = max(1, math.ceil(fontsize * 1.2 / row_points))
    ticks = range(0, len(labels), every)
    ax.set_yticks(list(ticks), [labels[i] for i in ticks], fontsize=fontsize)
    for label, i in zip(ax.get_yticklabels(), ticks, strict=True):
        if i < len(muted) and muted[i]:
            label.set_color("#666666")
            label.set_fontstyle("italic")


def label_columns(
    ax: Axes, labels: Sequence[str], inches_per_column: float, fontsize: float = 7.5
) -> None:
    """Column labels: all of them level if they fit, else upright and, if need
    be, every k-th."""
    column_points = inches_per_column * 72
    widest = 0.62 * fontsize * max((len(label) for label in labels), default=1)
    upright = widest * 1.2 > column_points
    every = max(1, math.ceil(fontsize * 1.3 / column_points)) if upright else 1
    ticks = range(0, len(labels), every)
    ax.set_xticks(
        list(ticks),
        [labels[i] for i in ticks],
        fontsize=fontsize,
        rotation=90 if upright else 0,
    )


def binade_colorbar(
    image: AxesImage,
    axes: Axes | Sequence[Axes],
    height: float,
    label: str,
    fp8_ranges: bool = False,
) -> Colorbar:
    """A colour bar for ``image`` beside ``axes`` (``height`` inches tall), ticked
    in whole binades; with ``fp8_ranges``, bars at its left span the normal
    ranges of E4M3 and E5M2 (a triangle where a range runs past the colours)."""
    figure = image.get_figure(root=True)
    assert isinstance(figure, Figure)
    bar = figure.colorbar(
        image,
        ax=axes,
        shrink=min(1.0, 6.0 / height),
        aspect=25,
        pad=0.05 if fp8_ranges else 0.02,
    )
    bar.set_label(label, fontsize=8)
    low, high = _limits(image.norm)
    step = max(1, math.ceil((high - low) / 12))  # multiples of it: 0 is a tick
    bar.set_ticks(list(range(math.ceil(low / step) * step, math.floor(high) + 1, step)))
    bar.ax.tick_params(labelsize=7)
    if fp8_ranges:
        for offset, (name, smallest, largest, colour) in zip(
            (5, 19), _FP8_RANGES, strict=True
        ):
            _range_bar(
                bar, offset, name, colour, math.log2(smallest), math.log2(largest)
            )
    return bar


def _range_bar(
    bar: Colorbar, offset: float, name: str, colour: str, bottom: float, top: float
) -> None:
    """A vertical bar ``offset`` points left of ``bar`` from ``bottom`` to
    ``top`` (in binades), labelled ``name``."""
    low, high = _limits(bar.mappable.norm)
    figure = bar.ax.get_figure(root=True)
    assert isinstance(figure, Figure)

    def at(points: float) -> transforms.Transform:
        return transforms.blended_transform_factory(
            bar.ax.transAxes, bar.ax.transData
        ) + transforms.ScaledTranslation(-points / 72, 0, figure.dpi_scale_trans)

    shown = [max(bottom, low), min(top, high)]
    bar.ax.plot(
        [0, 0],
        shown,
        color=colour,
        lw=2,
        solid_capstyle="butt",
        clip_on=False,
        transform=at(offset),
    )
    for end, clipped, marker in (
        (shown[0], bottom < low, "v"),
        (shown[1], top > high, "^"),
    ):
        bar.ax.plot(
            [0],
            [end],
            marker=marker if clipped else "_",
            ms=5,
            mew=1.5,
            color=colour,
            clip_on=False,
            transform=at(offset),
        )
    bar.ax.text(
        0,
        sum(shown) / 2,
        name,
        fontsize=7,
        rotation=90,
        ha="right",
        va="center",
        color=colour,
        clip_on=False,
        transform=at(offset + 2.5),
    )


def _limits(norm: object) -> tuple[float, float]:
    """The ends of a :func:`binade_norm`."""
    assert isinstance(norm, Normalize)
    low, high = norm.vmin, norm.vmax
    assert isinstance(low, float) and isinstance(high, float)
    return low, high
