"""FP8 training-step speed: ``unit_scaling.float8`` against ``torchao.float8``.

Four training steps of the same decoder (embedding, pre-norm RMSNorm, fused-QKV
causal attention, SwiGLU MLP, readout, cross-entropy, AdamW), side by side in
one process, interleaved:

* **unit_scaling FP8**: ``uu.TransformerDecoder`` converted in place by
  :func:`unit_scaling.float8.convert_to_float8_training` (static unit scales),
  ``uu.optim.AdamW``;
* **torchao FP8**: ``StandardTransformerDecoder`` (SP) converted in place by
  ``torchao.float8.convert_to_float8_training`` (dynamic tensorwise scales: an
  amax per operand per GEMM), ``torch.optim.AdamW``;
* **u-μP FP32** and **SP FP32**: the same two models unconverted.

Every linear layer's sizes are multiples of 16, so both conversions take all of
them. Target: unit_scaling FP8 ÷ torchao FP8 ≤ 0.95, eager and compiled. On a
CPU ``torch._scaled_mm`` is emulated (FP8 operands widened to float32, then a
float32 GEMM), so FP8 ÷ FP32 is reported as it is, with no speed-up expected.
oneDNN is turned off while measuring: on a CPU with AMX torch 2.13 sends an
E4M3 × E4M3 ``_scaled_mm`` to oneDNN, hundreds of times slower than its
reference kernel. ``unit_scaling.float8`` turns it off around its own CPU GEMMs
but torchao does not: with torch's defaults torchao's step here takes ~80 s
(ours 0.15 s); float32 GEMMs do not use oneDNN. A last line times one CPU FP8
GEMM both ways and says whether this CPU takes oneDNN's kernel at all (torch
2.13 does only with AMX), i.e. whether that workaround still pays here.
``--profile`` prints where each FP8 step's time goes::

    .venv/bin/python -m benchmarks.float8 --processes 3
    .venv/bin/python -m benchmarks.float8 --quick
    .venv/bin/python -m benchmarks.float8 --profile
    .venv/bin/python -m benchmarks.float8 --onednn
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import statistics
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

import unit_scaling as uu
from unit_scaling._torch_internals import scaled_mm
from unit_scaling.app.baseline import StandardTransformerDecoder
from unit_scaling.float8 import convert_to_float8_training

from ._measure import interleaved_times, json_from_subprocess, paired_ratio, table

HIDDEN, VOCAB, LAYERS, HEADS = 256, 256, 2, 4
BATCH, SEQ = 8, 128
OURS, THEIRS, OURS_FP32, SP_FP32 = (
    "unit_scaling FP8",
    "torchao FP8",
    "u-μP FP32",
    "SP FP32",
)
# (numerator, denominator, target) of each reported ratio.
RATIOS = (
    (OURS, THEIRS, "≤ 0.95"),
    (OURS, OURS_FP32, "as is (emulated FP8)"),
    (THEIRS, SP_FP32, "context"),
    (OURS_FP32, SP_FP32, "context"),
)
MODES = ("eager", "compiled")


def _torchao_float8() -> Any:
    """``torchao.float8``, without its import-time warnings about CUDA
    extensions a CPU build cannot load."""
    quiet = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.ERROR)
    try:
        import torchao.float8

        return torchao.float8
    finally:
        for logger, level in zip(quiet, levels, strict=True):
            logger.setLevel(level)


def models() -> dict[str, nn.Module]:
    """The four models, each from seed 0."""
    ao = _torchao_float8()
    built: dict[str, nn.Module] = {}
    for name in (OURS, THEIRS, OURS_FP32, SP_FP32):
        torch.manual_seed(0)
        if name in (OURS, OURS_FP32):
            model: nn.Module = uu.TransformerDecoder(HIDDEN, VOCAB, LAYERS, HEADS)
        else:
            model = StandardTransformerDecoder(HIDDEN, VOCAB, LAYERS, HEADS)
        if name == OURS:
            convert_to_float8_training(model)
        elif name == THEIRS:
            ao.convert_to_float8_training(model)
        built[name] = model
    return built


def train_step(
    model: nn.Module, loss_fn: Callable[[Tensor], Tensor], batch: Tensor
) -> Callable[[], None]:
    """One AdamW step of ``loss_fn(batch)``: u-μP's AdamW for a u-μP model."""
    if isinstance(model, uu.TransformerDecoder):
        opt: torch.optim.Optimizer = uu.optim.AdamW(model.parameters(), lr=1e-3)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(batch).backward()
        opt.step()

    return step


