"""Scales over a training run: read what ``unit_scaling.monitor`` recorded and
plot it.

The monitor records, every few steps, statistics of each tensor as a long
table with columns ``step``, ``tensor`` (a module path such as
``"layers.0.attn.q"``, or a parameter name such as ``"layers.0.attn.q.weight"``),
``kind`` (``"activation"``, ``"activation_grad"``, ``"weight"``,
``"weight_grad"`` or ``"update"``), ``statistic`` (``"rms"``, ``"abs_max"``,
``"e4m3_saturated"``, ``"e4m3_flushed"``, ...) and ``value``. It saves the
table as CSV or Parquet, or logs it to TensorBoard as scalars tagged
``scales/<tensor>/<kind>/<statistic>``; :func:`read_scales` reads any of these
back.
"""

from __future__ import annotations

import importlib
import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ._optional import require_plot_extra

if TYPE_CHECKING:  # pandas and matplotlib are imported when a function runs
    import numpy as np
    import pandas as pd  # type: ignore[import-untyped,unused-ignore]
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "plot_fp8_fractions_over_training",
    "plot_scales_over_training",
    "read_scales",
]

_TENSORBOARD_EXTRA = 'pip install "torch-unit-scaling[tensorboard]"'
_KIND_COLOURS = {
    "activation": "#1f6fb4",
    "activation_grad": "#e8710a",
    "weight": "#2e7d32",
    "weight_grad": "#b03a8c",
    "update": "#6d6d6d",
}


def read_scales(source: str | Path) -> pd.DataFrame:
    """The table of scales a training run recorded, from a file or a log.

    Args:
        source: a ``.csv`` or ``.parquet`` file saved from the monitor's table
            (Parquet needs pyarrow), or a TensorBoard log directory whose
            scalars are tagged ``scales/<tensor>/<kind>/<statistic>`` (needs
            ``pip install "torch-unit-scaling[tensorboard]"``; other tags are
            ignored). A directory without event files of its own may hold one
            run in a subdirectory.

    Returns:
        A DataFrame with columns ``step``, ``tensor``, ``kind``, ``statistic``
        and ``value``, rows in the order recorded (for TensorBoard, by step,
        then in the order the tags were first written).

    Raises:
        ValueError: ``source`` does not exist, has an unknown suffix, holds
            several runs or no scales, or lacks a column.
        ImportError: the reader it needs is not installed.

    Example::

        >>> import pandas as pd
        >>> pd.DataFrame({"step": [0, 0], "tensor": "layers.0.attn.q",
        ...     "kind": "activation", "statistic": ["rms", "abs_max"],
        ...     "value": [0.9, 4.5]}).to_csv("scales.csv", index=False)
        >>> read_scales("scales.csv")
           step           tensor        kind statistic  value
        0     0  layers.0.attn.q  activation       rms    0.9
        1     0  layers.0.attn.q  activation   abs_max    4.5
    """
    require_plot_extra()
    import pandas as pd

    from ._scales_table import checked_table

    path = Path(source)
    if not path.exists():
        raise ValueError(
            f"read_scales: {str(path)!r} does not exist; expected a CSV or Parquet "
            "table saved from unit_scaling.monitor, or a TensorBoard log directory"
        )
    if path.is_dir():
        table = _read_tensorboard(path)
    elif path.suffix == ".csv":
        table = pd.read_csv(path)
    elif path.suffix in (".parquet", ".pq"):
        try:
            importlib.import_module("pyarrow")
        except ImportError as error:
            raise ImportError(
                f"read_scales: reading {path.name} needs pyarrow, which is not "
                "installed: pip install pyarrow (or save the table as CSV)"
            ) from error
        table = pd.read_parquet(path)
    else:
        raise ValueError(
            f"read_scales: cannot read {path.name!r}; expected a .csv or .parquet "
            "file, or a TensorBoard log directory"
        )
    return checked_table(table, "read_scales")


def _event_directory(directory: Path) -> Path:
    """The one directory at or under ``directory`` that holds TensorBoard events."""
    runs = sorted({f.parent for f in directory.rglob("events.out.tfevents*")})
    if directory in runs:
        return directory
    if len(runs) == 1:
        return runs[0]
    if not runs:
        raise ValueError(
            f"read_scales: {str(directory)!r} holds no TensorBoard event files "
            "(events.out.tfevents.*); pass the log directory the monitor wrote"
        )
    raise ValueError(
        f"read_scales: {str(directory)!r} holds several runs "
        f"{[str(r.relative_to(directory)) for r in runs]}; pass one of them"
    )


