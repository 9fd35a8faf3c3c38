"""Run every benchmark and print its table: ``python -m benchmarks`` (``make bench``).

Each benchmark measures our code and its plain-PyTorch baseline side by side in
one process, interleaved, and reports medians and their ratio.
"""

from __future__ import annotations

import argparse

from . import (
    block_formats,
    float8,
    float8_ops,
    formats,
    monitor,
    op_counts,
    train_step,
    trainer_step,
    transforms,
)

SECTIONS = {
    # The train step's ratio shifts by a few percent between processes on a shared
    # VM; medians over three fresh processes are steadier than any one of them.
    "train_step": lambda quick: train_step.run(
        rounds=10 if quick else 40, processes=1 if quick else 3
    ),
    # Kernels per step, counted (deterministic: --quick changes nothing).
    "op_counts": lambda quick: op_counts.run(),
    "formats": lambda quick: formats.run(),
    "transforms": lambda quick: transforms.run(rounds=5 if quick else 20),
    # unit_scaling.float8 against torchao.float8; --quick: eager only.
    "float8": lambda quick: float8.run(
        rounds=3 if quick else 30, compiled=not quick, processes=1 if quick else 3
    ),
    # Casts, transposes and copies per FP8 linear per step: counts, no timing.
    "float8_ops": lambda quick: float8_ops.run(),
    # The scale monitor's cost: quiet, recording and average steps.
    "monitor": lambda quick: monitor.run(rounds=4 if quick else 20),
    # Block-scaled formats: a step under MXFP8/MXFP4/NVFP4 against simulate_fp8.
    "block_formats": lambda quick: block_formats.run(rounds=3 if quick else 10),
    # Hugging Face Trainer: UnitScalingTrainer's step against a stock Trainer's.
    "trainer_step": lambda quick: trainer_step.run(rounds=3 if quick else 20),
}

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "sections",
        nargs="*",
        choices=[*SECTIONS, []],
        help="benchmarks to run (default: all)",
    )
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    args = parser.parse_args()
    for name in args.sections or list(SECTIONS):
        print(SECTIONS[name](args.quick), end="\n\n", flush=True)
