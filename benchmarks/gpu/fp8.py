"""Section (b): real FP8's accuracy on the GPU, and a short training run.

1. **SQNRs** of :func:`unit_scaling.float8.linear` (``linear_readout`` for the
   readout) at every linear layer's shape of ``benchmarks/float8_gpu.py``'s
   decoder: its output, input gradient and weight gradient against the same
   unit-scaled function in float32 (TF32 off), with the bars
   ``tests/test_float8.py`` asserts on the CPU (18, 17, 17 dB); and against
   the simulation (operands rounded to E4M3, the output gradient to E5M2, the
   GEMM in float32), which differs only in the order of accumulation. Then a
   converted ``uu.TransformerDecoder``'s logits and weight gradients against the
   unconverted one (bars 18 and 17 dB).
2. **Training**: the u-μP decoder on the built-in byte corpus, bf16 autocast,
   from the same seed on the same batches, unconverted and converted
   (``convert_to_float8_training``), eager; the final losses and their gap
   (``docs/results/real_fp8.md`` holds the CPU experiment's ±1% bar).
"""

from __future__ import annotations

import copy
import time
from typing import Any

import torch
from torch import Tensor

import unit_scaling as uu
import unit_scaling.functional as U
from unit_scaling import float8
from unit_scaling.float8 import convert_to_float8_training
from unit_scaling.formats import FP8_E4M3, FP8_E5M2

from ..float8_gpu import Shapes, fp8_gpu_problem
from ._common import (
    Deadline,
    SectionResult,
    Settings,
    Target,
    markdown_table,
    seeded_randn,
    short,
    sqnr,
    turn_off_tf32,
)

LINEAR_BARS = (18.0, 17.0, 17.0)  # output, input gradient, weight gradient (dB)
DECODER_BARS = (18.0, 17.0)  # logits, weight gradients (dB)
LOSS_BAR = 0.01  # |FP8 / bf16 - 1| of the final validation loss


def sqnr_shapes(settings: Settings) -> Shapes:
    """``benchmarks/float8_gpu.py``'s shapes (tiny ones in ``--cpu-check``)."""
    if settings.cpu_check:
        return Shapes(width=64, layers=1, heads=2, vocab=256, seq=32, batch=2)
    return Shapes()


def _simulated(readout: bool) -> Any:
    exact = U.linear_readout if readout else U.linear

    def fn(x: Tensor, w: Tensor) -> Tensor:
        rounded = exact(FP8_E4M3.quantise_fwd(x), FP8_E4M3.quantise_fwd(w))
        return FP8_E5M2.quantise_bwd(rounded)

    return fn


def _grads(fn: Any, x: Tensor, w: Tensor, g: Tensor) -> tuple[Tensor, ...]:
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    y = fn(x, w)
    y.backward(g)
    assert x.grad is not None and w.grad is not None
    return y.detach(), x.grad, w.grad


def linear_sqnrs(shapes: Shapes, device: torch.device) -> list[dict[str, Any]]:
    """Per linear layer: SQNRs of (output, input grad, weight grad), real FP8
    against float32 and against the simulation."""
    rows = []
    for i, (name, k, n) in enumerate(shapes.linears()):
        readout = name == "readout"
        x = seeded_randn(shapes.tokens, k, seed=3 * i, device=device)
        w = seeded_randn(n, k, seed=3 * i + 1, device=device)
        g = seeded_randn(shapes.tokens, n, seed=3 * i + 2, device=device)
        real_fn = float8.linear_readout if readout else float8.linear
        exact_fn = U.linear_readout if readout else U.linear
        real = _grads(real_fn, x, w, g)
        exact = _grads(exact_fn, x, w, g)
        simulated = _grads(_simulated(readout), x, w, g)
        rows.append(
            {
                "layer": name,
                "shape": f"{shapes.tokens}×{k} · ({n}×{k})ᵀ",
                "vs_float32": [sqnr(a, b) for a, b in zip(real, exact, strict=True)],
                "vs_simulated": [
                    sqnr(a, b) for a, b in zip(real, simulated, strict=True)
                ],
            }
        )
        del x, w, g, real, exact, simulated
    return rows


