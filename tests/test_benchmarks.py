"""The training-step benchmark runs, in one process and across fresh processes.

Timings are not asserted (they belong to ``make bench``); the table's shape and
the aggregation over processes are. The end-to-end runs start fresh processes
that train for a round: ``slow``, out of the default run.
"""

from __future__ import annotations

import json
import math
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


def test_fp8_linear_step_ops_are_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    # Counts, not timings: one training step of one converted linear (bf16
    # autocast, default config) runs its 3 FP8 GEMMs, 5 saturating casts
    # (x and W forward; g, W and x backward), of which the backward's W and x
    # write the column-major layout as they convert, and one transpose (g for
    # the weight gradient). Before the one-pass casts: 5 casts and 3 transposes.
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import float8_ops

    counts = float8_ops.count_step(bias=False)
    forward = float8_ops.by_category(counts.forward)
    backward = float8_ops.by_category(counts.backward)
    assert forward == {
        **dict.fromkeys(float8_ops.CATEGORIES, 0),
        **{"FP8 GEMM": 1, "saturating clamp": 2, "cast to FP8": 2},
    }
    assert backward == {
        **dict.fromkeys(float8_ops.CATEGORIES, 0),
        **{
            "FP8 GEMM": 2,
            "saturating clamp": 3,
            "cast to FP8": 1,
            "cast and transpose": 2,
            "layout copy": 1,
        },
    }
    # A bias adds its scaling, cast and add forward; its sum, scaling and the
    # cast of its gradient to float32 backward: no FP8 work.
    biased = float8_ops.count_step(bias=True)
    extra = {
        c: float8_ops.by_category(biased.forward)[c]
        + float8_ops.by_category(biased.backward)[c]
        - forward[c]
        - backward[c]
        for c in float8_ops.CATEGORIES
    }
    assert extra == {
        **dict.fromkeys(float8_ops.CATEGORIES, 0),
        "other cast": 2,
        "other": 4,
    }
    # On a CPU the FP8 GEMM is a custom op: counted above as the _scaled_mm
    # it runs. Views cost no kernel and are skipped.
    from benchmarks.op_counts import OpCounter

    with OpCounter(float8_ops.category) as counter:
        import torch

        torch.randn(4, 4).t().contiguous()
    assert dict(counter.classified) == {
        ("other", "randn"): 1,
        ("layout copy", "clone"): 1,
    }


def test_fp8_conversion_keeps_no_copy_of_a_weight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import float8_ops

    memory = float8_ops.check_memory()
    assert memory.before == memory.converted == memory.trained
    assert memory.same_parameter_objects
    # The forward saves the input and the weight parameter itself: no FP8 copy.
    assert [what for what, _, _ in memory.saved] == ["input", "weight parameter"]


