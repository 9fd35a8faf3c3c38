"""The long table of scales a training run records (``unit_scaling.monitor``):
its columns, its kinds of tensor, and the check that a table has them.

pandas and numpy are imported when a function runs, after
``require_plot_extra()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..monitor import COLUMNS, KINDS

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd  # type: ignore[import-untyped,unused-ignore]

__all__ = ["COLUMNS", "KINDS", "KIND_TITLES", "checked_table", "kinds_in", "log2"]


KIND_TITLES = {
    "activation": "activations",
    "activation_grad": "activation gradients",
    "weight": "weights",
    "weight_grad": "weight gradients",
    "update": "updates",
}

_TYPES = {"step": "int64", "tensor": str, "kind": str, "statistic": str}


def checked_table(table: object, caller: str) -> pd.DataFrame:
    """``table`` with the :data:`COLUMNS` in their types (other columns kept).

    Raises:
        TypeError: ``table`` is not a DataFrame.
        ValueError: a column is missing, or a step or value is not a number.
    """
    import pandas as pd

    if not isinstance(table, pd.DataFrame):
        raise TypeError(
            f"{caller}: expected a pandas DataFrame of scales (from read_scales or "
            f"unit_scaling.monitor), got {type(table).__name__}"
        )
    missing = [column for column in COLUMNS if column not in table.columns]
    if missing:
        raise ValueError(
            f"{caller}: the table lacks the column(s) {missing}; expected the long "
            f"table of unit_scaling.monitor, with columns {list(COLUMNS)} (one "
            "row per step, tensor, kind and statistic)"
        )
    try:
        return table.astype(
            {**_TYPES, "value": "float64"}  # a missing value reads as NaN
        )
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"{caller}: the table's steps must be integers and its values numbers: "
            f"{error}"
        ) from error


def kinds_in(table: pd.DataFrame) -> list[str]:
    """The kinds present in ``table``: those of :data:`KINDS` in their order,
    then any others in order of appearance."""
    import pandas as pd

    present = list(pd.unique(table["kind"]))
    return [k for k in KINDS if k in present] + [k for k in present if k not in KINDS]


def log2(scales: object) -> np.ndarray:
    """``log2`` of non-negative scales, as a heatmap cell reads it: a zero is
    ``-inf`` and a non-finite scale (``inf`` or NaN) is ``+inf``, leaving NaN to
    mean "no such tensor"."""
    import numpy as np

    values = np.asarray(scales, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.log2(np.where(np.isfinite(values), values, np.inf))
    return np.where(values < 0, np.inf, logs)