def decoder_sqnrs(settings: Settings, device: torch.device) -> dict[str, Any]:
    """A converted decoder's logits and worst weight gradient against the
    unconverted one (same weights, float32, no autocast)."""
    if settings.cpu_check:
        width, vocab, layers, heads, batch, seq = 64, 256, 2, 4, 2, 32
    else:
        width, vocab, layers, heads, batch, seq = 1024, 32768, 2, 8, 4, 512
    torch.manual_seed(0)
    exact = uu.TransformerDecoder(width, vocab, layers, heads).to(device)
    real = convert_to_float8_training(copy.deepcopy(exact))
    tokens = torch.randint(
        vocab, (batch, seq + 1), generator=torch.Generator().manual_seed(0)
    ).to(device)
    logits = sqnr(real(tokens[:, :-1]), exact(tokens[:, :-1]))
    grads = []
    for model in (exact, real):
        model.zero_grad(set_to_none=True)
        model.loss(tokens).backward()  # type: ignore[no-untyped-call]
        grads.append(
            {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        )
    weights = {n: sqnr(grads[1][n], g) for n, g in grads[0].items() if g.dim() == 2}
    worst = min(weights, key=weights.__getitem__)
    return {
        "shape": f"width {width}, {layers} layers, vocab {vocab}, {batch}×{seq} tokens",
        "logits": logits,
        "worst_weight_grad": weights[worst],
        "worst_weight": worst,
    }


def training_run(
    settings: Settings, device: torch.device, deadline: Deadline
) -> dict[str, Any]:
    """bf16 and FP8 from the same seed on the same batches; final losses."""
    from unit_scaling.data import Corpus

    if settings.cpu_check:
        width, layers, heads, batch, seq, steps = 64, 2, 4, 4, 32, 6
    else:
        width, layers, heads, batch, seq, steps = 512, 4, 8, 16, 256, 200
    corpus = Corpus(max_bytes=2**18 if settings.cpu_check else 2**22)
    validation = [
        corpus.get_batch("validation", batch, seq, generator=1000 + i, device=device)
        for i in range(4)
    ]
    runs: dict[str, Any] = {}
    # Half the budget left each: both runs must finish to be compared.
    share = deadline.left() / 2
    for label in ("bf16", "FP8"):
        torch.manual_seed(0)
        model = uu.TransformerDecoder(width, 256, layers, heads).to(device)
        if label == "FP8":
            convert_to_float8_training(model)
        optimizer = uu.optim.AdamW(model.parameters(), lr=2**-3)
        generator = torch.Generator().manual_seed(0)
        losses: list[Tensor] = []
        begin = time.perf_counter()
        for _ in range(steps):
            if time.perf_counter() - begin > share:
                break
            tokens = corpus.get_batch("train", batch, seq, generator=generator)
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = model.loss(tokens.to(device))
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.detach())
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16):
            held_out = sum(float(model.loss(b)) for b in validation) / len(validation)
        train = [float(x) for x in losses]
        runs[label] = {
            "steps": len(train),
            "train_loss_last_20": sum(train[-20:]) / max(len(train[-20:]), 1),
            "validation_loss": held_out,
            "seconds": time.perf_counter() - begin,
        }
    return {
        "config": f"u-μP decoder width {width}, {layers} layers, {heads} heads, "
        f"byte corpus, {batch}×{seq} tokens a step, uu.optim.AdamW lr 2^-3, "
        f"bf16 autocast, eager, up to {steps} steps",
        "runs": runs,
    }


def run(settings: Settings, deadline: Deadline) -> SectionResult:
    """SQNRs, then the training run; FP8 needs an sm89+ GPU (or --cpu-check)."""
    device = settings.device
    problem = None if settings.cpu_check else fp8_gpu_problem()
    targets: list[Target] = []
    if problem is not None:
        text = f"Not measured: {problem}."
        return SectionResult("fp8", {"not_measured": problem}, text, targets)
    turn_off_tf32()
    data: dict[str, Any] = {}
    lines = []
    try:
        shapes = sqnr_shapes(settings)
        data["linears"] = linear_sqnrs(shapes, device)
        rows = []
        for r in data["linears"]:
            met = all(
                s >= bar for s, bar in zip(r["vs_float32"], LINEAR_BARS, strict=True)
            )
            rows.append(
                (
                    r["layer"],
                    r["shape"],
                    *(f"{s:.1f}" for s in r["vs_float32"]),
                    "yes" if met else "**no**",
                    f"{min(r['vs_simulated']):.1f}",
                )
            )
        lines += [
            "SQNR (dB) of one FP8 linear against float32 (bars from "
            "`tests/test_float8.py`: 18, 17, 17) and, lowest of the three, "
            "against the simulated FP8 GEMM:",
            "",
            markdown_table(
                (
                    "layer",
                    "shape",
                    "output",
                    "input grad",
                    "weight grad",
                    "bars met",
                    "vs simulated (min)",
                ),
                rows,
            ),
        ]
        decoder = data["decoder"] = decoder_sqnrs(settings, device)
        met = (
            decoder["logits"] >= DECODER_BARS[0]
            and decoder["worst_weight_grad"] >= DECODER_BARS[1]
        )
        lines += [
            "",
            f"Converted decoder ({decoder['shape']}) against float32: logits "
            f"{decoder['logits']:.1f} dB (bar 18), lowest weight gradient "
            f"{decoder['worst_weight_grad']:.1f} dB (`{decoder['worst_weight']}`, "
            f"bar 17): {'met' if met else 'not met'}.",
        ]
    except Exception as error:  # a failure is reported, the section goes on
        data["sqnr_error"] = short(f"{type(error).__name__}: {error}", 300)
        lines += [f"SQNRs failed: {data['sqnr_error']}"]
    try:
        training = data["training"] = training_run(settings, device, deadline)
        bf16, fp8 = training["runs"]["bf16"], training["runs"]["FP8"]
        gap = fp8["validation_loss"] / bf16["validation_loss"] - 1
        training["gap"] = gap
        rows = [
            (
                label,
                r["steps"],
                f"{r['train_loss_last_20']:.4f}",
                f"{r['validation_loss']:.4f}",
                f"{r['seconds']:.1f}",
            )
            for label, r in training["runs"].items()
        ]
        lines += [
            "",
            f"Training ({training['config']}):",
            "",
            markdown_table(
                ("run", "steps", "train loss (last 20)", "validation loss", "s"),
                rows,
            ),
            "",
            f"FP8 ÷ bf16 validation loss: {gap:+.2%} (the CPU experiment's bar "
            f"±{LOSS_BAR:.0%}: {'within' if abs(gap) <= LOSS_BAR else 'outside'}).",
        ]
    except Exception as error:
        data["training_error"] = short(f"{type(error).__name__}: {error}", 300)
        lines += ["", f"Training failed: {data['training_error']}"]
    return SectionResult("fp8", data, "\n".join(lines), targets)
