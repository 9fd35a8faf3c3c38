"""Cost of simulating block-scaled formats: a training step under a recipe
against the same step under :func:`~unit_scaling.transforms.simulate_fp8`.

The u-μP decoder (width 256, 4 layers, 4 heads, vocabulary 256), eager CPU,
batch 8 × 128 tokens, ``uu.optim.AdamW``. Every variant quantises the same
products (the linear layers, the readout and attention's two products) except
NVFP4, whose recipe quantises the linear layers only (as NVIDIA's does). Targets:
MXFP8 ≤ 1.5× ``simulate_fp8``; NVFP4 with its recipe ≤ 2×. The step without any
quantisation is shown for scale.
"""

from __future__ import annotations

import argparse
import copy
import statistics
from collections.abc import Callable

import torch
from torch import nn

import unit_scaling as uu
from unit_scaling.formats import MXFP4_RECIPE, MXFP8_RECIPE, NVFP4_RECIPE, Recipe
from unit_scaling.transforms import simulate_format, simulate_fp8

from ._measure import interleaved_times, paired_ratio, table

HIDDEN, VOCAB, LAYERS, HEADS = 256, 256, 4, 4
BATCH, SEQ = 8, 128
TARGETS = {"MXFP8": 1.5, "NVFP4 (NVIDIA's recipe)": 2.0}


def _variants() -> dict[str, Callable[[nn.Module], nn.Module]]:
    def recipe(r: Recipe) -> Callable[[nn.Module], nn.Module]:
        return lambda m: simulate_format(m, r)

    return {
        "no quantisation": lambda m: m,
        "simulate_fp8": simulate_fp8,
        "MXFP8": recipe(MXFP8_RECIPE),
        "MXFP4": recipe(MXFP4_RECIPE),
        "NVFP4 (NVIDIA's recipe)": recipe(NVFP4_RECIPE),
    }


def measure(rounds: int = 10) -> dict[str, list[float]]:
    """Seconds per step of each variant, interleaved."""
    torch.manual_seed(0)
    batch = torch.randint(VOCAB, (BATCH, SEQ + 1))
    base = uu.TransformerDecoder(
        HIDDEN, VOCAB, LAYERS, HEADS, **uu.RECOMMENDED.multipliers
    )
    steps: dict[str, Callable[[], object]] = {}
    for name, make in _variants().items():
        model = make(copy.deepcopy(base))
        opt = uu.optim.AdamW(model.parameters(), lr=1e-3)

        def step(model: nn.Module = model, opt: torch.optim.Optimizer = opt) -> None:
            opt.zero_grad(set_to_none=True)
            model.loss(batch).backward()  # type: ignore[operator]
            opt.step()

        steps[name] = step
    return interleaved_times(steps, rounds, warmup=2)


def run(rounds: int = 10) -> str:
    """Time every variant; return the table."""
    times = measure(rounds)
    rows = []
    for name, ts in times.items():
        ratio = paired_ratio(times, name, "simulate_fp8")
        per_round = sorted(
            a / b for a, b in zip(ts, times["simulate_fp8"], strict=True)
        )
        target = TARGETS.get(name)
        rows.append(
            (
                name,
                f"{statistics.median(ts) * 1e3:.0f}",
                f"{ratio:.2f} ({per_round[0]:.2f}–{per_round[-1]:.2f})",
                f"≤ {target}" if target else "",
                ("met" if ratio <= target else "missed") if target else "",
            )
        )
    return (
        f"Block-scaled formats: a u-μP decoder training step (width {HIDDEN}, "
        f"{LAYERS} layers, batch {BATCH}×{SEQ}), eager CPU, "
        f"{torch.get_num_threads()} threads, median of {rounds} interleaved steps\n"
        + table(
            rows,
            ("variant", "ms", "ratio to simulate_fp8 (range)", "target", ""),
        )
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=10)
    print(run(parser.parse_args().rounds))
