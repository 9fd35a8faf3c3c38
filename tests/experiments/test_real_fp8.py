"""``experiments/real_fp8.py`` runs end to end on its ``--quick`` settings.

The script lives outside the package; it is loaded from its file (as in
``test_experiments_smoke.py``) and its ``main(argv)`` run into a temporary folder.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from types import ModuleType


def test_quick_run_writes_page_and_plot(
    tmp_path: Path, load_experiment: Callable[[str], ModuleType]
) -> None:
    experiment = load_experiment("real_fp8")
    runs = experiment.main(["--quick", "--jobs", "1", "--out", str(tmp_path)])
    assert list(runs) == ["FP32", "simulated FP8", "real FP8", "real FP8 + attention"]
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
    assert "| real FP8 + attention vs simulated FP8 (for reference) |" in page
    assert "![loss curves](real_fp8.png)" in page
    assert "attention" in page


def test_the_runs_share_their_start(
    load_experiment: Callable[[str], ModuleType],
) -> None:
    """Same seed, same weights: the models start from one function."""
    experiment = load_experiment("real_fp8")
    config = experiment.Config(quick=True)
    assert config.width == 32 and config.steps == 4
    models = [experiment.make_model(config, p)[0] for p in experiment.PRECISIONS]
    weights = [dict(m.named_parameters()) for m in models]
    for other in weights[1:]:
        assert other.keys() == weights[0].keys()
        assert all((other[k] == v).all() for k, v in weights[0].items())


def test_layers_not_multiple_of_16_are_listed_as_kept(
    load_experiment: Callable[[str], ModuleType],
) -> None:
    experiment = load_experiment("real_fp8")
    config = experiment.Config(width=24, layers=1, heads=1)
    _, run = experiment.make_model(config, "real FP8")
    assert run.kept_layers and run.warnings
    assert all("24" in name for name in run.kept_layers)
