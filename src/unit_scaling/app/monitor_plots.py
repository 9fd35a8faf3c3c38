"""``unit-scaling monitor-plots``: what a training run's scale monitor recorded,
as pictures.

Reads the table ``unit_scaling.monitor`` saved (CSV or Parquet) or the
TensorBoard log directory it wrote, and draws, in the output folder,
``scales_<kind>.png``: a heatmap of each tensor's log₂ RMS over the steps, one
per kind of tensor, and ``fp8_fractions.png``: the fractions of elements FP8
E4M3 and E5M2 would saturate or flush.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..analysis._scales_table import KINDS

__all__ = ["add_arguments", "run"]

_FORMATS = ("e4m3", "e5m2")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``monitor-plots`` to ``parser``."""
    parser.add_argument(
        "source",
        type=Path,
        help="a .csv or .parquet table saved by unit_scaling.monitor, or a "
        "TensorBoard log directory it wrote",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("out/monitor"),
        help="output folder (default: %(default)s)",
    )
    parser.add_argument(
        "--kind",
        nargs="+",
        choices=[*KINDS, "all"],
        help="the kinds of tensor to draw a heatmap of, 'all' for one figure "
        "with a panel per kind (default: a figure per kind recorded)",
    )


def run(args: argparse.Namespace) -> list[Path]:
    """Draw the plots of ``args.source`` into ``args.out``; return the files
    written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..analysis import (
        plot_fp8_fractions_over_training,
        plot_scales_over_training,
        read_scales,
    )

    try:
        table = read_scales(args.source)
    except ImportError as error:  # a reader not installed: advice, not a traceback
        raise ValueError(str(error)) from error
    recorded = set(table["statistic"])
    with_rms = table[table["statistic"] == "rms"]
    kinds = args.kind or [k for k in KINDS if k in set(with_rms["kind"])]
    title = args.source.name
    args.out.mkdir(parents=True, exist_ok=True)
    written = []
    for kind in kinds:
        path = args.out / f"scales_{kind}.png"
        plt.close(plot_scales_over_training(table, kind, path, title=title))
        written.append(path)
    if all(f"{f}_saturated" in recorded for f in _FORMATS):
        path = args.out / "fp8_fractions.png"
        plt.close(plot_fp8_fractions_over_training(table, path, _FORMATS, title=title))
        written.append(path)
    else:
        print(
            "the table has no FP8 fractions (e4m3_saturated, ...): no fp8_fractions.png"
        )
    return written
