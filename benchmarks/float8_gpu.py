"""FP8 training speed on a CUDA GPU: static unit scales against bf16 and torchao.

Needs a CUDA GPU with FP8 tensor cores (compute capability 8.9 or newer: L4,
L40S, RTX 4090, H100, H200, B200...); elsewhere it says so and exits. Two
measurements, at a decoder's realistic shapes (width 2048, sequence 2048):

1. **Training steps** (forward, backward, AdamW; tokens/s from the median of
   ``--steps`` steps timed with CUDA events after ``--warmup`` steps), each
   eager and ``torch.compile``d:

   * bf16: ``torch.autocast(bfloat16)``, float32 weights, of the SP baseline
     (:class:`~unit_scaling.app.baseline.StandardTransformerDecoder`, plain
     ``nn.Linear``) and of the u-μP model (``uu.TransformerDecoder``);
   * ours: the u-μP model after
     :func:`unit_scaling.float8.convert_to_float8_training` (static scales: no
     amax), under the same autocast;
   * torchao's ``convert_to_float8_training`` of the SP baseline, tensorwise
     (dynamic per-tensor scales) and rowwise (dynamic per-row scales,
     ``Float8LinearConfig.from_recipe_name("rowwise")``).

   Every linear layer is converted, the readout included, in both libraries.

2. **GEMMs**: TFLOP/s of ``torch._scaled_mm`` against the bf16 ``torch.mm``
   at every linear layer's shapes, for its three GEMMs (forward E4M3 × E4M3,
   input gradient and weight gradient E5M2 × E4M3, as ours runs them), operands
   prepared beforehand: the GEMM alone.

Targets (issue 26): ours ≥ 1.3× bf16 (the same u-μP model) end to end when
compiled, ≥ 1.0× in eager mode, and ≥ 1.05× torchao tensorwise::

    python -m benchmarks.float8_gpu
    python -m benchmarks.float8_gpu --layers 2 --steps 10 --no-gemms
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

import unit_scaling as uu
from unit_scaling.app.baseline import StandardTransformerDecoder
from unit_scaling.float8 import convert_to_float8_training

from ._measure import table

# ours / u-μP bf16, tokens/s, by mode (compiled or not).
TARGET_VS_BF16 = {True: 1.3, False: 1.0}
TARGET_VS_TORCHAO = 1.05  # ours / torchao tensorwise, tokens/s
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


@dataclass(frozen=True)
class Shapes:
    """The decoder and its batch."""

    width: int = 2048
    layers: int = 4
    heads: int = 16
    vocab: int = 32768
    seq: int = 2048
    batch: int = 4

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    def linears(self) -> list[tuple[str, int, int]]:
        """``(name, in_features, out_features)`` of each distinct linear layer."""
        w = self.width
        return [
            ("linear_qkv", w, 3 * w),
            ("linear_o", w, w),
            ("linear_1, linear_gate", w, 4 * w),
            ("linear_2", 4 * w, w),
            ("readout", w, self.vocab),
        ]


@dataclass(frozen=True)
class Variant:
    """One way of training: a model, its precision and whether it is compiled."""

    name: str
    model: str  # "SP" or "u-μP"
    fp8: str | None  # None (bf16), "ours", "tensorwise" or "rowwise"
    compiled: bool

    @property
    def mode(self) -> str:
        return "compiled" if self.compiled else "eager"


VARIANTS = [
    Variant(name, model, fp8, compiled)
    for compiled in (False, True)
    for name, model, fp8 in (
        ("bf16", "SP", None),
        ("bf16", "u-μP", None),
        ("FP8 static unit scales (ours)", "u-μP", "ours"),
        ("torchao FP8 tensorwise", "SP", "tensorwise"),
        ("torchao FP8 rowwise", "SP", "rowwise"),
    )
]


@dataclass
class Result:
    variant: Variant
    step_s: float = float("nan")
    tokens_per_s: float = float("nan")
    peak_gib: float = float("nan")
    error: str | None = None


def fp8_gpu_problem() -> str | None:
    """Why this machine cannot run the benchmark, or None if it can."""
    if not torch.cuda.is_available():
        return "no CUDA GPU is available (torch.cuda.is_available() is False)"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < (8, 9):
        name = torch.cuda.get_device_name()
        return f"{name} has compute capability {major}.{minor}, without FP8 GEMMs"
    return None


# --------------------------------------------------------------------------- #
# Timing.
# --------------------------------------------------------------------------- #


def median_seconds(fn: Callable[[], object], warmup: int, repeats: int) -> float:
    """Median seconds of one call of ``fn`` after ``warmup`` calls.

    On a GPU each call sits between two CUDA events, all recorded without
    waiting and read after one final synchronisation, so the CPU queues calls
    ahead as in training (an event pair spans the GPU's idle time too, where
    launching is the bottleneck). Elsewhere: ``time.perf_counter``.
    """
    for _ in range(warmup):
        fn()
    if not torch.cuda.is_available():
        times = []
        for _ in range(repeats):
            begin = time.perf_counter()
            fn()
            times.append(time.perf_counter() - begin)
        return statistics.median(times)
    torch.cuda.synchronize()
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))  # type: ignore[no-untyped-call]
        for _ in range(repeats)
    ]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(
        float(start.elapsed_time(end)) / 1e3 for start, end in events
    )


# --------------------------------------------------------------------------- #
# Training steps.
# --------------------------------------------------------------------------- #


def build(
    variant: Variant, shapes: Shapes, device: torch.device
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The model of ``variant`` on ``device`` (float32 weights), and its AdamW."""
    torch.manual_seed(0)
    sizes = (shapes.width, shapes.vocab, shapes.layers, shapes.heads)
    model: nn.Module
    if variant.model == "u-μP":
        model = uu.TransformerDecoder(*sizes).to(device)
    else:
        model = StandardTransformerDecoder(*sizes).to(device)
    if variant.fp8 == "ours":
        convert_to_float8_training(model)
    elif variant.fp8 in ("tensorwise", "rowwise"):
        from torchao.float8 import Float8LinearConfig
        from torchao.float8 import convert_to_float8_training as torchao_convert

        config = Float8LinearConfig.from_recipe_name(variant.fp8)
        torchao_convert(model, config=config)
    optimizer: torch.optim.Optimizer
    if variant.model == "u-μP":
        optimizer = uu.optim.AdamW(model.parameters(), lr=1e-3)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, optimizer


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Tensor,
    compiled: bool,
    backend: str = "inductor",
) -> Callable[[], None]:
    """One bf16-autocast training step of ``model`` on ``batch`` (its loss
    compiled with ``backend`` if ``compiled``)."""
    loss_fn: Callable[[Tensor], Tensor] = model.loss  # type: ignore[assignment]
    if compiled:
        loss_fn = torch.compile(loss_fn, backend=backend)
    device = batch.device.type

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = loss_fn(batch)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()

    return step


