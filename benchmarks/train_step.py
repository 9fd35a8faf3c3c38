"""Training-step speed and peak memory: u-μP decoder vs the same model in plain torch.

Both models: embedding, pre-norm RMSNorm, fused-QKV causal attention through
``F.scaled_dot_product_attention``, SwiGLU MLP, readout, cross-entropy, AdamW —
same shapes, same batch. Targets: time ratio ≤ 1.03 eager and ≤ 1.02 compiled,
peak memory ratio ≤ 1.05.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable

import torch
from torch import Tensor, nn

import unit_scaling as uu
from unit_scaling.app.baseline import StandardTransformerDecoder

from ._measure import (
    interleaved_times,
    json_from_subprocess,
    paired_ratio,
    peak_memory_bytes,
    table,
)

HIDDEN, VOCAB, LAYERS, HEADS = 256, 256, 4, 4
BATCH, SEQ = 8, 128


def _train_step(
    model: nn.Module, loss_fn: Callable[[Tensor], Tensor], batch: Tensor
) -> tuple[Callable[[], None], torch.optim.Optimizer]:
    if isinstance(model, uu.TransformerDecoder):
        opt: torch.optim.Optimizer = uu.optim.AdamW(model.parameters(), lr=1e-3)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(batch).backward()
        opt.step()

    return step, opt


ROWS = (
    ("eager", "train step, eager (ms)", 1e3, "≤ 1.03"),
    ("compiled", "train step, compiled (ms)", 1e3, "≤ 1.02"),
    ("memory", "peak memory, eager (MiB)", 2**-20, "≤ 1.05"),
)


def measure(rounds: int = 40, compiled: bool = True) -> dict[str, list[float]]:
    """``[plain median, u-μP median, paired ratio]`` of each measure, taken in this
    process (seconds, or bytes for memory)."""
    torch.manual_seed(0)
    batch = torch.randint(VOCAB, (BATCH, SEQ + 1))
    plain = StandardTransformerDecoder(HIDDEN, VOCAB, LAYERS, HEADS)
    unit = uu.TransformerDecoder(HIDDEN, VOCAB, LAYERS, HEADS)
    results = {}

    steps = {
        "plain": _train_step(plain, plain.loss, batch),
        "u-μP": _train_step(unit, unit.loss, batch),
    }
    eager = interleaved_times({k: s for k, (s, _) in steps.items()}, rounds)
    results["eager"] = _summary(eager)

    if compiled:
        loss_plain = torch.compile(plain.loss, fullgraph=True)
        loss_unit = torch.compile(unit.loss, fullgraph=True)
        compiled_steps = {
            "plain": _train_step(plain, loss_plain, batch)[0],
            "u-μP": _train_step(unit, loss_unit, batch)[0],
        }
        results["compiled"] = _summary(
            interleaved_times(compiled_steps, rounds, warmup=3)
        )

    models = {"plain": plain, "u-μP": unit}
    memory = {
        name: [float(peak_memory_bytes(step, models[name], opt))]
        for name, (step, opt) in steps.items()
    }
    results["memory"] = _summary(memory)
    return results


def _summary(values: dict[str, list[float]]) -> list[float]:
    """Both medians, and the median of the paired (same-round) ratios."""
    return [
        statistics.median(values["plain"]),
        statistics.median(values["u-μP"]),
        paired_ratio(values, "u-μP", "plain"),
    ]


def run(rounds: int = 40, compiled: bool = True, processes: int = 1) -> str:
    """The benchmark's table, measured in this process or in ``processes`` fresh
    ones.

    Within one process the paired ratio is steady to about 1%, but on a shared VM
    it moves by several percent from one process to the next (memory layout,
    neighbours' load), so several processes give a truer figure: each row then
    shows medians over the processes and the range of their ratios.
    """
    if processes < 1:
        raise ValueError(f"processes={processes} must be at least 1")
    if processes == 1:
        per_process = [measure(rounds, compiled)]
    else:
        per_process = [
            _measure_in_subprocess(rounds, compiled) for _ in range(processes)
        ]
    rows = []
    for key, label, unit, target in ROWS:
        if key not in per_process[0]:
            continue
        plain, ours, ratio = (
            statistics.median(p[key][i] for p in per_process) for i in range(3)
        )
        row = [label, f"{plain * unit:.1f}", f"{ours * unit:.1f}", f"{ratio:.3f}"]
        if processes > 1:
            ratios = sorted(p[key][2] for p in per_process)
            row.append(f"{ratios[0]:.3f}–{ratios[-1]:.3f}")
        rows.append((*row, target))
    headers = ["measure", "plain torch", "u-μP", "ratio"]
    if processes > 1:
        headers.append("ratio range")
    where = f"medians over {processes} processes of " if processes > 1 else ""
    return (
        f"Training step: hidden={HIDDEN} vocab={VOCAB} layers={LAYERS} heads={HEADS},"
        f" batch=({BATCH}, {SEQ}), {torch.get_num_threads()} threads, {where}"
        f"medians of {rounds} interleaved steps; ratio: median of the {rounds} "
        "same-round ratios\n" + table(rows, (*headers, "target"))
    )


def _measure_in_subprocess(rounds: int, compiled: bool) -> dict[str, list[float]]:
    """:func:`measure` in a fresh interpreter."""
    args = ["--json", "--rounds", str(rounds), *([] if compiled else ["--no-compile"])]
    module = "benchmarks.train_step"  # not __name__: that is "__main__" when run
    result: dict[str, list[float]] = json_from_subprocess(module, *args)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="measure in this many fresh processes and report medians over them",
    )
    parser.add_argument(
        "--json", action="store_true", help=argparse.SUPPRESS
    )  # one process's raw numbers, for run(processes > 1)
    args = parser.parse_args()
    if args.json:
        print(json.dumps(measure(args.rounds, compiled=not args.no_compile)))
    else:
        print(run(args.rounds, compiled=not args.no_compile, processes=args.processes))