def _read_tensorboard(directory: Path) -> pd.DataFrame:
    import pandas as pd

    from ._scales_table import COLUMNS

    try:
        from tensorboard.backend.event_processing.event_accumulator import (  # type: ignore[import-untyped,unused-ignore]
            EventAccumulator,
        )
    except ImportError as error:
        raise ImportError(
            "read_scales: reading a TensorBoard log directory needs tensorboard, "
            f"which is not installed: {_TENSORBOARD_EXTRA}"
        ) from error
    run = _event_directory(directory)
    events = EventAccumulator(str(run), size_guidance={"scalars": 0})  # keep all
    events.Reload()
    rows = []
    for tag in events.Tags()["scalars"]:
        parts = tag.split("/")
        if len(parts) != 4 or parts[0] != "scales":
            continue
        rows += [(e.step, *parts[1:], e.value) for e in events.Scalars(tag)]
    if not rows:
        raise ValueError(
            f"read_scales: the TensorBoard log {str(run)!r} has no scalars tagged "
            "scales/<tensor>/<kind>/<statistic>; was it written by "
            "unit_scaling.monitor?"
        )
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    return table.sort_values("step", kind="stable", ignore_index=True)


def _table(table: pd.DataFrame | str | Path, caller: str) -> pd.DataFrame:
    """A checked table from a DataFrame or anything :func:`read_scales` reads."""
    from ._scales_table import checked_table

    if isinstance(table, (str, Path)):
        return read_scales(table)
    return checked_table(table, caller)


def _log2_rms_grid(
    rows: pd.DataFrame, order: list[str]
) -> tuple[np.ndarray, list[str], list[int]]:
    """log₂ RMS of each tensor (rows, in ``order``) at each step (columns)."""
    import pandas as pd

    from ._scales_table import log2

    rms = rows[rows["statistic"] == "rms"]
    recorded = set(rms["tensor"])
    tensors = [tensor for tensor in order if tensor in recorded]
    steps = sorted(pd.unique(rms["step"]).tolist())
    # log₂ first, so that NaN is left to mean "not recorded"
    logs = rms.assign(value=log2(rms["value"].to_numpy()))
    # A step recorded twice (a resumed run) keeps its last record.
    wide = logs.groupby(["tensor", "step"], sort=False)["value"].last().unstack()
    return wide.reindex(index=tensors, columns=steps).to_numpy(), tensors, steps


