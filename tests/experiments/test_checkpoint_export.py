"""``experiments/checkpoint_export.py`` runs end to end on its ``--quick`` settings:
checkpoint, resume, export, and the export loaded where ``unit_scaling`` is not."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("transformers")


def test_quick_run_meets_both_targets(
    tmp_path: Path, load_experiment: Callable[[str], ModuleType]
) -> None:
    experiment = load_experiment("checkpoint_export")
    outcome = experiment.main(["--quick", "--out", str(tmp_path)])
    assert outcome["resume_gap"] <= experiment.RESUME_TARGET
    plain = outcome["plain"]
    assert plain["class"] == "LlamaForCausalLM"
    assert not plain["unit_scaling_importable"]
    assert plain["validation_loss"] == pytest.approx(
        outcome["trained_loss"], rel=experiment.EXPORT_TARGET
    )
    assert plain["text"].startswith(experiment.PROMPT)
    assert not outcome["config_mentions_unit_scaling"]
    page = (tmp_path / "checkpoint_export.md").read_text()
    assert "both targets met" in page and "```text" in page
