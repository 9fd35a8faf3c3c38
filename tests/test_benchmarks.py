"""The training-step benchmark runs, in one process and across fresh processes.

Timings are not asserted (they belong to ``make bench``); the table's shape and
the aggregation over processes are. The end-to-end runs start fresh processes
that train for a round: ``slow``, out of the default run.
"""

from __future__ import annotations

import copy
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
    # and the reports equal (that a difference is found: the tests of
    # `compare_sides` below); each section's files and the page are written.
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
    speed_section = json.loads((tmp_path / "speed.json").read_text())
    speed = speed_section["data"]
    measured = {(r["variant"]["model"], r["variant"]["fp8"]) for r in speed["fp8"]}
    assert {("u-μP", None), ("u-μP", "ours")} <= measured
    assert [r["width"] for r in speed["widths"]] == [32]
    # Each ratio is its own row's two medians, as printed while measuring.
    medians = _printed_medians(done.stdout)
    for r in speed["widths"]:
        for mode in ("eager", "compiled"):
            sp, umup = r[f"SP {mode} ms"], r[f"u-μP {mode} ms"]
            assert f"{sp:.1f}" == medians["bf16", "SP", mode, r["width"]]
            assert f"{umup:.1f}" == medians["bf16", "u-μP", mode, r["width"]]
            assert r[f"{mode} ratio"] == pytest.approx(umup / sp, rel=1e-9)
    _check_width_table((tmp_path / "speed.md").read_text(), speed["widths"])
    checked = _check_fp8_ratios(speed["fp8"], speed_section["targets"], medians, 64)
    assert checked >= {
        f"FP8 {mode}: ours ÷ u-μP bf16" for mode in ("eager", "compiled")
    }
    page = (tmp_path / "gpu.md").read_text()
    assert "CPU standing in for the GPU" in page and "at commit test" in page
    # Every target is printed with a verdict.
    lines = done.stdout.splitlines()
    verdicts = lines[lines.index("Targets:") + 1 :]
    assert sum(line.strip().startswith(("met", "not met")) for line in verdicts) >= 5
    assert any("zoo: nothing printed to stderr" in line for line in verdicts)


def _printed_medians(stdout: str) -> dict[tuple[str, str, str, int], str]:
    """Each run's median step time (ms, as printed by the speed section) by
    variant name, model, mode and width."""
    found = re.findall(
        r"speed: (.+) \((SP|u-μP), (eager|compiled), width (\d+)\): "
        r"(\d+\.\d) ms a step",
        stdout,
    )
    return {(name, m, mode, int(w)): ms for name, m, mode, w, ms in found}


def _check_width_table(markdown: str, rows: list[dict[str, Any]]) -> None:
    """The speed section's u-μP ÷ SP table prints each row's medians and their
    ratio."""
    for r in rows:
        line = next(
            x for x in markdown.splitlines() if x.startswith(f"| {r['width']} |")
        )
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[1:] == [
            f"{r['SP eager ms']:.1f}",
            f"{r['u-μP eager ms']:.1f}",
            f"{r['eager ratio']:.2f}",
            f"{r['SP compiled ms']:.1f}",
            f"{r['u-μP compiled ms']:.1f}",
            f"{r['compiled ratio']:.2f}",
        ]


def _check_fp8_ratios(
    results: list[dict[str, Any]],
    targets: list[dict[str, Any]],
    medians: dict[tuple[str, str, str, int], str],
    width: int,
) -> set[str]:
    """Each measured FP8 target is ours ÷ its baseline in tokens/s: the inverse
    ratio of the two runs' median step times, as printed (the FP8 runs at
    ``width``). Returns the names checked (less ", tokens/s")."""
    by_variant = {
        (r["variant"]["model"], r["variant"]["fp8"], r["variant"]["compiled"]): r
        for r in results
    }
    for r in results:
        v = r["variant"]
        key = (v["name"], v["model"], "compiled" if v["compiled"] else "eager", width)
        assert f"{1e3 * r['step_s']:.1f}" == medians[key]
    baselines = {
        "u-μP bf16": ("u-μP", None),
        "torchao tensorwise": ("SP", "tensorwise"),
    }
    checked = set()
    for target in targets:
        found = re.fullmatch(
            r"(FP8 (eager|compiled): ours ÷ (.+)), tokens/s", target["name"]
        )
        if found is None or target["met"] is None:
            continue
        name, mode, against = found.groups()
        compiled = mode == "compiled"
        ours = by_variant["u-μP", "ours", compiled]
        other = by_variant[(*baselines[against], compiled)]
        ratio = ours["tokens_per_s"] / other["tokens_per_s"]
        assert ratio == pytest.approx(other["step_s"] / ours["step_s"], rel=1e-9)
        assert target["measured"] == f"{ratio:.3f}"
        checked.add(name)
    return checked


