"""Cost of the graph transforms.

1. ``unit_scale`` on a GPT-2-small config (12 layers, width 768, 1x128 tokens):
   time to first output (transform + capture + first forward; target ≤ 5 s) and
   steady forward time against the untransformed model (target ≤ 1.05x).
2. ``simulate_fp8`` training step of the u-μP benchmark decoder against the same
   step unsimulated (target ≤ 1.3x).
3. ``track_scales`` forward+backward of that decoder against the untracked one:
   time (target ≤ 1.3x) and peak memory (target ≤ 1.2x).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

import unit_scaling as uu
from unit_scaling import zoo
from unit_scaling.transforms import simulate_fp8, track_scales, unit_scale

from ._measure import interleaved_times, paired_ratio, peak_memory_bytes, table

HIDDEN, VOCAB, LAYERS, HEADS = 256, 256, 4, 4
BATCH, SEQ = 8, 128


def _gpt2_rows(rounds: int) -> list[tuple[str, ...]]:
    try:
        import transformers  # noqa: F401
    except ImportError:  # pragma: no cover - transformers is a dev extra
        return [("GPT-2 small", "skipped: transformers not installed", "", "", "")]
    torch.manual_seed(0)
    model = zoo.hf_model("gpt2", "small", use_cache=False).eval()
    ids = torch.randint(model.config.vocab_size, (1, 128))
    with torch.no_grad():
        start = time.perf_counter()
        transformed = unit_scale(model)
        transformed(ids)
        first_output = time.perf_counter() - start
        times = interleaved_times(
            {"plain": lambda: model(ids), "unit_scale": lambda: transformed(ids)},
            rounds,
        )
    return [
        (
            "GPT-2 small: unit_scale time to first output (s)",
            "",
            f"{first_output:.2f}",
            "",
            "≤ 5 s",
        ),
        _time_row(
            "GPT-2 small: steady forward (ms)", times, "plain", "unit_scale", "≤ 1.05"
        ),
    ]


def _decoder_step(
    model: nn.Module, batch: torch.Tensor, optimizer: torch.optim.Optimizer | None
) -> Callable[[], None]:
    loss_fn = model.loss if hasattr(model, "loss") else None
    assert loss_fn is not None

    def step() -> None:
        loss_fn(batch).backward()
        if optimizer is not None:
            optimizer.step()
        model.zero_grad(set_to_none=True)

    return step


def _decoder_rows(rounds: int) -> list[tuple[str, ...]]:
    torch.manual_seed(0)
    batch = torch.randint(VOCAB, (BATCH, SEQ + 1))
    model = uu.TransformerDecoder(HIDDEN, VOCAB, LAYERS, HEADS)
    fp8 = simulate_fp8(model)
    base_opt = uu.optim.AdamW(model.parameters(), lr=1e-3)
    fp8_opt = uu.optim.AdamW(fp8.parameters(), lr=1e-3)
    times = interleaved_times(
        {
            "fp32": _decoder_step(model, batch, base_opt),
            "fp8": _decoder_step(fp8, batch, fp8_opt),
        },
        rounds,
    )
    label = "decoder: simulate_fp8 training step (ms)"
    rows = [_time_row(label, times, "fp32", "fp8", "≤ 1.3")]

    untracked = copy.deepcopy(model)
    tracked = track_scales(model)
    steps = {
        "untracked": _decoder_step(untracked, batch, None),
        "tracked": _decoder_step(tracked, batch, None),
    }
    times = interleaved_times(steps, rounds)
    label = "decoder: track_scales fwd+bwd (ms)"
    rows.append(_time_row(label, times, "untracked", "tracked", "≤ 1.3"))
    memory = {
        name: peak_memory_bytes(step, steps_model)
        for (name, step), steps_model in zip(
            steps.items(), (untracked, tracked), strict=True
        )
    }
    rows.append(
        (
            "decoder: track_scales peak memory (MiB)",
            f"{memory['untracked'] / 2**20:.1f}",
            f"{memory['tracked'] / 2**20:.1f}",
            f"{memory['tracked'] / memory['untracked']:.3f}",
            "≤ 1.2",
        )
    )
    return rows


def _time_row(
    label: str, times: dict[str, list[float]], baseline: str, ours: str, target: str
) -> tuple[str, ...]:
    """Medians in ms, and the median of the same-round ratios."""
    return (
        label,
        f"{statistics.median(times[baseline]) * 1e3:.1f}",
        f"{statistics.median(times[ours]) * 1e3:.1f}",
        f"{paired_ratio(times, ours, baseline):.3f}",
        target,
    )


def run(rounds: int = 20) -> str:
    rows = _gpt2_rows(rounds) + _decoder_rows(rounds)
    return (
        f"Transforms ({torch.get_num_threads()} threads, medians of {rounds} "
        "interleaved calls; ratio: median of the same-round ratios)\n"
        + table(rows, ("measure", "baseline", "transformed", "ratio", "target"))
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    print(run(parser.parse_args().rounds))
