"""See where numerics go wrong: scale plots, data frames and coordinate checks.

Needs the ``plot`` extra (matplotlib and pandas)::

    pip install "torch-unit-scaling[plot]"

Example::

    >>> from unit_scaling.analysis import visualiser
    >>> ax = visualiser(uu.TransformerDecoder(64, 256, layers=2, heads=4))
    >>> ax.figure.savefig("scales.png")
"""

from ._optional import require_plot_extra

require_plot_extra()

# Imported after the check so a missing extra fails with advice, not a traceback
# from deep inside a submodule.
from .coord_check import coord_check, coord_check_spread, plot_coord_check  # noqa: E402
from .dataframe import graph_to_dataframe  # noqa: E402
from .plot import plot  # noqa: E402
from .visualiser import example_batch, language_model_loss, scales_graph, visualiser  # noqa: E402

__all__ = [
    "coord_check",
    "coord_check_spread",
    "example_batch",
    "graph_to_dataframe",
    "language_model_loss",
    "plot",
    "plot_coord_check",
    "scales_graph",
    "visualiser",
]