Measured = dict[str, dict[str, dict[str, float]]]  # mode -> medians / ratios


def measure(rounds: int = 30, compiled: bool = True) -> Measured:
    """Per mode: the median seconds of each step, and each ratio's median of
    same-round ratios, taken in this process."""
    torch.manual_seed(0)
    batch = torch.randint(VOCAB, (BATCH, SEQ + 1))
    results: Measured = {}
    with torch.backends.mkldnn.flags(enabled=False):  # see the docstring
        built = models()
        for mode in MODES if compiled else MODES[:1]:
            steps = {
                name: train_step(
                    model,
                    torch.compile(model.loss, fullgraph=True)  # type: ignore[arg-type]
                    if mode == "compiled"
                    else model.loss,  # type: ignore[arg-type]
                    batch,
                )
                for name, model in built.items()
            }
            times = interleaved_times(steps, rounds)  # type: ignore[arg-type]
            results[mode] = {
                "medians": {k: statistics.median(v) for k, v in times.items()},
                "ratios": {
                    f"{a} / {b}": paired_ratio(times, a, b) for a, b, _ in RATIOS
                },
            }
    return results


def run(rounds: int = 30, compiled: bool = True, processes: int = 1) -> str:
    """The benchmark's table, measured in this process or in ``processes`` fresh
    ones (then each row shows medians over the processes and the range of their
    ratios, as ``train_step.py`` does)."""
    if processes < 1:
        raise ValueError(f"processes={processes} must be at least 1")
    if importlib.util.find_spec("torchao") is None:
        return (
            "FP8 training step: skipped (torchao is not installed: "
            "pip install -e '.[torchao]')"
        )
    if processes == 1:
        per_process = [measure(rounds, compiled)]
    else:
        args = ["--json", "--rounds", str(rounds)]
        args += [] if compiled else ["--no-compile"]
        per_process = [
            json_from_subprocess("benchmarks.float8", *args) for _ in range(processes)
        ]
    rows = []
    for mode in MODES:
        if mode not in per_process[0]:
            continue
        for a, b, target in RATIOS:
            key = f"{a} / {b}"
            ratios = sorted(p[mode]["ratios"][key] for p in per_process)
            ms = [
                statistics.median(p[mode]["medians"][name] for p in per_process) * 1e3
                for name in (a, b)
            ]
            row = [f"{a} ÷ {b}", mode, f"{ms[0]:.1f}", f"{ms[1]:.1f}"]
            row.append(f"{statistics.median(ratios):.3f}")
            if processes > 1:
                row.append(f"{ratios[0]:.3f}–{ratios[-1]:.3f}")
            rows.append((*row, target))
    headers = ["ratio", "mode", "numerator (ms)", "denominator (ms)", "ratio"]
    if processes > 1:
        headers.append("ratio range")
    where = f"medians over {processes} processes of " if processes > 1 else ""
    skipped = "" if compiled else "; compiled: not measured"
    return (
        f"FP8 training step: hidden={HIDDEN} vocab={VOCAB} layers={LAYERS} "
        f"heads={HEADS}, batch=({BATCH}, {SEQ}), {torch.get_num_threads()} threads, "
        f"oneDNN off, {where}medians of {rounds} interleaved steps; ratio: median "
        f"of the {rounds} same-round ratios{skipped}\n"
        + table(rows, (*headers, "target"))
        + "\n"
        + onednn_gemm()
    )


