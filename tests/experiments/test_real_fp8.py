"""``experiments/real_fp8.py`` runs end to end on its ``--quick`` settings.

The script lives outside the package; it is loaded from its file (as in
``test_experiments_smoke.py``) and its ``main(argv)`` run into a temporary folder.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

EXPERIMENTS = Path(__file__).parents[2] / "experiments"


def _load(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(EXPERIMENTS))  # the script imports _common
    spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # dataclasses look it up by name
    spec.loader.exec_module(module)
    return module


def test_quick_run_writes_page_and_plot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    experiment = _load("real_fp8", monkeypatch)
    runs = experiment.main(["--quick", "--jobs", "1", "--out", str(tmp_path)])
    assert list(runs) == ["FP32", "simulated FP8", "real FP8"]
    for run in runs.values():
        history = run.history
        assert len(history.train_loss) == 4 and history.eval_steps == [0, 2, 4]
        assert math.isfinite(history.final_validation)
    # Every linear layer of the quick model has sizes that are multiples of 16.
    real = runs["real FP8"]
    assert len(real.fp8_layers) == 6 and real.kept_layers == []
    assert any(name.startswith("projection") for name in real.fp8_layers)
    assert (tmp_path / "real_fp8.png").stat().st_size > 0
    page = (tmp_path / "real_fp8.md").read_text()
    for name in runs:
        assert f"| {name} |" in page
    assert "| real FP8 vs simulated FP8 |" in page and "| real FP8 vs FP32 |" in page
    assert "![loss curves](real_fp8.png)" in page
    assert "attention" in page


def test_the_runs_share_their_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Same seed, same weights: the three models start from one function."""
    experiment = _load("real_fp8", monkeypatch)
    config = experiment.Config(quick=True)
    assert config.width == 32 and config.steps == 4
    models = [experiment.make_model(config, p)[0] for p in experiment.PRECISIONS]
    weights = [dict(m.named_parameters()) for m in models]
    for other in weights[1:]:
        assert other.keys() == weights[0].keys()
        assert all((other[k] == v).all() for k, v in weights[0].items())


def test_layers_not_multiple_of_16_are_listed_as_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    experiment = _load("real_fp8", monkeypatch)
    config = experiment.Config(width=24, layers=1, heads=1)
    _, run = experiment.make_model(config, "real FP8")
    assert run.kept_layers and run.warnings
    assert all("24" in name for name in run.kept_layers)