def test_gpu_check_speed_ratios_divide_their_own_rows_medians(tmp_path: Path) -> None:
    # Two widths with different medians, one run failed: each ratio is its
    # own width's u-μP ÷ SP, mode by mode; a failed run's ratio is not a number.
    from benchmarks.float8_gpu import Result, Shapes
    from benchmarks.gpu import speed
    from benchmarks.gpu._common import Settings

    settings = Settings(torch.device("cpu"), tmp_path, True, 1, None)
    medians = {
        (32, "SP", False): 0.010,
        (32, "u-μP", False): 0.013,
        (32, "SP", True): 0.007,
        (32, "u-μP", True): 0.0091,
        (64, "SP", False): 0.020,
        (64, "u-μP", False): 0.030,
        (64, "SP", True): 0.050,
    }
    runs = [
        (Shapes(width=w), Result(speed._variant(m, None, c), step_s=s))
        for (w, m, c), s in medians.items()
    ]
    runs.append(
        (Shapes(width=64), Result(speed._variant("u-μP", None, True), error="OOM"))
    )
    result = speed._result(settings, None, [], runs, None, [])
    rows = {r["width"]: r for r in result.data["widths"]}
    assert rows[32]["eager ratio"] == pytest.approx(1.3)
    assert rows[32]["compiled ratio"] == pytest.approx(1.3)
    assert rows[64]["eager ratio"] == pytest.approx(1.5)
    assert math.isnan(rows[64]["compiled ratio"])
    _check_width_table(result.markdown, result.data["widths"])


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


@pytest.fixture(scope="module")
def mlp_sides() -> dict[str, Any]:
    """The zoo's ``mlp`` under ``unit_scale`` and ``track_scales``, on the CPU:
    one side of the GPU check's comparison, by transform."""
    from benchmarks.gpu import zoo
    from benchmarks.gpu.agreement import CPU
    from unit_scaling import zoo as models

    base = models.get("mlp").make(0)
    return {
        t: zoo.run_side("mlp", t, base, CPU) for t in ("unit_scale", "track_scales")
    }


def _verdicts(row: dict[str, Any]) -> list[bool | None]:
    """The zoo section's three targets (outputs and gradients agree, reports
    equal, stderr empty) for a section of this one row."""
    from benchmarks.gpu import zoo

    row = {"model": "mlp", "transform": "unit_scale", **row}
    return [t.met for t in zoo._result("cuda", [row], [], {}, []).targets]


@pytest.mark.parametrize("transform", ["unit_scale", "track_scales"])
def test_gpu_check_finds_identical_sides_equal(
    mlp_sides: dict[str, Any], transform: str
) -> None:
    from benchmarks.gpu.agreement import compare_sides

    side = mlp_sides[transform]
    row = compare_sides(side, copy.deepcopy(side), "cuda")
    assert row["error"] is None and row["output"] == row["grads"] == 0
    assert row["params"] == 4 and row["worst_param"] is not None
    assert row["report_entries_equal"] and row["report_numbers"] == 0
    assert _verdicts(row) == [True, True, True]


def _nudge(tensor: torch.Tensor) -> None:
    """One element moved by 1e-3 of the tensor's norm: a relative difference
    of 1e-3, ten times the zoo's tolerance."""
    tensor.view(-1)[0] += 1e-3 * tensor.norm()


def _raise_number(side: Any, name: str) -> None:
    side.report.numbers[name] *= 1 + 1e-3


def _relabel_parameter(side: Any, name: str) -> None:
    records = side.report.entries[1]
    i = next(i for i, (n, _, _) in enumerate(records) if n == name)
    records[i] = (name, "bias", records[i][2])


def _drop_parameter(side: Any, name: str) -> None:
    side.report.entries[1] = [e for e in side.report.entries[1] if e[0] != name]
    del side.report.numbers[name]


def _drop_tracked(side: Any, name: str) -> None:
    side.report.entries.remove((name, True))
    for key in [k for k in side.report.numbers if k.startswith(f"{name}.")]:
        del side.report.numbers[key]


