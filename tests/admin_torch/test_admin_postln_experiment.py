"""The Admin Post-LN experiment (experiments/admin_postln.py) runs end to end."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).parents[2] / "experiments" / "admin_postln.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("admin_postln", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_experiment_runs_on_tiny_settings(tmp_path: Path) -> None:
    experiment = _load()
    tiny = "--layers 2 --width 16 --heads 2 --seq-len 16 --batch-size 4 --steps 4"
    more = "--eval-every 2 --eval-batches 1 --max-bytes 65536"
    results = experiment.main(
        [*tiny.split(), *more.split(), "--out-dir", str(tmp_path)]
    )
    assert [r.variant for r in results] == list(experiment.VARIANTS)
    for r in results:
        assert len(r.train_losses) == 4 and r.val_steps == [2, 4]
        assert math.isfinite(r.final_train) and math.isfinite(r.final_val)
    post_ln, closed_form, profiled, pre_ln = results
    assert post_ln.omegas == pre_ln.omegas == [1.0] * 4
    assert closed_form.omegas == pytest.approx([math.sqrt(5 / math.log(5) - 1)] * 4)
    assert profiled.omegas == sorted(profiled.omegas)  # variance accumulates
    assert (tmp_path / "admin_postln.png").stat().st_size > 0
    table = (tmp_path / "admin_postln.md").read_text()
    assert all(variant in table for variant in experiment.VARIANTS)


@pytest.mark.slow
def test_admin_trains_where_post_ln_stalls(tmp_path: Path) -> None:
    """The documented finding, on fewer steps: 12 layers, Adam lr 1e-3, no warmup."""
    results = _load().main(["--steps", "150", "--out-dir", str(tmp_path)])
    final = {r.variant: r.final_train for r in results}
    assert final["Post-LN + Admin (closed form)"] < final["Post-LN"] - 0.3
    assert final["Post-LN + Admin (profiled)"] < final["Post-LN"] - 0.3
