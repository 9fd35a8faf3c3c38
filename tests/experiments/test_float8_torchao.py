"""``experiments/float8_torchao.py`` runs end to end in its ``--quick`` mode.

The script is loaded from its file (the ``load_experiment`` fixture of
``conftest.py``) and its ``main(argv)`` run into a temporary folder: four tiny
training runs (our FP8 on u-μP, torchao's FP8 on SP, both in FP32), the page and
the plot.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
from torch import nn

RUNS = (
    "u-μP FP8 (unit_scaling.float8)",
    "SP FP8 (torchao.float8)",
    "u-μP FP32",
    "SP FP32",
)


def test_quick_run_writes_page_and_plot_of_the_four_runs(
    tmp_path: Path, load_experiment: Callable[[str], ModuleType]
) -> None:
    pytest.importorskip("torchao.float8")
    experiment = load_experiment("float8_torchao")
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
    load_experiment: Callable[[str], ModuleType],
) -> None:
    experiment = load_experiment("float8_torchao")
    assert experiment.torchao_filter(nn.Linear(32, 48), "a")
    assert not experiment.torchao_filter(nn.Linear(32, 50), "b")
    assert not experiment.torchao_filter(nn.Embedding(16, 16), "c")
