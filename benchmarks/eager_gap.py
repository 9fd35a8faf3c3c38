"""Where the eager training step's overhead comes from: swap u-μP ops for plain ones.

The training step of :mod:`benchmarks.train_step` (u-μP decoder against the same
model in plain torch) is timed again with groups of u-μP ops replaced by their
plain counterparts, so each group's share of the eager overhead shows as the
drop in the ratio. A swap changes the model's numerics (it is no longer u-μP):
this is a diagnostic of where time goes, not a model to train.

Each configuration runs in its own fresh process, and the configurations take
turns, so that process-to-process variation (a few percent on a shared VM) spreads
over all of them alike. Run: ``python -m benchmarks.eager_gap``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch.nn.functional as F
from torch import Tensor

import unit_scaling as uu
import unit_scaling.functional as U

from ._measure import json_from_subprocess, table


def _plain_linear(self: uu.Linear, input: Tensor) -> Tensor:
    return F.linear(input, self.weight, self.bias)


def _plain_residual(fn: Callable[[Tensor], Tensor], input: Tensor, tau: float) -> Any:
    return input + fn(input)


def _plain_attention(q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> Tensor:
    return F.scaled_dot_product_attention(
        q, k, v, dropout_p=kwargs["dropout_p"], is_causal=kwargs["is_causal"]
    )


def _plain_silu_glu(input: Tensor, gate: Tensor, mult: float) -> Tensor:
    return input * F.silu(gate)


def _plain_rms_norm(self: uu.RMSNorm, input: Tensor) -> Tensor:
    return F.rms_norm(input, self.normalized_shape, self.weight, self.eps)


def _plain_cross_entropy(input: Tensor, target: Tensor, mult: float) -> Tensor:
    return F.cross_entropy(input, target)


# Each group: the attributes the decoder looks up at call time, and their plain
# replacements.
SWAPS: dict[str, list[tuple[object, str, object]]] = {
    "linear": [(uu.Linear, "forward", _plain_linear)],
    "residual": [(U, "residual_apply", _plain_residual)],
    "attention, SwiGLU": [
        (U, "scaled_dot_product_attention", _plain_attention),
        (U, "silu_glu", _plain_silu_glu),
    ],
    "norm, dropout, loss": [
        (uu.RMSNorm, "forward", _plain_rms_norm),
        (uu.Dropout, "forward", lambda self, input: input),
        (U, "cross_entropy", _plain_cross_entropy),
    ],
}

CONFIGS: dict[str, tuple[str, ...]] = {
    "u-μP as is": (),
    "plain linear": ("linear",),
    "plain residual": ("residual",),
    "plain attention, SwiGLU": ("attention, SwiGLU",),
    "all four groups plain": tuple(SWAPS),
}


@contextlib.contextmanager
def swapped(groups: tuple[str, ...]) -> Iterator[None]:
    """Within the block, the u-μP ops of ``groups`` (keys of :data:`SWAPS`) are
    replaced by plain torch; everything is restored on exit."""
    unknown = [g for g in groups if g not in SWAPS]
    if unknown:
        raise ValueError(f"unknown swap groups {unknown}; expected some of {[*SWAPS]}")
    with contextlib.ExitStack() as stack:
        for group in groups:
            for owner, name, replacement in SWAPS[group]:
                stack.enter_context(mock.patch.object(owner, name, replacement))
        yield


def run(rounds: int = 30, processes: int = 2, configs: list[str] | None = None) -> str:
    """The table: for each configuration the median over ``processes`` fresh
    processes of the paired eager step ratio (u-μP / plain), and their range."""
    names = list(CONFIGS) if configs is None else configs
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        raise ValueError(f"unknown configs {unknown}; expected some of {[*CONFIGS]}")
    if processes < 1:
        raise ValueError(f"processes={processes} must be at least 1")
    ratios: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(processes):
        for name in names:
            ratios[name].append(_ratio_in_subprocess(name, rounds))
    baseline = statistics.median(ratios[names[0]])
    rows: list[tuple[str, ...]] = []
    for name in names:
        median = statistics.median(ratios[name])
        rows.append(
            (
                name,
                f"{median:.3f}",
                f"{min(ratios[name]):.3f}–{max(ratios[name]):.3f}",
                f"{(baseline - median) * 100:+.1f}" if name != names[0] else "",
            )
        )
    return (
        "Eager train step, u-μP / plain torch, with u-μP op groups swapped for plain "
        f"ones; medians over {processes} process{'es' if processes > 1 else ''} of "
        f"the median of {rounds} "
        "same-round ratios\n"
        + table(rows, ("configuration", "ratio", "range", f"points vs {names[0]}"))
    )


def _ratio_in_subprocess(config: str, rounds: int) -> float:
    args = ("--json", config, "--rounds", str(rounds))
    ratio: float = json_from_subprocess("benchmarks.eager_gap", *args)
    return ratio


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument(
        "--configs", nargs="+", choices=list(CONFIGS), help="default: all"
    )
    parser.add_argument(
        "--json", metavar="CONFIG", help=argparse.SUPPRESS
    )  # one configuration's ratio in this process, for run()
    args = parser.parse_args()
    if args.json is not None:
        from .train_step import measure

        with swapped(CONFIGS[args.json]):
            print(json.dumps(measure(args.rounds, compiled=False)["eager"][2]))
    else:
        print(run(args.rounds, args.processes, args.configs))
