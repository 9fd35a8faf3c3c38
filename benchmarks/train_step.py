"""Training-step speed and peak memory: u-μP decoder vs the same model in plain torch.

Both models: embedding, pre-norm RMSNorm, fused-QKV causal attention through
``F.scaled_dot_product_attention``, SwiGLU MLP, readout, cross-entropy, AdamW —
same shapes, same batch. Targets: time ratio ≤ 1.03 eager and ≤ 1.02 compiled,
peak memory ratio ≤ 1.05.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch
from torch import Tensor, nn

import unit_scaling as uu
from unit_scaling.baseline import StandardTransformerDecoder

from ._measure import interleaved_times, paired_ratio, peak_memory_bytes, table

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


def run(rounds: int = 40, compiled: bool = True) -> str:
    torch.manual_seed(0)
    batch = torch.randint(VOCAB, (BATCH, SEQ + 1))
    plain = StandardTransformerDecoder(HIDDEN, VOCAB, LAYERS, HEADS)
    unit = uu.TransformerDecoder(HIDDEN, VOCAB, LAYERS, HEADS)
    rows = []

    steps = {
        "plain": _train_step(plain, plain.loss, batch),
        "u-μP": _train_step(unit, unit.loss, batch),
    }
    eager = interleaved_times({k: s for k, (s, _) in steps.items()}, rounds)
    rows.append(_row("train step, eager (ms)", eager, 1e3, "≤ 1.03"))

    if compiled:
        loss_plain = torch.compile(plain.loss, fullgraph=True)
        loss_unit = torch.compile(unit.loss, fullgraph=True)
        compiled_steps = {
            "plain": _train_step(plain, loss_plain, batch)[0],
            "u-μP": _train_step(unit, loss_unit, batch)[0],
        }
        times = interleaved_times(compiled_steps, rounds, warmup=3)
        rows.append(_row("train step, compiled (ms)", times, 1e3, "≤ 1.02"))

    models = {"plain": plain, "u-μP": unit}
    memory = {
        name: [float(peak_memory_bytes(step, models[name], opt))]
        for name, (step, opt) in steps.items()
    }
    rows.append(_row("peak memory, eager (MiB)", memory, 2**-20, "≤ 1.05"))
    return (
        f"Training step: hidden={HIDDEN} vocab={VOCAB} layers={LAYERS} heads={HEADS},"
        f" batch=({BATCH}, {SEQ}), {torch.get_num_threads()} threads, "
        f"medians of {rounds} interleaved steps; ratio: median of the {rounds} "
        "same-round ratios\n"
        + table(rows, ("measure", "plain torch", "u-μP", "ratio", "target"))
    )


def _row(
    label: str, values: dict[str, list[float]], unit: float, target: str
) -> tuple[str, ...]:
    """Medians of both, and the median of the paired (same-round) ratios."""
    plain, ours = (statistics.median(values[k]) for k in ("plain", "u-μP"))
    return (
        label,
        f"{plain * unit:.1f}",
        f"{ours * unit:.1f}",
        f"{paired_ratio(values, 'u-μP', 'plain'):.3f}",
        target,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--no-compile", action="store_true")
    args = parser.parse_args()
    print(run(args.rounds, compiled=not args.no_compile))