def measure_training(
    variant: Variant,
    shapes: Shapes,
    device: torch.device,
    warmup: int,
    steps: int,
    backend: str = "inductor",
) -> Result:
    """Tokens/s and peak memory of ``variant``; a failure is recorded, not raised.
    ``backend``: ``torch.compile``'s, for the compiled variants."""
    result = Result(variant)
    model = optimizer = None
    try:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        model, optimizer = build(variant, shapes, device)
        batch = torch.randint(shapes.vocab, (shapes.batch, shapes.seq + 1))
        step = train_step(model, optimizer, batch.to(device), variant.compiled, backend)
        # The compiled step compiles in its first calls: warm up longer.
        extra = 3 if variant.compiled else 0
        result.step_s = median_seconds(step, warmup + extra, steps)
        result.tokens_per_s = shapes.tokens / result.step_s
        if device.type == "cuda":
            result.peak_gib = torch.cuda.max_memory_allocated() / 2**30
    except Exception as error:  # one failing variant must not stop the others
        message = f"{type(error).__name__}: {error}".splitlines()[0]
        result.error = message[:100]
    finally:
        del model, optimizer
        torch._dynamo.reset()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return result


def training_table(results: list[Result], shapes: Shapes) -> str:
    bf16 = {
        (r.variant.model, r.variant.compiled): r.tokens_per_s
        for r in results
        if r.variant.fp8 is None
    }
    rows: list[tuple[str, ...]] = []
    for r in results:
        v = r.variant
        if r.error is not None:
            rows.append((v.name, v.model, v.mode, "failed", r.error, "", ""))
            continue
        ratio = r.tokens_per_s / bf16.get((v.model, v.compiled), float("nan"))
        rows.append(
            (
                v.name,
                v.model,
                v.mode,
                f"{1e3 * r.step_s:.1f}",
                f"{r.tokens_per_s:,.0f}",
                f"{ratio:.3f}" if v.fp8 else "1",
                f"{r.peak_gib:.1f}",
            )
        )
    headers = (
        "variant",
        "model",
        "mode",
        "step (ms)",
        "tokens/s",
        "vs its model's bf16",
        "peak memory (GiB)",
    )
    return (
        f"Training steps ({shapes}: {shapes.tokens:,} tokens a step), AdamW, "
        "bf16 autocast; medians of the timed steps\n" + table(rows, headers)
    )


