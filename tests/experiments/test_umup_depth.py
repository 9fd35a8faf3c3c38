"""The bookkeeping of ``experiments/umup_depth.py`` on made-up run caches (which
runs it asks for, how a sweep widens, what the page says), and one real, tiny
training run of the shape-level trainer it shares with ``umup_defaults.py``."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import astuple
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest


@pytest.fixture
def depth(load_experiment: Callable[[str], ModuleType]) -> ModuleType:
    return load_experiment("umup_depth")


def _run(loss: float) -> dict[str, Any]:
    return {"loss": loss, "seconds": 60.0, "val_loss": [loss], "eval_steps": [1]}


def _store_curve(
    depth: ModuleType, runs: dict[str, Any], probe: Any, curve: dict[int, float]
) -> None:
    """Both seeds at every lr of ``curve`` (seed 1 a little worse)."""
    for x, value in curve.items():
        for seed in depth.SEEDS:
            runs[depth.Run(probe, 64, x, seed).key] = _run(value + 0.01 * seed)


def test_a_fresh_cache_asks_for_every_shape_lr_and_seed(depth: ModuleType) -> None:
    todo = depth.needed({}, [64])
    assert len(todo) == len(depth.PROBES) * len(depth.GRID) * len(depth.SEEDS)
    assert len({r.key for r in todo}) == len(todo)
    assert {r.log2_lr for r in todo} == set(depth.GRID)
    assert (
        todo[0].probe.shape.layers * todo[0].probe.shape.steps
        >= max(p.shape.layers * p.shape.steps for p in depth.PROBES) / 2
    )  # the long runs first
    assert {(p.base, p.layers) for p in depth.PROBES} >= {("A", 2), ("A", 16), ("C", 8)}


def test_the_configurations_own_shapes_share_umup_defaults_keys(
    depth: ModuleType, load_experiment: Callable[[str], ModuleType]
) -> None:
    ud = load_experiment("umup_defaults")
    own = depth.Run(depth.Probe("C", 8), 64, 1, 0)
    assert own.key == ud.Task("C", "u-μP", 64, 1.0, 0).key
    # (two loads of umup_defaults: compare the fields, not the classes)
    assert astuple(own.probe.shape) == astuple(ud.CONFIGS["C"])
    other = depth.Run(depth.Probe("C", 2), 64, 1, 0)
    assert other.key != own.key and "@2layers" in other.key
    assert other.probe.shape.seq_len == ud.CONFIGS["C"].seq_len
    assert other.probe.shape.layers == 2
    short = depth.Run(depth.Probe("C", 8, steps=200), 64, 1, 0)
    assert short.key not in (own.key, other.key) and "@200steps" in short.key
    assert short.probe.shape.steps == 200 and not short.probe.itself
    assert short.probe.shape.batch_size == ud.CONFIGS["C"].batch_size
    assert "200 steps), 8 layers" in short.probe.label
    assert "itself" not in short.probe.label and "C itself" in own.probe.label
    # its own length spelt out is still C itself
    assert depth.Run(depth.Probe("C", 8, steps=500), 64, 1, 0).key == own.key
    # so a run stored by umup_defaults is not asked for again
    runs = {own.key: _run(1.5)}
    assert own.key not in {r.key for r in depth.needed(runs, [64])}


def test_a_sweep_widens_while_its_optimum_is_at_an_edge(depth: ModuleType) -> None:
    probe = depth.Probe("A", 16)
    runs: dict[str, Any] = {}
    _store_curve(depth, runs, probe, {-1: 2.4, 0: 2.3, 1: 2.2, 2: 2.1})
    grid = depth.sweep(runs, probe, 64)
    assert sorted(grid) == [-1, 0, 1, 2, 3] and grid[3] is None
    assert depth.best_lr(runs, probe, 64) is None
    assert {
        (r.log2_lr, r.seed) for r in depth.needed(runs, [64]) if r.probe == probe
    } == {
        (3, 0),
        (3, 1),
    }
    _store_curve(depth, runs, probe, {3: 2.0, 4: 1.9})  # still at the edge: the cap
    assert sorted(depth.sweep(runs, probe, 64)) == [-1, 0, 1, 2, 3, 4]
    assert depth.best_lr(runs, probe, 64) == 4
    # one seed missing: that lr's mean is unknown, not the other seed's value
    del runs[depth.Run(probe, 64, 0, 1).key]
    assert depth.sweep(runs, probe, 64)[0] is None


def test_the_page_names_each_optimum_and_the_depth_rules_lr(
    depth: ModuleType, tmp_path: Path
) -> None:
    runs: dict[str, Any] = {}
    for probe in depth.PROBES:  # deeper A and C itself prefer 2^1
        best = 1 if probe.layers >= 8 else 0
        curve = {x: 2.0 + 0.1 * abs(x - best) for x in depth.GRID}
        _store_curve(depth, runs, probe, curve)
    depth.report(runs, tmp_path, [64], None)
    page = (tmp_path / "umup_depth.md").read_text()
    assert "Every sweep is finished" in page
    notes = depth.findings(runs, 64)
    deep = next(n for n in notes if "16 layers" in n)
    assert "best lr 2^1" in deep and "0.100 better than at the recommended 2^0" in deep
    assert "2^-1 after the depth rule" in deep  # 1 - log2(16)/2
    shallow = next(n for n in notes if "A's shape" in n and "2 layers" in n)
    assert "best lr 2^0" in shallow and "better than" not in shallow
    assert "**2.005**" in page  # the mean of 2.00 and 2.01, the best in bold
    assert (tmp_path / "umup_depth_64.png").stat().st_size > 10_000


def test_the_shape_trainer_runs_both_sides_and_repeats_itself(
    load_experiment: Callable[[str], ModuleType],
) -> None:
    ud = load_experiment("umup_defaults")
    tiny = ud.Shape(layers=1, seq_len=16, batch_size=2, steps=4)
    first = ud.train_shape(tiny, "u-μP", 32, 0.0, seed=0)
    assert math.isfinite(first["loss"]) and first["eval_steps"][-1] == 4
    assert ud.train_shape(tiny, "u-μP", 32, 0.0, seed=0)["loss"] == first["loss"]
    assert ud.train_shape(tiny, "u-μP", 32, 0.0, seed=1)["loss"] != first["loss"]
    assert math.isfinite(ud.train_shape(tiny, "SP", 32, -9.0, seed=0)["loss"])


def test_the_summary_says_which_difference_moves_the_optimum(
    depth: ModuleType,
) -> None:
    def page_for(best_of: Callable[[Any], float]) -> str:
        runs: dict[str, Any] = {}
        for probe in depth.PROBES:
            best = best_of(probe)
            grid = range(depth.GRID[0], depth.GRID[-1] + 2)  # 2^2 inside it too
            _store_curve(
                depth, runs, probe, {x: 2.0 + 0.1 * abs(x - best) for x in grid}
            )
        return str(depth.summary(runs, 64))

    # only C itself prefers 2^1: an interaction, the rule absent on C's shape
    text = page_for(lambda p: 1 if p.itself and p.base == "C" else 0)
    assert "**Depth alone** does not move the optimum" in text
    assert "2^0/2^0/2^0/2^0" in text and "**Both** (C itself, 8 layers): 2^1" in text
    assert "together they do" in text and "as if the rule were not there" in text
    assert "at 8 layers for 200 steps** (its 32×128 tokens a step" in text
    # 2^1 − 2^0 is +0.1 for A at 8 layers and for C at 200 steps, −0.1 at 500
    assert "A's shape at 8 layers +0.100 (+0.100, +0.100)" in text
    assert "C's at 200 steps +0.100" in text and "C's at 500 steps -0.100" in text
    assert "the tokens a step account for 0.000 and the length for 0.200" in text
    assert "mostly the number of steps moves it" in text
    # trained for 200 steps it still prefers 2^1: the tokens a step move it
    text = page_for(lambda p: 1 if p.base == "C" and p.layers == 8 else 0)
    assert "best 2^1. Loss at 2^1 minus loss at 2^0" in text
    assert "mostly the tokens in each step move it" in text
    # a tie between 2^0 and 2^1 at 200 steps: half the change each
    text = page_for(lambda p: 0.5 if p.steps else int(p.itself and p.base == "C"))
    assert "account for 0.100 and the length for 0.100: both move it" in text
    # nothing to separate where A at 8 layers and C agree
    text = page_for(lambda p: 0)
    assert "2^0 at both ends: nothing to separate" in text
    # the deep A shapes move too: depth alone does it
    text = page_for(lambda p: 1 if p.layers >= 8 else 0)
    assert "**Depth alone** moves the optimum" in text and "2^0/2^0/2^1/2^1" in text
    assert "together they do" not in text
    assert depth.summary({}, 64) == ""  # nothing to say before the sweeps finish