ABOUT_1E_3 = pytest.approx(1e-3, rel=1e-3)
# How the other side differs: (transform, the change, the row's fields, the
# section's verdicts: outputs and gradients agree, reports equal, stderr empty).
DIFFERENCES: dict[str, tuple[str, Any, dict[str, Any], list[bool | None]]] = {
    "output": (
        "unit_scale",
        lambda s: _nudge(s.output),
        {"output": ABOUT_1E_3, "grads": 0},
        [False, True, True],
    ),
    "gradient": (
        "unit_scale",
        lambda s: _nudge(s.grads["down.weight"]),
        {"output": 0, "grads": ABOUT_1E_3, "worst_param": "down.weight"},
        [False, True, True],
    ),
    "gradient missing": (
        "unit_scale",
        lambda s: s.grads.pop("up.bias"),
        {"grads": math.inf, "worst_param": "up.bias", "params": 4},
        [False, True, True],
    ),
    "gradient extra": (
        "unit_scale",
        lambda s: s.grads.update(extra=torch.zeros(1)),
        {"grads": math.inf, "worst_param": "extra", "params": 5},
        [False, True, True],
    ),
    "gradient scale": (
        "unit_scale",
        lambda s: _raise_number(s, "down.weight"),
        {"grads": 0, "report_entries_equal": True, "report_numbers": ABOUT_1E_3},
        [True, False, True],
    ),
    "parameter role": (
        "unit_scale",
        lambda s: _relabel_parameter(s, "up.weight"),
        {"report_entries_equal": False, "report_numbers": 0},
        [True, False, True],
    ),
    "parameter record missing": (
        "unit_scale",
        lambda s: _drop_parameter(s, "up.bias"),
        {"report_entries_equal": False, "report_numbers": math.inf},
        [True, False, True],
    ),
    "tracked statistic": (
        "track_scales",
        lambda s: _raise_number(s, "x.bwd.std"),
        {"report_entries_equal": True, "report_numbers": ABOUT_1E_3},
        [True, False, True],
    ),
    "tracked tensor missing": (
        "track_scales",
        lambda s: _drop_tracked(s, "gelu"),
        {"report_entries_equal": False, "report_numbers": math.inf},
        [True, False, True],
    ),
    "stderr": (
        "unit_scale",
        lambda s: setattr(s, "stderr", "CUDA warning"),
        {"stderr_cpu": "", "stderr_device": "CUDA warning", "output": 0},
        [True, True, False],
    ),
    "error": (
        "unit_scale",
        lambda s: setattr(s, "error", "RuntimeError: no kernel"),
        {"error": "RuntimeError: no kernel", "error_side": "cuda"},
        [None, False, True],
    ),
}


@pytest.mark.parametrize("difference", DIFFERENCES)
def test_gpu_check_reports_a_difference_on_the_other_side(
    mlp_sides: dict[str, Any], difference: str
) -> None:
    # The CPU side's results against a copy changed in one way: the row says
    # where, and the section's targets are not met. (The same copy unchanged
    # gives zeros and every target met: the test above.)
    from benchmarks.gpu.agreement import compare_sides

    transform, change, fields, verdicts = DIFFERENCES[difference]
    reference = mlp_sides[transform]
    other = copy.deepcopy(reference)
    change(other)
    row = compare_sides(reference, other, "cuda")
    assert {k: row.get(k) for k in fields} == fields
    assert _verdicts(row) == verdicts


class _Skewed:
    """A side on the CPU whose results come back 0.1% larger: a device that
    computes slightly differently, plugged in where CUDA is."""

    name = "skewed"

    def put_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def put(self, tree: Any) -> Any:
        return tree

    def back(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach() * (1 + 1e-3)


def test_gpu_check_compares_the_side_it_is_given() -> None:
    from benchmarks.gpu import zoo

    row = zoo.compare("mlp", "unit_scale", _Skewed())
    assert row["error"] is None
    assert row["output"] == pytest.approx(1e-3, rel=1e-3)
    assert row["grads"] == pytest.approx(1e-3, rel=1e-3)
    assert row["report_entries_equal"] and row["report_numbers"] == 0
    result = zoo._result("skewed", [row], [], {}, [])
    assert "skewed vs CPU" in result.targets[0].name
    assert result.targets[0].met is False


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


@pytest.mark.integration  # (half a minute: three models' steps)
def test_the_monitor_section_reports_every_model_and_ratio(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("transformers")
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import monitor

    for name, value in (("HIDDEN", 32), ("SEQ", 16), ("BATCH", 2), ("LAYERS", 1)):
        monkeypatch.setattr(monitor, name, value)
    rows = {row[0]: row[1:] for row in monitor.measure(rounds=2)}
    assert set(rows) == {
        "u-μP decoder, eager",
        "u-μP decoder, compiled",
        "unit_scale GPT-2, eager",
    }
    for label, (plain, quiet, recording, average, memory) in rows.items():
        assert float(plain) > 0 and float(quiet) > 0 and float(recording) > 0
        # the average is the every=100 mix of the two measured ratios
        mixed = (99 * float(quiet) + float(recording)) / 100
        assert float(average) == pytest.approx(mixed, abs=1e-3), label
        assert (memory == "-") == (label != "u-μP decoder, eager"), label
