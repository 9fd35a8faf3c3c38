"""The clear error raised when the optional plotting dependencies are missing."""

from __future__ import annotations

import importlib

_EXTRA_PACKAGES = ("matplotlib", "pandas")


def require_plot_extra() -> None:
    """Raise an :class:`ImportError` with install advice if matplotlib or pandas
    cannot be imported."""
    for package in _EXTRA_PACKAGES:
        try:
            importlib.import_module(package)
        except ImportError as error:
            raise ImportError(
                f"unit_scaling.analysis needs {package}, which is not installed: "
                'install the plotting extra with pip install "torch-unit-scaling[plot]"'
            ) from error
