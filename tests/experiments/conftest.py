"""Loading the experiment scripts, which live outside the package."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

EXPERIMENTS = Path(__file__).parents[2] / "experiments"


@pytest.fixture
def load_experiment(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], ModuleType]:
    """``load_experiment(name)``: ``experiments/<name>.py`` as a module (the
    scripts import ``_common`` from their folder; dataclasses look their module
    up by name, so it is registered for the test's duration)."""

    def load(name: str) -> ModuleType:
        monkeypatch.syspath_prepend(str(EXPERIMENTS))
        spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, name, module)
        spec.loader.exec_module(module)
        return module

    return load
