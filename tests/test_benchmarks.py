"""The training-step benchmark runs, in one process and across fresh processes.

Timings are not asserted (they belong to ``make bench``); the table's shape and
the aggregation over processes are. The end-to-end runs start fresh processes
that train for a round: ``slow``, out of the default run.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).parents[1]


@pytest.mark.slow
def test_train_step_over_processes_reports_median_and_range() -> None:
    command = [sys.executable, "-m", "benchmarks.train_step", "--rounds", "1"]
    command += ["--no-compile", "--processes", "2"]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, check=True, timeout=600
    )
    lines = done.stdout.splitlines()
    assert "medians over 2 processes" in lines[0]
    assert "ratio range" in lines[1]
    ratio, low, high = _ratios(lines, "train step, eager")
    assert low <= ratio <= high
    # Both models ran the same work: the same order of time (one round, next to
    # another test worker, has measured 2.8x).
    assert 0.25 < ratio < 4
    # Peak memory does not depend on timing: it is the same in every process and
    # within its target.
    ratio, low, high = _ratios(lines, "peak memory")
    assert ratio == low == high
    assert 1 <= ratio <= 1.05
    assert not any(line.startswith("train step, compiled") for line in lines)


def _ratios(lines: list[str], label: str) -> tuple[float, float, float]:
    """``(ratio, lowest, highest)`` from the row starting with ``label``."""
    row = next(line for line in lines if line.startswith(label))
    found = re.search(r"(\d\.\d+)\s+(\d\.\d+)–(\d\.\d+)", row)
    assert found is not None, row
    ratio, low, high = map(float, found.groups())
    return ratio, low, high


def test_train_step_rejects_no_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import train_step

    with pytest.raises(ValueError, match="processes=0"):
        train_step.run(rounds=1, compiled=False, processes=0)


def test_eager_gap_swaps_are_restored_and_change_the_ops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    import torch

    import unit_scaling as uu
    import unit_scaling.functional as U
    from benchmarks import eager_gap

    original = (uu.Linear.forward, U.residual_apply, U.silu_glu, uu.RMSNorm.forward)
    torch.manual_seed(0)
    model = uu.TransformerDecoder(32, 256, layers=2, heads=2)
    batch = torch.randint(256, (2, 9))
    loss = model.loss(batch)
    with eager_gap.swapped(tuple(eager_gap.SWAPS)):
        assert uu.Linear.forward is not original[0]
        swapped_loss = model.loss(batch)
        # The swapped model is plain torch inside: no u-μP scales, other numbers.
        assert not torch.allclose(swapped_loss, loss)
    assert (uu.Linear.forward, U.residual_apply, U.silu_glu, uu.RMSNorm.forward) == (
        original
    )
    assert torch.equal(model.loss(batch), loss)
    with (
        pytest.raises(ValueError, match="unknown swap groups"),
        eager_gap.swapped(("linear", "bogus")),
    ):
        pass
    with pytest.raises(ValueError, match="unknown configs"):
        eager_gap.run(rounds=1, processes=1, configs=["bogus"])


@pytest.mark.slow
def test_eager_gap_reports_each_configuration() -> None:
    command = [sys.executable, "-m", "benchmarks.eager_gap", "--rounds", "1"]
    command += ["--processes", "1", "--configs", "u-μP as is", "plain linear"]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, check=True, timeout=600
    )
    lines = done.stdout.splitlines()
    assert "medians over 1 process of" in lines[0]
    for label in ("u-μP as is", "plain linear"):
        row = next(line for line in lines if line.startswith(label))
        ratio = float(row[len(label) :].split()[0])
        # Both models ran the same work (one round on a machine that may be
        # busy: only a gross difference, such as one model doing nothing, fails).
        assert 0.1 < ratio < 10


def test_op_counter_counts_kernels_inside_wrappers_and_not_views() -> None:
    """Views, CPU `.item()` and profiler markers launch no kernel; an autograd
    Function's and a custom operator's own operators count, so that wrapping
    cannot hide them; a custom operator with no aten inside counts as one."""
    from benchmarks.op_counts import OpCounter

    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x.mul(2).add(1)

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            return grad * 2

    x = torch.ones(4, 3, requires_grad=True)
    with OpCounter() as counter:
        y = Twice.apply(x.view(3, 4).unsqueeze(0))
        y.sum().backward()
        x.detach()[0, 0].item()
        with torch.profiler.record_function("marker"):
            pass
    assert dict(counter.counts) == {"mul": 2, "add": 1, "sum": 1, "ones_like": 1}

    a, b = torch.ones(5, 4), torch.ones(2, 4, 3)
    offs = torch.tensor([2, 5], dtype=torch.int32)
    with OpCounter() as counter:  # unit_scaling's grouped GEMM: a torch.library op
        torch.ops.unit_scaling.grouped_mm_loop(a, b, offs)
    assert dict(counter.counts) == {"new_zeros": 1, "mm": 2}
    with OpCounter() as counter:
        torch.ops.op_counts_test.opaque(a)
    assert dict(counter.counts) == {"op_counts_test.opaque": 1}


@torch.library.custom_op("op_counts_test::opaque", mutates_args=())
def _opaque(x: torch.Tensor) -> torch.Tensor:
    """A custom operator whose kernel dispatches no aten operator (as a C++ or
    Triton kernel would not)."""
    return torch.from_numpy(x.numpy() + 1)


def test_op_counts_meet_their_targets() -> None:
    """The training step's aten operators, u-μP against plain torch (counts are
    deterministic: this is not a timing). They depend on the layers, not on
    widths or batch sizes (the benchmark's model counts the same), so a small
    model stands in for the benchmark's."""
    from benchmarks import op_counts

    counts = op_counts.measure(32, 64, 4, 4, batch_shape=(2, 8))
    ratios = op_counts.ratios(counts)
    assert ratios["step"] <= op_counts.STEP_TARGET
    assert ratios["optimizer vs torch's AdamW"] <= op_counts.OPTIMIZER_TARGET
    # u-μP's scales are not free, and torch's AdamW on u-μP's parameters runs
    # what it runs on the plain model's.
    assert ratios["forward"] > 1
    plain, twin = counts["SP"], counts["u-μP, torch AdamW"]
    assert twin.by_phase["optimizer"] == plain.by_phase["optimizer"]
