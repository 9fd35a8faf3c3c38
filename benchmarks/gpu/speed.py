"""Section (c): training-step speed on the GPU.

1. **FP8** (``benchmarks/float8_gpu.py``'s variants, shapes and tables, run
   through its own ``measure_training`` and ``gemm_table``): our FP8 against
   the u-μP model in bf16 and against torchao's tensorwise FP8, eager and
   compiled, at its default shape (width 2048, 4 layers, 4×2048 tokens).
2. **u-μP against SP in bf16** at widths 256–2048 (4 layers, 16×256 tokens,
   head size 64, vocabulary 32768), eager and compiled: the step-time ratio.

Runs are ordered by what the targets need (FP8 first), each started only if
the time it is expected to take (the longest of its kind so far, or a first
guess) fits in the section's budget; the others are listed as not measured.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import time
from typing import Any

import torch

from .. import float8_gpu
from ..float8 import _torchao_float8
from ..float8_gpu import Result, Shapes, Variant
from ._common import Deadline, SectionResult, Settings, Target, markdown_table

WIDTHS = (256, 512, 1024, 2048)
CPU_CHECK_WIDTHS = (32,)
# First guesses of one run's seconds on a GPU, before any has been timed (a
# tenth in --cpu-check).
GUESS = {"eager": 20.0, "compiled": 90.0}


def fp8_shapes(settings: Settings) -> Shapes:
    if settings.cpu_check:
        return Shapes(width=64, layers=1, heads=2, vocab=256, seq=32, batch=2)
    return Shapes()


def width_shapes(settings: Settings, width: int) -> Shapes:
    if settings.cpu_check:
        return Shapes(width=width, layers=1, heads=2, vocab=256, seq=16, batch=2)
    return Shapes(width=width, layers=4, heads=width // 64, vocab=32768, seq=256)


def _variant(model: str, fp8: str | None, compiled: bool) -> Variant:
    return next(
        v
        for v in float8_gpu.VARIANTS
        if (v.model, v.fp8, v.compiled) == (model, fp8, compiled)
    )


def _plan(settings: Settings, fp8: bool) -> list[tuple[str, Variant | None, Shapes]]:
    """``(table, variant, shapes)`` in the order they run (``"gemms"``, with no
    variant: the GEMMs alone)."""
    big = fp8_shapes(settings)
    widths = CPU_CHECK_WIDTHS if settings.cpu_check else WIDTHS
    plan: list[tuple[str, Variant | None, Shapes]] = []
    fp8_core = [("u-μP", None), ("u-μP", "ours"), ("SP", "tensorwise")]
    fp8_rest = [("SP", None), ("SP", "rowwise")]
    if fp8:
        plan += [("fp8", _variant(m, f, False), big) for m, f in fp8_core]
        plan += [("fp8", _variant(m, f, True), big) for m, f in fp8_core]
        plan.append(("gemms", None, big))
    for model in ("SP", "u-μP"):
        plan += [
            ("width", _variant(model, None, False), width_shapes(settings, w))
            for w in widths
        ]
    # Compiled: the extreme widths first.
    for w in dict.fromkeys((widths[0], widths[-1], *widths)):
        for model in ("SP", "u-μP"):
            plan.append(
                ("width", _variant(model, None, True), width_shapes(settings, w))
            )
    if fp8 and not settings.cpu_check:  # context only: not run in --cpu-check
        plan += [
            ("fp8", _variant(m, f, c), big) for c in (False, True) for m, f in fp8_rest
        ]
    return plan


def run(settings: Settings, deadline: Deadline) -> SectionResult:
    """The runs of :func:`_plan` that fit in ``deadline``, then the GEMMs."""
    if not settings.cpu_check:
        return _run(settings, deadline)
    # On a CPU torchao's FP8 GEMMs reach oneDNN's slow E4M3 path (see
    # benchmarks/float8.py): off, as that benchmark does.
    with torch.backends.mkldnn.flags(enabled=False):
        return _run(settings, deadline)


def _run(settings: Settings, deadline: Deadline) -> SectionResult:
    device = settings.device
    problem = None if settings.cpu_check else float8_gpu.fp8_gpu_problem()
    has_torchao = importlib.util.find_spec("torchao") is not None
    if has_torchao:
        _torchao_float8()  # imported once, without its CUDA-extension chatter
    warmup, steps = (1, 2) if settings.cpu_check else (5, 20)
    backend = "eager" if settings.cpu_check else "inductor"
    took: dict[str, float] = {}
    fp8_results: list[Result] = []
    width_results: list[tuple[Shapes, Result]] = []
    skipped: list[str] = []
    gemms = None
    for table, variant, shapes in _plan(settings, fp8=problem is None):
        # Compiling dominates a compiled run, and depends on the table's model.
        kind = f"{table} {variant.mode if variant else 'eager'}"
        guess = GUESS[variant.mode if variant else "eager"] / (
            10 if settings.cpu_check else 1
        )
        if variant is None:
            if not deadline.fits(took.get(kind, guess)):
                skipped.append("FP8 GEMMs alone: time budget")
                continue
            begin = time.perf_counter()
            repeats = 2 if settings.cpu_check else 50
            try:
                gemms = float8_gpu.gemm_table(shapes, device, warmup, repeats)
            except Exception as error:  # reported; the runs go on
                gemms = f"FP8 GEMMs alone failed: {type(error).__name__}: {error}"
            took[kind] = time.perf_counter() - begin
            print(f"    speed: GEMMs alone ({took[kind]:.0f} s)", flush=True)
            continue
        label = (
            f"{variant.name} ({variant.model}, {variant.mode}, width {shapes.width})"
        )
        if variant.fp8 in ("tensorwise", "rowwise") and not has_torchao:
            skipped.append(f"{label}: torchao is not installed")
            continue
        if not deadline.fits(took.get(kind, guess)):
            skipped.append(f"{label}: time budget")
            continue
        begin = time.perf_counter()
        result = float8_gpu.measure_training(
            variant, shapes, device, warmup, steps, backend
        )
        seconds = time.perf_counter() - begin
        took[kind] = max(took.get(kind, 0.0), seconds)
        state = result.error or f"{1e3 * result.step_s:.1f} ms a step"
        print(f"    speed: {label}: {state} ({seconds:.0f} s)", flush=True)
        if table == "fp8":
            fp8_results.append(result)
        else:
            width_results.append((shapes, result))
    return _result(settings, problem, fp8_results, width_results, gemms, skipped)


def _speed(results: list[Result]) -> dict[tuple[str, str | None, bool], float]:
    return {
        (r.variant.model, r.variant.fp8, r.variant.compiled): r.tokens_per_s
        for r in results
        if r.error is None
    }


def fp8_targets(results: list[Result]) -> list[Target]:
    """The issue's FP8 speed targets from the measured variants."""
    speed = _speed(results)
    targets = []
    for compiled, baseline, goal in (
        (True, ("u-μP", None), float8_gpu.TARGET_VS_BF16[True]),
        (False, ("u-μP", None), float8_gpu.TARGET_VS_BF16[False]),
        (True, ("SP", "tensorwise"), float8_gpu.TARGET_VS_TORCHAO),
        (False, ("SP", "tensorwise"), float8_gpu.TARGET_VS_TORCHAO),
    ):
        mode = "compiled" if compiled else "eager"
        against = "u-μP bf16" if baseline[1] is None else "torchao tensorwise"
        target = Target(f"FP8 {mode}: ours ÷ {against}, tokens/s", f"≥ {goal}")
        ours = speed.get(("u-μP", "ours", compiled))
        other = speed.get((*baseline, compiled))
        if ours is not None and other is not None:
            ratio = ours / other
            target.measured, target.met = f"{ratio:.3f}", ratio >= goal
        targets.append(target)
    return targets