def _ops_run(call: Callable[[], object]) -> set[str]:
    """The names of the aten ops that one ``call()`` ran."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        call()
    return {event.name for event in prof.events()}


def onednn_gemm(rounds: int = 5) -> str:
    """One CPU FP8 GEMM (E4M3, 256 x 128 x 128) as torch runs it by default
    (oneDNN allowed) and as ``unit_scaling.float8`` runs it (oneDNN off around
    the call), timed side by side, with the kernel torch's default took (its
    reference kernel widens the operands and calls ``aten::mm``)."""
    a = torch.randn(256, 128).to(torch.float8_e4m3fn)
    b = torch.randn(128, 128).to(torch.float8_e4m3fn).t()
    one = torch.ones(())
    default, ours = "torch's default", "unit_scaling's"
    gemms = {
        default: lambda: scaled_mm(
            a, b, scale_a=one, scale_b=one, out_dtype=torch.float32
        ),
        ours: lambda: torch.ops.unit_scaling.cpu_fp8_gemm(a, b, one, torch.float32),
    }
    with torch.backends.mkldnn.flags(enabled=True):
        times = interleaved_times(gemms, rounds, warmup=1)
        onednn = "aten::mm" not in _ops_run(gemms[default])
    ratio = paired_ratio(times, default, ours)
    ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    pays = "pays" if onednn and ratio > 2 else "does not pay"
    return (
        f"CPU FP8 GEMM 256x128x128 with oneDNN allowed: torch's default "
        f"{ms[default]:.1f} ms ({'oneDNN' if onednn else 'reference'} kernel) ÷ "
        f"unit_scaling's {ms[ours]:.1f} ms (reference kernel) = {ratio:.1f}, "
        f"median of {rounds}: turning oneDNN off {pays} on this CPU"
    )


def profile(rows: int = 15, compiled: bool = True) -> str:
    """Where each FP8 step's time goes: the ops with the most self CPU time in
    one profiled step of each, after warmup, eager (and compiled)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    torch.manual_seed(0)
    batch = torch.randint(VOCAB, (BATCH, SEQ + 1))
    out = []
    with torch.backends.mkldnn.flags(enabled=False):  # see the docstring
        built = models()
        for mode in MODES if compiled else MODES[:1]:
            for name in (OURS, THEIRS):
                model = built[name]
                loss = model.loss
                if mode == "compiled":
                    loss = torch.compile(loss, fullgraph=True)
                step = train_step(model, loss, batch)  # type: ignore[arg-type]
                for _ in range(3):
                    step()
                with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
                    step()
                averages = prof.key_averages()
                out.append(
                    f"{name}, {mode}:\n"
                    + averages.table(sort_by="self_cpu_time_total", row_limit=rows)
                )
    return "\n".join(out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="measure in this many fresh processes and report medians over them",
    )
    parser.add_argument(
        "--quick", action="store_true", help="3 rounds, one process, eager only"
    )
    parser.add_argument(
        "--profile", action="store_true", help="print where each FP8 step's time goes"
    )
    parser.add_argument(
        "--onednn",
        action="store_true",
        help="time one CPU FP8 GEMM with and without oneDNN",
    )
    parser.add_argument(
        "--json", action="store_true", help=argparse.SUPPRESS
    )  # one process's raw numbers, for run(processes > 1)
    args = parser.parse_args()
    if args.json:
        print(json.dumps(measure(args.rounds, compiled=not args.no_compile)))
    elif args.profile:
        print(profile(compiled=not args.no_compile))
    elif args.onednn:
        print(onednn_gemm())
    elif args.quick:
        print(run(rounds=3, compiled=False))
    else:
        print(run(args.rounds, compiled=not args.no_compile, processes=args.processes))
