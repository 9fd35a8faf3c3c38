"""``experiments/umup_search.py`` runs end to end on its ``--quick`` settings,
and a second invocation reads every run back instead of training it again.

The script lives outside the package; it is loaded from its file (as in
``test_experiments_smoke.py``) and its ``main(argv)`` run into a temporary folder.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from types import ModuleType


def _stored(runs: Path) -> dict[Path, int]:
    return {path: path.stat().st_mtime_ns for path in runs.glob("*/runs/*.json")}


def test_quick_run_writes_page_and_plots_and_resumes(
    tmp_path: Path, load_experiment: Callable[[str], ModuleType]
) -> None:
    experiment = load_experiment("umup_search")
    argv = ["--quick", "--jobs", "1", "--out", str(tmp_path)]
    results = experiment.main(argv)
    config = results.config
    assert config.widths == (16, 32) and config.search_width == 16
    tuned, sp = experiment.SIDES[1], experiment.SIDES[0]
    # (a) the search, at the proxy width
    assert set(results.search.multiplier_sweeps) == {"mhsa_mult", "loss_mult"}
    # (b, c) an lr sweep per width and side
    for side, grid in ((tuned, config.umup_lrs), (sp, config.sp_lrs)):
        assert set(results.lr_sweeps[side]) == {16, 32}
        assert all(
            list(sweep) == list(grid) for sweep in results.lr_sweeps[side].values()
        )
    # (d) the seeds, at each side's point; u-μP's is the search's at every width
    for side in experiment.SIDES:
        for width in config.widths:
            runs = results.seeds[side][width]
            assert [run.point.seed for run in runs] == [0, 1]
            assert all(math.isfinite(run.loss) for run in runs)
    assert {run.point.log2_multipliers for run in results.seeds[tuned][32]} == {
        results.search.best.point.log2_multipliers
    }
    for name in ("umup_search.png", "umup_search_proxy.png"):
        assert (tmp_path / name).stat().st_size > 10_000
    page = (tmp_path / "umup_search.md").read_text()
    assert "**Target met**" in page or "**Target not met" in page
    assert "## What the search found" in page and "| mhsa_mult |" in page
    assert "![u-μP tuned on a proxy against SP](umup_search.png)" in page
    runs = tmp_path / "umup_search_runs"
    stored = _stored(runs)
    assert len(stored) > 20
    again = experiment.main(argv)
    assert _stored(runs) == stored  # nothing trained, nothing rewritten
    assert again.search.best_config() == results.search.best_config()