def targets_table(results: list[Result]) -> str:
    """Our FP8 against the two targets, eager and compiled."""
    speed = {
        (r.variant.model, r.variant.fp8, r.variant.compiled): r.tokens_per_s
        for r in results
        if r.error is None
    }
    nan = float("nan")
    rows: list[tuple[str, ...]] = []
    for compiled in (True, False):
        mode = "compiled" if compiled else "eager"
        ours = speed.get(("u-μP", "ours", compiled), nan)
        for label, baseline, target in (
            (
                "ours / u-μP bf16",
                ("u-μP", None, compiled),
                TARGET_VS_BF16[compiled],
            ),
            ("ours / SP bf16", ("SP", None, compiled), TARGET_VS_BF16[compiled]),
            (
                "ours / torchao tensorwise",
                ("SP", "tensorwise", compiled),
                TARGET_VS_TORCHAO,
            ),
            ("ours / torchao rowwise", ("SP", "rowwise", compiled), None),
        ):
            ratio = ours / speed.get(baseline, nan)
            if target is None or ratio != ratio:  # no target, or a failed run
                verdict = "" if target is None else "not measured"
            else:
                verdict = "met" if ratio >= target else "not met"
            goal = f"≥ {target}" if target is not None else ""
            rows.append((f"{label}, {mode}", f"{ratio:.3f}", goal, verdict))
    return "Targets (tokens/s ratios)\n" + table(
        rows, ("ratio", "measured", "target", "verdict")
    )


# --------------------------------------------------------------------------- #
# GEMMs.
# --------------------------------------------------------------------------- #


def _fp8(x: Tensor, dtype: torch.dtype) -> Tensor:
    limit = torch.finfo(dtype).max
    return x.clamp(-limit, limit).to(dtype)


def _column_major(x: Tensor) -> Tensor:
    return x.t().contiguous().t()


