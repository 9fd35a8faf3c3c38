"""Cost of the scale monitor: a training step with a :class:`Monitor` attached,
on a step that records and on one that does not, against the same step without
a monitor.

Models: the u-μP decoder (width 256, 4 layers, 4 heads, vocabulary 256) eager and
compiled, and a ``unit_scale``d GPT-2-style model of the same size (eager: its
captured graphs run as they are); batch 8 × 128 tokens; ``uu.optim.AdamW``.
Three copies of each model with equal weights step side by side, interleaved:
without a monitor, with one that does not record this step, with one that
records every step (every kind of tensor). Targets: a non-recording step ≤ 1.02×,
a recording step ≤ 1.3× (its peak memory ≤ 1.2×), and the average step at
``every=100`` — ``(99 · non-recording + recording) / 100`` — ≤ 1.02×.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import warnings
from collections.abc import Callable

import torch
from torch import Tensor, nn

import unit_scaling as uu
from unit_scaling.monitor import Monitor

from ._measure import interleaved_times, paired_ratio, peak_memory_bytes, table

HIDDEN, VOCAB, LAYERS, HEADS = 256, 256, 4, 4
BATCH, SEQ = 8, 128
NEVER = 10**9  # a monitor this rare never records after its first step


def _gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    from unit_scaling.transforms import unit_scale

    config = GPT2Config(
        n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, vocab_size=VOCAB, n_positions=SEQ
    )
    model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"  # (else its forward logs: a graph break)
    return unit_scale(model, residual_scaling="u-μP")


def _loss(model: nn.Module) -> Callable[[Tensor], Tensor]:
    if isinstance(model, uu.TransformerDecoder):
        return model.loss
    return lambda batch: model(input_ids=batch[:, :-1], labels=batch[:, :-1]).loss


def _steps(
    make: Callable[[], nn.Module], compiled: bool
) -> dict[str, tuple[Callable[[], None], nn.Module, torch.optim.Optimizer]]:
    torch.manual_seed(0)
    batch = torch.randint(VOCAB, (BATCH, SEQ + 1))
    base = make()
    steps = {}
    for name, every in (("plain", None), ("quiet", NEVER), ("recording", 1)):
        model = copy.deepcopy(base)
        opt = uu.optim.AdamW(model.parameters(), lr=1e-3)
        if every is not None:
            Monitor(
                model,
                every=every,
                optimizer=opt,
                start_step=1 if every == NEVER else 0,
                alerts=None,
            )
        loss = _loss(model)
        if compiled:
            loss = torch.compile(loss)

        def step(
            loss: Callable[[Tensor], Tensor] = loss, opt: torch.optim.Optimizer = opt
        ) -> None:
            opt.zero_grad(set_to_none=True)
            loss(batch).backward()
            opt.step()

        steps[name] = (step, model, opt)
    return steps


def measure(rounds: int, only: str = "") -> list[tuple[str, ...]]:
    """The table's rows: for each model and mode, the three medians and ratios."""
    rows: list[tuple[str, ...]] = []
    cases: list[tuple[str, Callable[[], nn.Module], bool]] = [
        (
            "u-μP decoder, eager",
            lambda: uu.TransformerDecoder(HIDDEN, VOCAB, LAYERS, HEADS),
            False,
        ),
        (
            "u-μP decoder, compiled",
            lambda: uu.TransformerDecoder(HIDDEN, VOCAB, LAYERS, HEADS),
            True,
        ),
        ("unit_scale GPT-2, eager", _gpt2, False),
    ]
    for label, make, compiled in cases:
        if only not in label:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            steps = _steps(make, compiled)
            times = interleaved_times({k: s for k, (s, _, _) in steps.items()}, rounds)
            memory = {
                k: peak_memory_bytes(s, m, o)
                for k, (s, m, o) in steps.items()
                # (a transformed model cannot be called under the tracker's
                # dispatch mode for a new capture)
                if k != "quiet" and not compiled and "unit_scale" not in label
            }
        quiet = paired_ratio(times, "quiet", "plain")
        recording = paired_ratio(times, "recording", "plain")
        average = (99 * quiet + recording) / 100
        plain_ms = statistics.median(times["plain"]) * 1e3
        mem = f"{memory['recording'] / memory['plain']:.3f}" if memory else "-"
        rows.append(
            (
                label,
                f"{plain_ms:.1f}",
                f"{quiet:.3f}",
                f"{recording:.3f}",
                f"{average:.3f}",
                mem,
            )
        )
    return rows


def run(rounds: int = 20) -> str:
    """The benchmark's table."""
    rows = measure(rounds)
    return (
        f"Scale monitor: width {HIDDEN}, {LAYERS} layers, batch ({BATCH}, {SEQ}), "
        f"{torch.get_num_threads()} threads, {rounds} interleaved rounds; ratios: "
        "medians of same-round ratios to the step without a monitor\n"
        + table(
            rows,
            (
                "model",
                "plain step (ms)",
                "quiet step (≤ 1.02)",
                "recording step (≤ 1.3)",
                "every=100 (≤ 1.02)",
                "recording peak memory (≤ 1.2)",
            ),
        )
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    print(run(parser.parse_args().rounds))