def test_gpu_check_runs_its_logic_on_the_cpu(tmp_path: Path) -> None:
    # `python -m benchmarks.gpu --cpu-check`: every section on tiny shapes with
    # the CPU on both sides of the zoo comparison, so the differences are zero
    # and the reports equal; each section's files and the page are written.
    # Timings are not checked (on a CPU they mean nothing).
    command = [sys.executable, "-m", "benchmarks.gpu", "--cpu-check"]
    command += ["--out", str(tmp_path), "--commit", "test"]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, check=True, timeout=300
    )
    for section in ("zoo", "fp8", "speed"):
        assert (tmp_path / f"{section}.md").read_text().strip()
        payload = json.loads((tmp_path / f"{section}.json").read_text())
        assert payload["environment"]["commit"] == "test"
        assert payload["environment"]["cpu_check"] is True
    zoo = json.loads((tmp_path / "zoo.json").read_text())["data"]
    rows = zoo["rows"]
    assert {(r["model"], r["transform"]) for r in rows} == {
        (m, t)
        for m in ("mlp", "nanogpt")
        for t in ("unit_scale", "track_scales", "simulate_fp8")
    }
    for r in rows:
        assert r["error"] is None, r
        assert r["output"] == 0 and r["grads"] == 0 and r["params"] > 0, r
        assert r["report_entries_equal"] and r["report_numbers"] == 0, r
        assert r["stderr_cpu"] == r["stderr_device"] == "", r
    assert not zoo["not_measured"]
    fp8 = json.loads((tmp_path / "fp8.json").read_text())["data"]
    assert [r["layer"] for r in fp8["linears"]][-1] == "readout"
    for r in fp8["linears"]:
        # On a CPU real FP8 is the simulation exactly; both near float32.
        assert r["vs_simulated"] == [math.inf] * 3
        assert all(17 <= s < 60 for s in r["vs_float32"])
    runs = fp8["training"]["runs"]
    assert runs["bf16"]["steps"] == runs["FP8"]["steps"] > 0
    assert abs(fp8["training"]["gap"]) < 0.05
    speed = json.loads((tmp_path / "speed.json").read_text())["data"]
    measured = {(r["variant"]["model"], r["variant"]["fp8"]) for r in speed["fp8"]}
    assert {("u-μP", None), ("u-μP", "ours")} <= measured
    assert [r["width"] for r in speed["widths"]] == [32]
    assert speed["widths"][0]["eager ratio"] > 0
    assert speed["widths"][0]["compiled ratio"] > 0
    page = (tmp_path / "gpu.md").read_text()
    assert "CPU standing in for the GPU" in page and "at commit test" in page
    # Every target is printed with a verdict.
    lines = done.stdout.splitlines()
    verdicts = lines[lines.index("Targets:") + 1 :]
    assert sum(line.strip().startswith(("met", "not met")) for line in verdicts) >= 5
    assert any("zoo: nothing printed to stderr" in line for line in verdicts)


def test_gpu_check_without_cuda_says_so(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the real run would start")
    command = [sys.executable, "-m", "benchmarks.gpu", "--out", str(tmp_path)]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, check=True, timeout=120
    )
    assert "needs a CUDA GPU" in done.stdout and "Nothing was measured" in done.stdout
    assert not any(tmp_path.iterdir())


def test_gpu_check_sections_stop_at_their_deadline(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A section whose budget is spent starts nothing more and says what it
    # left out; its targets are then not measured (never met or not met).
    monkeypatch.syspath_prepend(str(ROOT))
    import torch

    from benchmarks.gpu import speed, zoo
    from benchmarks.gpu._common import Deadline, Settings

    settings = Settings(torch.device("cpu"), tmp_path, True, 1, ("mlp", "nanogpt"))
    result = speed.run(settings, Deadline(0))
    assert result.data["fp8"] == [] and result.data["widths"] == []
    assert len(result.data["not_measured"]) == len(speed._plan(settings, fp8=True))
    assert all(t.met is None for t in result.targets) and len(result.targets) == 4
    # The FP8 runs the targets need come first, the GEMMs right after them.
    plan = [
        (table, v and (v.model, v.fp8, v.compiled))
        for table, v, _ in speed._plan(settings, fp8=True)
    ]
    assert plan[:7] == [
        ("fp8", ("u-μP", None, False)),
        ("fp8", ("u-μP", "ours", False)),
        ("fp8", ("SP", "tensorwise", False)),
        ("fp8", ("u-μP", None, True)),
        ("fp8", ("u-μP", "ours", True)),
        ("fp8", ("SP", "tensorwise", True)),
        ("gemms", None),
    ]
    result = zoo.run(settings, Deadline(0))
    assert result.data["rows"] == [] and result.data["not_measured"] == [
        "mlp",
        "nanogpt",
    ]
    assert [t.met for t in result.targets] == [None, None, None]


@pytest.mark.integration
def test_the_trainer_step_section_reports_its_ratio(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("transformers")
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import trainer_step

    monkeypatch.setattr(trainer_step, "STEPS_PER_ROUND", 2)
    lines = trainer_step.run(rounds=1).splitlines()
    assert "Hugging Face Trainer" in lines[0]
    ratio, low, high = _ratios(lines, "Trainer step, eager")
    assert 0 < low <= ratio <= high  # (no bound on timing: the load varies)