def gemm_table(shapes: Shapes, device: torch.device, warmup: int, repeats: int) -> str:
    """TFLOP/s of the three GEMMs of each linear layer: bf16 ``torch.mm`` and
    ``torch._scaled_mm`` (with and without fast accumulation)."""
    m = shapes.tokens
    one = torch.ones((), device=device)
    rows: list[tuple[str, ...]] = []
    for name, k, n in shapes.linears():
        x = torch.randn(m, k, device=device)
        w = torch.randn(n, k, device=device) / k**0.5
        g = torch.randn(m, n, device=device)
        xb, wb, gb = (t.to(torch.bfloat16) for t in (x, w, g))
        xq, wq, gq = _fp8(x, E4M3), _fp8(w, E4M3), _fp8(g, E5M2)
        # (label, bf16 operands, FP8 operands: row-major a, column-major b)
        gemms = (
            ("forward", (xb, wb.t()), (xq, wq.t())),
            ("input grad", (gb, wb), (gq, _column_major(wq))),
            ("weight grad", (gb.t(), xb), (gq.t().contiguous(), _column_major(xq))),
        )
        for gemm, (a, b), (aq, bq) in gemms:
            flops = 2 * a.shape[0] * a.shape[1] * b.shape[1]

            def bf16(a: Tensor = a, b: Tensor = b) -> Tensor:
                return torch.mm(a, b)

            def fp8(aq: Tensor = aq, bq: Tensor = bq, fast: bool = False) -> Tensor:
                return torch._scaled_mm(
                    aq,
                    bq,
                    scale_a=one,
                    scale_b=one,
                    out_dtype=torch.bfloat16,
                    use_fast_accum=fast,
                )

            tflops = [
                flops / median_seconds(fn, warmup, repeats) / 1e12
                for fn in (bf16, fp8, lambda: fp8(fast=True))
            ]
            dims = f"{a.shape[0]}×{a.shape[1]} @ {b.shape[0]}×{b.shape[1]}"
            rows.append(
                (
                    name,
                    gemm,
                    dims,
                    f"{tflops[0]:.0f}",
                    f"{tflops[1]:.0f}",
                    f"{tflops[1] / tflops[0]:.2f}",
                    f"{tflops[2]:.0f}",
                )
            )
        del x, w, g, xb, wb, gb, xq, wq, gq, gemms
    headers = (
        "layer",
        "GEMM",
        "shape (M×K @ K×N)",
        "bf16 TFLOP/s",
        "FP8 TFLOP/s",
        "FP8 / bf16",
        "FP8 fast accum TFLOP/s",
    )
    return (
        f"GEMMs alone ({repeats} timed calls each, median): torch.mm in bf16 and "
        "torch._scaled_mm (FP8 in, bf16 out)\n" + table(rows, headers)
    )


# --------------------------------------------------------------------------- #
# Main.
# --------------------------------------------------------------------------- #


def header(device: torch.device) -> str:
    try:
        import torchao

        torchao_version = torchao.__version__
    except ImportError:
        torchao_version = "not installed (its rows will fail)"
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    return f"{name}; torch {torch.__version__}; torchao {torchao_version}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0] if __doc__ else None
    )
    defaults = Shapes()
    for field in dataclasses.fields(Shapes):
        parser.add_argument(
            f"--{field.name}", type=int, default=getattr(defaults, field.name)
        )
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument("--gemm-repeats", type=int, default=50)
    parser.add_argument("--no-compile", action="store_true", help="eager only")
    parser.add_argument("--no-gemms", action="store_true", help="skip the GEMMs")
    parser.add_argument(
        "--no-training", action="store_true", help="skip the training steps"
    )
    # Runs the script's logic on the CPU (tiny shapes advised): no timing worth
    # reading, for checking the script itself on a machine without a GPU.
    parser.add_argument("--cpu-check", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    problem = None if args.cpu_check else fp8_gpu_problem()
    if problem is not None:
        print(
            "benchmarks.float8_gpu needs a CUDA GPU with FP8 tensor cores "
            f"(compute capability 8.9 or newer: sm89+, e.g. L4, L40S, H100); "
            f"{problem}. Nothing was measured."
        )
        return 0
    device = torch.device("cpu" if args.cpu_check else "cuda")
    shapes = Shapes(
        **{f.name: getattr(args, f.name) for f in dataclasses.fields(Shapes)}
    )
    print(header(device), flush=True)
    if not args.no_training:
        results = []
        for variant in VARIANTS:
            if variant.compiled and args.no_compile:
                continue
            result = measure_training(variant, shapes, device, args.warmup, args.steps)
            state = result.error or f"{result.tokens_per_s:,.0f} tokens/s"
            print(f"  {variant.name} ({variant.model}, {variant.mode}): {state}")
            results.append(result)
        print()
        print(training_table(results, shapes), end="\n\n")
        print(targets_table(results), end="\n\n", flush=True)
    if not args.no_gemms:
        print(gemm_table(shapes, device, args.warmup, args.gemm_repeats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
