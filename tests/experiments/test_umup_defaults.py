"""The bookkeeping of ``experiments/umup_defaults.py`` on made-up run caches:
which runs it asks for, how SP's sweep widens, and the verdicts it writes."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest


@pytest.fixture
def ud(load_experiment: Callable[[str], ModuleType]) -> ModuleType:
    return load_experiment("umup_defaults")


def _run(loss: float, seconds: float = 10.0) -> dict[str, Any]:
    return {"loss": loss, "seconds": seconds, "val_loss": [loss], "eval_steps": [1]}


def _store(ud: ModuleType, runs: dict[str, Any], task: Any, loss: float) -> None:
    runs[task.key] = _run(loss)


def test_a_fresh_cache_asks_for_seeds_lr_checks_and_sps_first_grid(
    ud: ModuleType,
) -> None:
    tasks = ud.needed({}, ["B"], [64, 256])
    keys = {t.key for t in tasks}
    umup = [t for t in tasks if t.side == "u-μP"]
    # 3 seeds at each width, and lr x1/2 and x2 at the narrowest only
    assert len(umup) == 3 * 2 + 2
    assert {t.log2_lr for t in umup if t.width == 64} == {-1.0, 0.0, 1.0}
    sp = [t for t in tasks if t.side == "SP"]
    assert {(t.width, t.log2_lr) for t in sp} == {
        (64, -10), (64, -9), (64, -8), (256, -11), (256, -10), (256, -9),
    }  # fmt: skip
    assert all(t.seed == 0 for t in sp)  # SP's other seeds wait for its best lr
    assert len(keys) == len(tasks)
    assert tasks[0].width == 256  # the longest first
    # the key names the multipliers the u-μP runs trained with
    assert "residual_mult=0.5" in umup[0].key and "loss_mult=4" in umup[0].key


def test_sps_sweep_widens_while_its_optimum_is_at_an_edge(ud: ModuleType) -> None:
    runs: dict[str, Any] = {}
    for x, loss in ((-10, 1.9), (-9, 2.0), (-8, 2.1)):  # best at the low edge
        _store(ud, runs, ud.Task("B", "SP", 64, x, 0), loss)
    grid = ud.sp_sweep(runs, "B", 64)
    assert sorted(grid) == [-11, -10, -9, -8] and grid[-11] is None
    assert ud.sp_best(runs, "B", 64) is None
    _store(ud, runs, ud.Task("B", "SP", 64, -11, 0), 1.95)  # now bracketed
    assert ud.sp_best(runs, "B", 64) == -10
    seeds = [t for t in ud.needed(runs, ["B"], [64]) if t.side == "SP"]
    assert {(t.log2_lr, t.seed) for t in seeds} == {(-10, 1), (-10, 2)}


def test_a_diverged_run_is_the_worst_point_of_the_sweep(ud: ModuleType) -> None:
    runs: dict[str, Any] = {}
    for x, loss in ((-10, 2.0), (-9, 1.9), (-8, float("nan"))):
        _store(ud, runs, ud.Task("A", "SP", 64, x, 0), loss)
    assert ud.sp_best(runs, "A", 64) == -9


def _complete(ud: ModuleType, umup: dict[int, float], sp: dict[int, float]) -> Any:
    """A cache in which every width has its 3 seeds on both sides."""
    runs: dict[str, Any] = {}
    for width in ud.WIDTHS:
        guess = ud.SP_GUESS[width]
        for x, bump in ((guess - 1, 0.1), (guess, 0.0), (guess + 1, 0.1)):
            _store(ud, runs, ud.Task("C", "SP", width, x, 0), sp[width] + bump)
        for seed, jitter in zip(ud.SEEDS, (-0.01, 0.0, 0.01), strict=True):
            if seed:
                _store(ud, runs, ud.Task("C", "SP", width, guess, seed), sp[width])
            task = ud.Task("C", "u-μP", width, 0.0, seed)
            _store(ud, runs, task, umup[width] + jitter)
    return runs


def test_verdicts_of_a_complete_configuration(ud: ModuleType) -> None:
    widths = ud.WIDTHS
    good = _complete(
        ud,
        dict(zip(widths, (2.2, 2.1, 2.0, 1.9), strict=True)),
        dict.fromkeys(widths, 2.3),
    )
    gain, versus = ud.verdicts(good, "C")
    assert gain.startswith("met") and versus.startswith("met")
    flat = _complete(
        ud,
        dict(zip(widths, (2.2, 2.2, 2.2, 2.19), strict=True)),
        dict(zip(widths, (2.3,) * 3 + (2.1,), strict=True)),
    )
    gain, versus = ud.verdicts(flat, "C")
    assert gain.startswith("NOT met")  # a drop smaller than the seeds' spread
    assert versus.startswith("NOT met") and "512: +0.090" in versus
    assert ud.verdicts({}, "C")[0].startswith("not measured")


def test_an_unfinished_width_gives_its_early_signs(ud: ModuleType) -> None:
    runs = _complete(
        ud,
        dict(zip(ud.WIDTHS, (2.2, 2.1, 2.0, 1.9), strict=True)),
        dict.fromkeys(ud.WIDTHS, 2.3),
    )
    wide = [k for k in runs if "/512/" in k]
    for key in wide:
        del runs[key]
    _store(ud, runs, ud.Task("C", "u-μP", 512, 0.0, 0), 1.95)
    gain, versus = ud.verdicts(runs, "C")
    assert gain == (
        "not measured yet; so far width 512 1.950 (1 seed(s)) against width 64 2.200"
    )
    assert versus.startswith("met at the widths measured")
    assert "early sign" not in versus  # no SP run at width 512 yet
    # SP's unfinished sweep: one lr behind u-μP on seed 0, one ahead
    _store(ud, runs, ud.Task("C", "SP", 512, -10, 0), 1.97)
    assert "early sign" not in ud.verdicts(runs, "C")[1]
    _store(ud, runs, ud.Task("C", "SP", 512, -11, 0), 1.93)
    _store(ud, runs, ud.Task("C", "SP", 512, -12, 1), 1.0)  # no u-μP seed 1: unused
    versus = ud.verdicts(runs, "C")[1]
    assert versus.endswith(
        "; early sign against it: at width 512, seed 0, SP at 2^-11 (1.930) is "
        "already below u-μP (1.950)"
    )


def test_the_page_says_what_is_missing(ud: ModuleType, tmp_path: Path) -> None:
    runs = _complete(
        ud,
        dict(zip(ud.WIDTHS, (2.2, 2.1, 2.0, 1.9), strict=True)),
        dict.fromkeys(ud.WIDTHS, 2.3),
    )
    ud.report(runs, tmp_path, None)
    page = (tmp_path / "umup_defaults.md").read_text()
    assert "## C:" in page and "(a) u-μP better at width 512 than at 64: met" in page
    assert "not run" in page  # A and B have no runs
    count, minutes = ud.remaining(runs)
    assert count > 0 and minutes > 0
    assert (tmp_path / "umup_defaults.png").stat().st_size > 10_000


def test_lr_check_compares_each_lr_on_the_seeds_it_shares(ud: ModuleType) -> None:
    lr = math.log2(ud.uu.RECOMMENDED.lr)
    runs = {
        ud.Task("C", "u-μP", 64, lr + d, 0).key: {"loss": v}
        for d, v in ((-1, 1.74), (0, 1.65), (1, 1.59))
    }
    for seed, (at, above) in enumerate(((1.40, 1.38), (1.41, 1.37), (1.40, None))):
        runs[ud.Task("C", "u-μP", 256, lr, seed).key] = {"loss": at}
        if above is not None:
            runs[ud.Task("C", "u-μP", 256, lr + 1, seed).key] = {"loss": above}
    runs[ud.Task("C", "u-μP", 256, lr + 2, 0).key] = {"loss": 1.39}  # one seed
    text = ud.lr_check(runs, "C")
    # every lr stored is a column, one step either side always
    assert "| lr 2^-1 | lr 2^0 | lr 2^1 | lr 2^2 |" in text
    assert (
        "| width 64 (seed 0) | 1.740 (+0.090) | 1.650 | 1.590 (-0.060) | not run |"
    ) in text
    # the recommended lr over its seeds; each other over those it shares with it,
    # and the difference on those seeds (1.40 at seed 0, 1.405 over seeds 0, 1)
    assert (
        "| width 256 (seeds 0, 1, 2) | not run | 1.403 | 1.375 (-0.030, seeds 0, 1) "
        "| 1.390 (-0.010, seed 0) |"
    ) in text
    assert (
        "At width 256 lr 2^1 beats the recommended 2^0 by 0.030 (seeds 0, 1)." in text
    )
    assert (
        "At width 64 lr 2^1 beats the recommended 2^0 by 0.060 (seed 0; nothing" in text
    )
    # widths with only the recommended lr stored are not rows
    assert "width 128" not in text and "width 512" not in text
    assert "not run | not run | not run" in ud.lr_check({}, "B")
    # no lr better than the recommended one: no note
    worse = dict(runs)
    for width, d, seed in itertools.product((64, 256), (-1, 1, 2), range(3)):
        key = ud.Task("C", "u-μP", width, lr + d, seed).key
        if key in worse:
            worse[key] = {"loss": worse[key]["loss"] + 1}
    assert "beats" not in ud.lr_check(worse, "C")