def plot_scales_over_training(
    table: pd.DataFrame | str | Path,
    kind: str = "activation",
    path: str | Path | None = None,
    *,
    title: str = "",
) -> Figure:
    """A heatmap of each tensor's log₂ RMS over training.

    One row per tensor, in the order first recorded (execution order; a
    gradient in its activation's place), one column per recorded step. Colours
    diverge from white at unit scale (RMS 1): red above, blue below, the colour
    bar in binades. A hatched cell is a step at which the tensor was not
    recorded, a hollow circle a tensor of zeros, a red cross one without a
    finite RMS.

    Args:
        table: the monitor's table (a DataFrame with columns ``step``,
            ``tensor``, ``kind``, ``statistic``, ``value`` and ``"rms"`` rows),
            or a path :func:`read_scales` reads.
        kind: the kind of tensor to show (``"activation"``,
            ``"activation_grad"``, ``"weight"``, ``"weight_grad"``,
            ``"update"``), or ``"all"`` for one panel per kind present.
        path: if given, save the figure there as a PNG.
        title: the figure title.

    Returns:
        The :class:`matplotlib.figure.Figure`; ``figure.axes[i].images[0]``
        holds panel ``i``'s grid of log₂ RMS.

    Raises:
        ValueError: the table lacks a column, or has no RMS of ``kind``.

    Example::

        >>> import pandas as pd
        >>> table = pd.DataFrame({"step": [0, 0, 10, 10],
        ...     "tensor": ["embed", "layers.0.mlp"] * 2, "kind": "activation",
        ...     "statistic": "rms", "value": [1.0, 2.0, 1.0, 8.0]})
        >>> figure = plot_scales_over_training(table)
        >>> figure.axes[0].images[0].get_array().tolist()
        [[0.0, 0.0], [1.0, 3.0]]
        >>> figure.savefig("scales_activation.png")
    """
    require_plot_extra()
    import matplotlib.pyplot as plt
    import pandas as pd

    from . import _heatmap
    from ._scales_table import KIND_TITLES, kinds_in

    table = _table(table, "plot_scales_over_training")
    with_rms = table[table["statistic"] == "rms"]
    present = kinds_in(with_rms)
    kinds = present if kind == "all" else [kind]
    if not set(kinds) <= set(present) or not kinds:
        raise ValueError(
            f"plot_scales_over_training: the table has no 'rms' rows of kind "
            f"{kind!r}; kinds with an RMS: {present} (or 'all')"
        )
    # Tensors in the order first recorded, of any kind: gradients, recorded
    # in the backward pass, keep the forward order of their activations.
    order = list(pd.unique(table["tensor"]))
    grids = [_log2_rms_grid(with_rms[with_rms["kind"] == k], order) for k in kinds]
    rows = sum(len(tensors) for _, tensors, _ in grids)
    height = _heatmap.rows_height(rows) + 1.0 * len(kinds) + 0.6
    figure, axes = plt.subplots(
        len(kinds),
        1,
        figsize=(10, height),
        squeeze=False,
        height_ratios=[max(len(tensors), 3) for _, tensors, _ in grids],
        layout="constrained",
    )
    inches_per_row = _heatmap.rows_height(rows) / rows
    for ax, k, (grid, tensors, steps) in zip(axes[:, 0], kinds, grids, strict=True):
        image = _heatmap.draw(ax, grid, _heatmap.binade_norm(grid))
        _heatmap.label_rows(ax, tensors, inches_per_row)
        _step_ticks(ax, steps)
        ax.set_title(KIND_TITLES.get(k, k), loc="left", fontsize=10)
        _heatmap.binade_colorbar(
            image, ax, inches_per_row * len(tensors), "log₂ RMS (binades from 1)"
        )
    axes[-1, 0].set_xlabel("step")
    if title:
        figure.suptitle(title, x=0.01, ha="left", fontweight="bold")
    if path is not None:
        figure.savefig(path, dpi=110)
    return figure


