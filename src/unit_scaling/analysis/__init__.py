"""See where numerics go wrong: scale plots, data frames and coordinate checks.

Plots and data frames need the ``plot`` extra (matplotlib and pandas)::

    pip install "torch-unit-scaling[plot]"

The package imports without it (matplotlib and pandas are imported when a
plot or a table is made): :func:`scales_graph`, :func:`example_batch` and
:func:`language_model_loss` need only torch, and a function that needs the
extra raises an ``ImportError`` that says how to install it.

Example::

    >>> from unit_scaling.analysis import visualiser
    >>> ax = visualiser(uu.TransformerDecoder(64, 256, layers=2, heads=4))
    >>> ax.figure.savefig("scales.png")
"""

from .coord_check import coord_check, coord_check_spread, plot_coord_check
from .dataframe import graph_to_dataframe
from .layer_heatmap import LayerPath, parse_layer_path, plot_layer_heatmap
from .optimizer import format_optimizer_report, optimizer_report
from .plot import plot
from .training_scales import (
    plot_fp8_fractions_over_training,
    plot_scales_over_training,
    read_scales,
)
from .visualiser import example_batch, language_model_loss, scales_graph, visualiser

__all__ = [
    "LayerPath",
    "coord_check",
    "coord_check_spread",
    "example_batch",
    "format_optimizer_report",
    "graph_to_dataframe",
    "language_model_loss",
    "optimizer_report",
    "parse_layer_path",
    "plot",
    "plot_coord_check",
    "plot_fp8_fractions_over_training",
    "plot_layer_heatmap",
    "plot_scales_over_training",
    "read_scales",
    "scales_graph",
    "visualiser",
]