def _width_rows(
    width_results: list[tuple[Shapes, Result]],
) -> list[dict[str, Any]]:
    by_width: dict[int, dict[str, float]] = {}
    for shapes, r in width_results:
        key = f"{r.variant.model} {r.variant.mode}"
        cell = by_width.setdefault(shapes.width, {})
        cell[key] = r.step_s if r.error is None else float("nan")
    rows = []
    for width, cell in sorted(by_width.items()):
        row: dict[str, Any] = {"width": width}
        for mode in ("eager", "compiled"):
            sp, umup = cell.get(f"SP {mode}"), cell.get(f"u-μP {mode}")
            row[f"SP {mode} ms"] = None if sp is None else 1e3 * sp
            row[f"u-μP {mode} ms"] = None if umup is None else 1e3 * umup
            row[f"{mode} ratio"] = None if sp is None or umup is None else umup / sp
        rows.append(row)
    return rows


def _cell(x: float | None, digits: int) -> str:
    return "not measured" if x is None else f"{x:.{digits}f}"


def _result(
    settings: Settings,
    problem: str | None,
    fp8_results: list[Result],
    width_results: list[tuple[Shapes, Result]],
    gemms: str | None,
    skipped: list[str],
) -> SectionResult:
    targets = fp8_targets(fp8_results)
    for target in targets:
        if problem is not None:
            target.measured = f"not measured: {problem}"
        elif "torchao" in target.name and importlib.util.find_spec("torchao") is None:
            target.measured = "not measured: torchao is not installed"
    lines = []
    if problem is not None:
        lines += [f"FP8: not measured: {problem}.", ""]
    if fp8_results:
        shapes = fp8_shapes(settings)
        lines += [
            "FP8 (`benchmarks/float8_gpu.py`'s tables):",
            "",
            "```",
            float8_gpu.training_table(fp8_results, shapes),
            "",
            float8_gpu.targets_table(fp8_results),
            "```",
            "",
        ]
    if gemms is not None:
        lines += ["```", gemms, "```", ""]
    rows = _width_rows(width_results)
    if rows:
        example = width_shapes(settings, rows[0]["width"])
        lines += [
            f"u-μP (`uu.TransformerDecoder`, `uu.optim.AdamW`) ÷ SP "
            "(`StandardTransformerDecoder`, `torch.optim.AdamW`), bf16 autocast, "
            f"{example.layers} layers, {example.batch}×{example.seq} tokens, "
            f"vocabulary {example.vocab}: step time (ms) and ratio",
            "",
            markdown_table(
                (
                    "width",
                    "SP eager",
                    "u-μP eager",
                    "eager ratio",
                    "SP compiled",
                    "u-μP compiled",
                    "compiled ratio",
                ),
                [
                    (
                        r["width"],
                        _cell(r["SP eager ms"], 1),
                        _cell(r["u-μP eager ms"], 1),
                        _cell(r["eager ratio"], 2),
                        _cell(r["SP compiled ms"], 1),
                        _cell(r["u-μP compiled ms"], 1),
                        _cell(r["compiled ratio"], 2),
                    )
                    for r in rows
                ],
            ),
            "",
        ]
    if skipped:
        lines += ["Not measured:", "", *(f"- {s}" for s in skipped)]
    data = {
        "fp8": [_as_data(r) for r in fp8_results],
        "widths": rows,
        "gemms": gemms,
        "not_measured": skipped,
        "fp8_problem": problem,
    }
    return SectionResult("speed", data, "\n".join(lines).rstrip(), targets)


def _as_data(result: Result) -> dict[str, Any]:
    return dataclasses.asdict(result)