def _step_ticks(ax: Axes, steps: list[int]) -> None:
    """Ticks at round positions along the columns, labelled with their steps."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    def step_of(x: float, _: object) -> str:
        i = round(x)
        return str(steps[i]) if 0 <= i < len(steps) and abs(x - i) < 1e-6 else ""

    ax.xaxis.set_major_locator(MaxNLocator(nbins="auto", integer=True))
    ax.xaxis.set_major_formatter(FuncFormatter(step_of))
    ax.tick_params(axis="x", labelsize=7.5)


def plot_fp8_fractions_over_training(
    table: pd.DataFrame | str | Path,
    path: str | Path | None = None,
    formats: Sequence[str] = ("e4m3", "e5m2"),
    *,
    title: str = "",
) -> Figure:
    """The fractions of elements each format would saturate or flush, over training.

    One row of panels per format: saturated (above the largest finite value)
    on the left, flushed to zero on the right. In each panel a line per kind of
    tensor: solid the largest fraction over that kind's tensors at each step,
    dashed the median. The y axis is logarithmic when any fraction is above
    zero; zero is drawn at the axis's bottom, which is labelled 0.

    Args:
        table: the monitor's table, or a path :func:`read_scales` reads.
        path: if given, save the figure there as a PNG.
        formats: the formats to show, by the prefix of their statistics
            (``"e4m3"``, ``"e5m2"``, ``"fp16"``).
        title: the figure title.

    Returns:
        The :class:`matplotlib.figure.Figure`, one row of two axes per format.

    Raises:
        ValueError: the table lacks a column, or a format's statistics.

    Example::

        >>> import pandas as pd
        >>> table = pd.DataFrame({"step": [0, 0, 10, 10], "tensor": "layers.0",
        ...     "kind": "activation_grad",
        ...     "statistic": ["e5m2_saturated", "e5m2_flushed"] * 2,
        ...     "value": [0.0, 0.01, 0.0, 0.2]})
        >>> figure = plot_fp8_fractions_over_training(table, formats=["e5m2"])
        >>> figure.axes[1].get_lines()[0].get_ydata().tolist()  # largest flushed
        [0.01, 0.2]
    """
    require_plot_extra()
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    from ._scales_table import KIND_TITLES, kinds_in

    table = _table(table, "plot_fp8_fractions_over_training")
    recorded = set(table["statistic"])
    missing = [
        f"{f}_{what}"
        for f in formats
        for what in ("saturated", "flushed")
        if f"{f}_{what}" not in recorded
    ]
    if missing or not formats:
        available = sorted({s.rsplit("_", 1)[0] for s in recorded if "_" in s})
        raise ValueError(
            f"plot_fp8_fractions_over_training: the table has no {missing or 'format'} "
            f"rows; formats it has fractions for: {available}"
        )
    figure, axes = plt.subplots(
        len(formats),
        2,
        figsize=(11, 2.6 * len(formats) + 0.8),
        squeeze=False,
        sharex=True,
        layout="constrained",
    )
    kinds = kinds_in(table)
    for row, fmt in zip(axes, formats, strict=True):
        for ax, what in zip(row, ("saturated", "flushed"), strict=True):
            rows = table[table["statistic"] == f"{fmt}_{what}"]
            never = []  # kinds with no such element at any step: no line to draw
            for kind in kinds:
                by_step = rows[rows["kind"] == kind].groupby("step")["value"]
                if not len(by_step):
                    continue
                largest, median = by_step.max(), by_step.median()
                if not (largest > 0).any():
                    never.append(KIND_TITLES.get(kind, kind))
                    continue
                colour = _KIND_COLOURS.get(kind, "#333333")
                ax.plot(largest.index, largest.to_numpy(), color=colour, lw=1.4)
                ax.plot(median.index, median.to_numpy(), color=colour, lw=1.1, ls="--")
            _fraction_axis(ax, never)
            ax.set_title(f"{fmt.upper()}: fraction {what}", loc="left", fontsize=10)
    for ax in axes[-1]:
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    handles = [
        Line2D([], [], color=_KIND_COLOURS.get(k, "#333333"), label=KIND_TITLES[k])
        for k in kinds
        if k in KIND_TITLES
    ]
    handles += [
        Line2D([], [], color="#333333", lw=1.4, label="largest over tensors"),
        Line2D([], [], color="#333333", lw=1.1, ls="--", label="median"),
    ]
    figure.legend(
        handles=handles,
        loc="outside lower center",
        ncol=len(handles),
        fontsize=8,
        frameon=False,
    )
    if title:
        figure.suptitle(title, x=0.01, ha="left", fontweight="bold")
    if path is not None:
        figure.savefig(path, dpi=110)
    return figure


def _fraction_axis(ax: Axes, never: list[str]) -> None:
    """A log axis if any fraction is above zero, zeros drawn at its bottom
    edge, labelled 0; else a linear one. A note names the kinds left out
    because they were zero throughout."""
    import numpy as np

    lines = ax.get_lines()
    ydata = [np.asarray(line.get_ydata(), dtype=np.float64) for line in lines]
    positive = [float(y) for ys in ydata for y in ys if y > 0]
    if never:
        note = textwrap.fill("zero at every step: " + ", ".join(never), 48)
        ax.set_title(note, loc="right", fontsize=7, color="#666666")
    if not positive:
        ax.set_yticks([])
        return
    floor = 10.0 ** (math.floor(math.log10(min(positive))) - 1)
    for line, ys in zip(lines, ydata, strict=True):
        line.set_ydata(np.where(ys > 0, ys, floor))
    ax.set_yscale("log")
    ax.set_ylim(floor / 1.5, min(1.5, max(positive) * 3))
    ax.axhline(floor, color="#bbbbbb", lw=0.6, zorder=0)
    ticks = [t for t in ax.get_yticks() if floor < t <= 1]
    ax.set_yticks([floor, *ticks], ["0", *(f"{t:g}" for t in ticks)])
    ax.grid(axis="y", color="#dddddd", lw=0.5)
