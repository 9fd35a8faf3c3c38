"""The FP8 and learning-rate-transfer experiments run end to end on tiny settings.

``experiments/fp8_training.py`` and ``experiments/lr_transfer.py`` are scripts
outside the package; each is loaded from its file and its ``main(argv)`` run with
settings small enough for seconds, writing into a temporary folder.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


def test_fp8_training_writes_figures_and_table(
    tmp_path: Path, load_experiment: Callable[[str], ModuleType]
) -> None:
    experiment = load_experiment("fp8_training")
    tiny = "--steps 3 --width 32 --layers 1 --batch-size 4 --seq-len 16"
    more = "--accumulate 2 --warmup 1 --eval-every 2 --val-batches 1 --sweep 1 2"
    runs = experiment.main(
        [*tiny.split(), *more.split(), "--jobs", "1", "--out", str(tmp_path)]
    )
    assert {"SP FP32", "SP FP8", "u-μP FP32", "u-μP FP8"} <= set(runs)
    for curve in runs.values():
        assert len(curve.train_loss) == 3 and curve.eval_steps == [0, 2, 3]
        assert math.isfinite(curve.final_val)
    for image in ("fp8_training.png", "fp8_underflow.png"):
        assert (tmp_path / image).stat().st_size > 0
    table = (tmp_path / "fp8_training.md").read_text()
    assert all(name in table for name in runs)
    assert "L0 attention q" in table  # the per-tensor evidence


def test_lr_transfer_writes_figure_and_table(
    tmp_path: Path, load_experiment: Callable[[str], ModuleType]
) -> None:
    experiment = load_experiment("lr_transfer")
    tiny = "--widths 32 64 --sp-lrs -9 -8 -7 --umup-lrs -4 -3 -2 --layers 1"
    more = "--batch-size 4 --seq-len 16 --steps 3 --warmup 1 --val-batches 1"
    losses = experiment.main(
        [*tiny.split(), *more.split(), "--jobs", "1", "--out", str(tmp_path)]
    )
    assert set(losses["SP"][64]) == {-9, -8, -7}
    assert set(losses["u-μP"][32]) == {-4, -3, -2}
    assert all(
        math.isfinite(v)
        for p in losses.values()
        for w in p.values()
        for v in w.values()
    )
    assert (tmp_path / "lr_transfer.png").stat().st_size > 0
    table = (tmp_path / "lr_transfer.md").read_text()
    assert "grid step" in table and "| 64 |" in table


def test_optimum_and_shift(load_experiment: Callable[[str], ModuleType]) -> None:
    experiment = load_experiment("lr_transfer")
    best, fitted = experiment.optimum({-3: 3.0, -2: 2.0, -1: 2.0, 0: math.nan})
    assert best in (-2, -1) and -2 <= fitted <= -1
    assert experiment.optimum({0: 1.0, 1: 2.0}) == (0, 0.0)  # at the edge: no fit
    losses = {"SP": {64: {-8: 2.0, -7: 1.0}, 512: {-8: 1.0, -7: 2.0}}}
    assert experiment.shift(losses, "SP") == (1, -1)


@pytest.mark.slow
def test_fp8_finding_on_default_settings(
    tmp_path: Path, load_experiment: Callable[[str], ModuleType]
) -> None:
    """The documented result (docs/results/fp8_training.md): ~10 min on 2 idle cores."""
    runs = load_experiment("fp8_training").main(["--out", str(tmp_path)])
    final = {name: curve.final_val for name, curve in runs.items()}
    assert final["u-μP FP8"] < 1.02 * final["u-μP FP32"]
    assert final["SP FP8"] > 1.2 * final["SP FP32"]
    assert final["SP FP8 + loss scale 2^12"] < 1.03 * final["SP FP32"]


def test_hf_transfer_fan_in_note_compares_optima(
    load_experiment: Callable[[str], ModuleType],
) -> None:
    experiment = load_experiment("hf_transfer")
    # Widths 64 and 512 re-run (each with its own optimum), 128 and 256 not yet.
    by_width = {
        64: {-2: 2.35, -1: 2.30, 0: 2.40},
        128: {},
        512: {-3: 2.25, -2: 2.20, -1: 2.21},
    }
    note = experiment.fan_in_note(by_width)
    assert "widths 64 / 512:" in note
    assert "before 2.285 (2^-1) / 2.257 (2^-2)" in note
    assert "now 2.300 (2^-1) / 2.200 (2^-2)" in note
    assert "change +0.015 / -0.057" in note
    assert "before -0.028, now -0.100" in note
    assert experiment.fan_in_note({32: {-1: 2.0}}) == ""  # no width in common


def test_hf_transfer_quick_run_resumes_from_its_cache(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    load_experiment: Callable[[str], ModuleType],
) -> None:
    pytest.importorskip("transformers")
    experiment = load_experiment("hf_transfer")  # (its folder is on the path)
    cache = tmp_path / "runs.json"
    argv = ["--quick", "--families", "llama", "--jobs", "1"]
    argv += ["--out", str(tmp_path), "--cache", str(cache)]
    results = experiment.main(argv)
    losses = results.fp32
    assert set(losses["llama"]["u-μP"][64]) == {-2, -1}
    assert all(
        math.isfinite(v)
        for p in losses["llama"].values()
        for w in p.values()
        for v in w.values()
    )
    # Then one FP8 run per width and parametrisation, at the FP32 optimum.
    assert {p: set(w) for p, w in results.fp8["llama"].items()} == {
        "SP": {32, 64},
        "u-μP": {32, 64},
    }
    assert all(
        math.isfinite(v) for w in results.fp8["llama"].values() for v in w.values()
    )
    keys = json.loads(cache.read_text())
    assert sum(k.endswith("/fp8") for k in keys) == 4 and len(keys) == 12
    assert (tmp_path / "hf_transfer.png").stat().st_size > 0
    page = (tmp_path / "hf_transfer.md").read_text()
    assert "grid step" in page
    assert "## Simulated FP8" in page and "| llama | u-μP | 64 | 2^" in page
    assert "**llama: target" in page
    # lr_transfer.py's page was run at other widths and steps: no comparison.
    assert "Not compared" in page
    # A second call finds every run in the cache and trains nothing.
    monkeypatch.setattr(experiment, "train_one", lambda args: pytest.fail("ran"))
    assert experiment.main(argv) == results
