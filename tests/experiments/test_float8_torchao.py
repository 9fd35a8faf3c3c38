"""``experiments/float8_torchao.py`` runs end to end in its ``--quick`` mode.

The script is loaded from its file, as ``test_experiments_smoke.py`` loads the
other experiments, and its ``main(argv)`` run into a temporary folder: four tiny
training runs (our FP8 on u-μP, torchao's FP8 on SP, both in FP32), the page and
the plot.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

EXPERIMENTS = Path(__file__).parents[2] / "experiments"
RUNS = (
    "u-μP FP8 (unit_scaling.float8)",
    "SP FP8 (torchao.float8)",
    "u-μP FP32",
    "SP FP32",
)


def _load(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(EXPERIMENTS))  # the scripts import _common
    spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # dataclasses look it up by name
    spec.loader.exec_module(module)
    return module


def test_quick_run_writes_page_and_plot_of_the_four_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torchao.float8")
    experiment = _load("float8_torchao", monkeypatch)
    runs = experiment.main(["--quick", "--jobs", "1", "--out", str(tmp_path)])

    assert tuple(runs) == RUNS
    for run in runs.values():
        curve = run.curve
        assert len(curve.train_loss) == 3 and curve.eval_steps == [0, 2, 3]
        assert math.isfinite(curve.final_val)
    # Each FP8 path converted every linear layer of the 1-layer decoder (sizes
    # are multiples of 16), and the FP32 runs converted none.
    ours, theirs = runs[RUNS[0]], runs[RUNS[1]]
    assert len(ours.fp8_layers) == len(theirs.fp8_layers) == 6
    assert not ours.kept_layers and not theirs.kept_layers
    assert "projection (32 → 256)" in theirs.fp8_layers
    assert not runs["u-μP FP32"].fp8_layers and not runs["SP FP32"].fp8_layers

    assert (tmp_path / "float8_torchao.png").stat().st_size > 0
    page = (tmp_path / "float8_torchao.md").read_text()
    assert "![loss curves](float8_torchao.png)" in page
    for name in RUNS:
        assert f"| {name} |" in page  # a row of the results table
    assert "layers.0.mhsa.linear_qkv (32 → 96)" in page  # ours, converted
    assert "layers.0.linear_qkv (32 → 96)" in page  # torchao's, converted
    assert "python experiments/float8_torchao.py --quick" in page  # how it ran


def test_torchao_filter_takes_multiples_of_16(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torch import nn

    experiment = _load("float8_torchao", monkeypatch)
    assert experiment.torchao_filter(nn.Linear(32, 48), "a")
    assert not experiment.torchao_filter(nn.Linear(32, 50), "b")
    assert not experiment.torchao_filter(nn.Embedding(16, 16), "c")
