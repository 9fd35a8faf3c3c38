"""Scales during training: :class:`Monitor` records, every ``every`` steps, the
scale statistics of a model's activations, gradients, weights and updates, warns
when one drifts from where low precision can hold it, and stops with the name of
the module where an ``inf`` or NaN started.

Records go to a tidy table (:meth:`Monitor.table`), to any logger (TensorBoard:
:class:`unit_scaling.integrations.tensorboard.TensorBoardLogger`; Hugging Face
``Trainer``: :class:`unit_scaling.integrations.hf.MonitorCallback`), and to the
plots of :mod:`unit_scaling.analysis.training_scales`.
"""

from ._alerts import AlertPolicy, ScaleAlertError
from ._guard import NonFiniteError, first_nonfinite_module
from ._monitor import COLUMNS, KINDS, Monitor, ScaleLogger
from ._statistics import FORMATS, STATISTICS, tensor_statistics

__all__ = [
    "COLUMNS",
    "FORMATS",
    "KINDS",
    "STATISTICS",
    "AlertPolicy",
    "Monitor",
    "NonFiniteError",
    "ScaleAlertError",
    "ScaleLogger",
    "first_nonfinite_module",
    "tensor_statistics",
]
