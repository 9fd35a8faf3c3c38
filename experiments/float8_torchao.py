"""Real FP8 training, static unit scales against dynamic scaling: our
``unit_scaling.float8`` on u-μP next to ``torchao.float8`` on SP.

Trains ``fp8_training.py``'s decoder (width 128, 2 layers, head size 32, byte
tokens of the built-in corpus) with that experiment's data, steps, global batch
and schedule, four ways:

* u-μP (``uu.TransformerDecoder``, ``uu.optim.AdamW``) with real FP8 GEMMs from
  :func:`unit_scaling.float8.convert_to_float8_training`: static unit scales,
  no amax, no loss scaling;
* the standard parametrisation (SP: ``StandardTransformerDecoder``, GPT-2 init,
  ``torch.optim.AdamW``) with real FP8 GEMMs from torchao's
  ``torchao.float8.convert_to_float8_training``: dynamic tensorwise scaling
  (each operand's absolute maximum taken before every GEMM);
* u-μP and SP in FP32.

Both FP8 paths run each linear layer's three GEMMs through ``torch._scaled_mm``
(emulated on a CPU) and keep attention's matrix products in float32. Writes
``float8_torchao.png`` and ``float8_torchao.md`` to ``--out`` (default
``docs/results/``)::

    .venv/bin/python experiments/float8_torchao.py
    .venv/bin/python experiments/float8_torchao.py --quick --out /tmp/f8
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from _common import (
    Curve,
    make_model,
    make_optimizer,
    markdown_table,
    reflow,
    run_all,
    run_parser,
    timing_note,
    train,
    validation_set,
)
from torch import nn

from unit_scaling import float8
from unit_scaling.app.config import parse_config, setting
from unit_scaling.data import Corpus

MULTIPLE = 16  # FP8 GEMMs (cuBLAS, and torchao's checks) take multiples of 16
QUICK = {
    "steps": 3,
    "width": 32,
    "layers": 1,
    "batch_size": 4,
    "seq_len": 16,
    "accumulate": 2,
    "warmup": 1,
    "eval_every": 2,
    "val_batches": 1,
}
COLOURS = {"SP": "tab:red", "u-μP": "tab:blue"}


@dataclass(frozen=True)
class Config:
    """``fp8_training.py``'s settings (its defaults), and how to run them."""

    steps: int = setting(300, "optimizer steps per run")
    width: int = setting(128, "model width")
    layers: int = setting(2, "transformer layers")
    batch_size: int = setting(16, "micro-batch rows")
    seq_len: int = setting(64, "bytes per sequence")
    accumulate: int = setting(4, "micro-batches per optimizer step")
    lr_sp: float = setting(2**-9, "SP's torch.optim.AdamW learning rate")
    lr_umup: float = setting(2**0, "u-μP's uu.optim.AdamW base learning rate")
    warmup: int = setting(30, "linear warmup steps, then cosine decay to 10%")
    eval_every: int = setting(25, "steps between validations")
    val_batches: int = setting(8, "batches of the fixed validation set")
    seed: int = setting(0, "seed of the weights and of the data order")
    onednn: bool = setting(
        False,
        "leave oneDNN on for torchao's torch._scaled_mm calls (on this machine's "
        "CPU its E4M3 x E4M3 GEMM is hundreds of times slower than torch's "
        "reference kernel; unit_scaling.float8 turns it off for its own GEMMs)",
    )
    quick: bool = setting(False, "a smoke run of seconds: " + str(QUICK))

    def __post_init__(self) -> None:
        if self.quick:
            for name, value in QUICK.items():
                object.__setattr__(self, name, value)

    @property
    def tokens_per_step(self) -> int:
        return self.accumulate * self.batch_size * self.seq_len


@dataclass(frozen=True)
class Variant:
    """One of the four runs."""

    name: str
    parametrisation: str
    fp8: str | None = None  # None (FP32), "unit_scaling" or "torchao"


VARIANTS = (
    Variant("u-μP FP8 (unit_scaling.float8)", "u-μP", "unit_scaling"),
    Variant("SP FP8 (torchao.float8)", "SP", "torchao"),
    Variant("u-μP FP32", "u-μP"),
    Variant("SP FP32", "SP"),
)


@dataclass
class Run:
    """A finished run: its losses, and what its FP8 conversion did."""

    curve: Curve
    fp8_layers: list[str] = field(default_factory=list)
    kept_layers: list[str] = field(default_factory=list)
    auto_filter_layers: list[str] | None = None  # torchao's size heuristic's pick


def import_torchao_float8() -> ModuleType:
    """``torchao.float8``, imported without torchao's import-time warnings
    about CUDA extensions (MXFP8, CUTLASS) that a CPU build cannot load."""
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


def _label(name: str, layer: nn.Module) -> str:
    return f"{name} ({layer.in_features} → {layer.out_features})"


def _fits(layer: nn.Module) -> bool:
    return layer.in_features % MULTIPLE == 0 and layer.out_features % MULTIPLE == 0


def convert_unit_scaling(model: nn.Module) -> Run:
    """Convert ``model``'s ``uu.Linear`` layers in place with our FP8; which
    layers run in FP8 and which its size check keeps in float32."""
    float8.convert_to_float8_training(model)
    run = Run(Curve())
    for name, layer in model.named_modules():
        if isinstance(layer, (float8.Float8Linear, float8.Float8LinearReadout)):
            (run.fp8_layers if _fits(layer) else run.kept_layers).append(
                _label(name, layer)
            )
    return run


def torchao_filter(layer: nn.Module, fqn: str) -> bool:
    """Convert a plain linear layer whose sizes are multiples of 16 (what
    torchao's FP8 GEMMs take); keep any other in float32."""
    return isinstance(layer, nn.Linear) and _fits(layer)


def convert_torchao(model: nn.Module) -> Run:
    """Convert ``model``'s ``nn.Linear`` layers in place with torchao's
    tensorwise dynamic FP8 (its default recipe); which layers it converted, and
    which its size heuristic (``_auto_filter_for_recipe``, tuned on H100s) would
    have converted."""
    ao = import_torchao_float8()
    linears = {
        name: _label(name, layer)
        for name, layer in model.named_modules()
        if isinstance(layer, nn.Linear)
    }
    auto: list[str] | None = None
    heuristic = getattr(ao, "_auto_filter_for_recipe", None)
    if heuristic is not None:  # exported, but experimental, in torchao 0.18
        pick: Callable[[nn.Module, str], bool] = heuristic("tensorwise", [])
        auto = [
            linears[name]
            for name, layer in model.named_modules()
            if name in linears and pick(layer, name)
        ]
    config = ao.Float8LinearConfig.from_recipe_name("tensorwise")
    ao.convert_to_float8_training(model, config=config, module_filter_fn=torchao_filter)
    from torchao.float8.float8_linear import Float8Linear

    run = Run(Curve(), auto_filter_layers=auto)
    for name, label in linears.items():
        converted = isinstance(model.get_submodule(name), Float8Linear)
        (run.fp8_layers if converted else run.kept_layers).append(label)
    return run


def train_variant(task: tuple[Config, Variant]) -> Run:
    """Train one of the four runs, from ``config.seed``, on the shared batches."""
    config, variant = task
    corpus = Corpus()
    with torch.backends.mkldnn.flags(enabled=config.onednn):
        model = make_model(
            variant.parametrisation, config.width, config.layers, config.seed
        )
        if variant.fp8 == "unit_scaling":
            run = convert_unit_scaling(model)
        elif variant.fp8 == "torchao":
            run = convert_torchao(model)
        else:
            run = Run(Curve())
        lr = config.lr_umup if variant.parametrisation == "u-μP" else config.lr_sp
        run.curve = train(
            model,
            make_optimizer(variant.parametrisation, model, lr),
            corpus.batches(
                "train", config.batch_size, config.seq_len, seed=config.seed
            ),
            config.steps,
            validation_set(
                corpus, config.val_batches, config.batch_size, config.seq_len
            ),
            accumulate=config.accumulate,
            warmup=min(config.warmup, config.steps),
            eval_every=config.eval_every,
        )
    return run


def _reference(runs: dict[Variant, Run], variant: Variant) -> Curve:
    """The FP32 run of ``variant``'s parametrisation."""
    return next(
        r.curve
        for v, r in runs.items()
        if v.fp8 is None and v.parametrisation == variant.parametrisation
    )


def gap(runs: dict[Variant, Run], variant: Variant) -> float:
    """Relative gap of ``variant``'s final validation loss to the FP32 run of
    its parametrisation."""
    ref = _reference(runs, variant).final_val
    return (runs[variant].curve.final_val - ref) / ref


def largest_gap(runs: dict[Variant, Run], variant: Variant) -> tuple[float, int]:
    """The relative gap to the FP32 run of its parametrisation that is largest
    in size over ``variant``'s evaluations, and its step."""
    ref = _reference(runs, variant)
    curve = runs[variant].curve
    # (a run that diverged may have stopped evaluating: zip to the shorter)
    steps = zip(curve.eval_steps, curve.val_loss, ref.val_loss, strict=False)
    gaps = [((v - r) / r, step) for step, v, r in steps if math.isfinite(v - r)]
    return max(gaps, key=lambda g: abs(g[0]), default=(math.nan, 0))


def plot(config: Config, runs: dict[Variant, Run], path: Path) -> None:
    """Validation loss of the four runs: all steps, and the second half."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, zoom) = plt.subplots(1, 2, figsize=(12, 4.8))
    finals = [r.curve.final_val for r in runs.values()]
    finite = [f for f in finals if math.isfinite(f)] or [0.0]
    for variant, run in runs.items():
        curve = run.curve
        steps = curve.eval_steps[: len(curve.val_loss)]
        style: dict[str, Any] = dict(
            color=COLOURS[variant.parametrisation],
            linestyle="--" if variant.fp8 else "-",
            linewidth=2 if variant.fp8 else 1.5,
            marker="o" if variant.fp8 else None,
            markersize=3,
        )
        final = "diverged" if curve.diverged else f"{curve.final_val:.3f}"
        ax.plot(steps, curve.val_loss, label=f"{variant.name}: {final}", **style)
        half = [(s, v) for s, v in zip(steps, curve.val_loss, strict=True)]
        half = [(s, v) for s, v in half if s >= config.steps / 2] or half[-1:]
        zoom.plot(*zip(*half, strict=True), **style)
    starts = [r.curve.val_loss[1] for r in runs.values() if len(r.curve.val_loss) > 1]
    top = min(max(starts, default=max(finite)), max(finite) + 1.0)
    ax.set_ylim(min(finite) - 0.1, max(top, max(finite)) + 0.05)
    ax.set_title(
        f"Validation loss: {config.tokens_per_step:,} tokens per step "
        f"({config.accumulate} × {config.batch_size}×{config.seq_len})"
    )
    zoom.set_title("Second half")
    for a in (ax, zoom):
        a.set_xlabel("optimizer step")
        a.grid(alpha=0.3)
    ax.set_ylabel("validation loss (nats per byte)")
    ax.legend(title="run: final validation loss", fontsize=9, title_fontsize=9)
    fig.suptitle(
        "Real FP8 (torch._scaled_mm): u-μP with static unit scales (unit_scaling) "
        "vs SP with dynamic tensorwise scales (torchao)",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _bullets(labels: list[str]) -> str:
    return "\n".join(f"- {label}" for label in labels) if labels else "- (none)"


def _kept(labels: list[str]) -> str:
    """What the conversion kept in float32, as the end of a sentence."""
    if not labels:
        return "; all sizes are multiples of 16, so none stayed in float32"
    return (
        f"; {len(labels)} stayed in float32 (sizes not multiples of 16): "
        + ", ".join(labels)
    )


def power_of_two(x: float) -> str:
    """``0.001953125`` -> ``2^-9``; other numbers as they are."""
    exponent = math.log2(x)
    return f"2^{exponent:g}" if exponent == round(exponent) else f"{x:g}"


def report(config: Config, runs: dict[Variant, Run], seconds: float, jobs: int) -> str:
    """The results page."""
    by_name = {v.name: (v, r) for v, r in runs.items()}
    ours_v, ours = by_name[VARIANTS[0].name]
    ao_v, ao = by_name[VARIANTS[1].name]
    rows = []
    for variant, run in runs.items():
        curve = run.curve
        scaling = {
            "unit_scaling": "static unit scales",
            "torchao": "dynamic tensorwise (amax)",
            None: "",
        }[variant.fp8]
        worst, at = largest_gap(runs, variant)
        rows.append(
            (
                variant.name,
                scaling,
                "diverged" if curve.diverged else f"{curve.final_val:.3f}",
                f"{100 * gap(runs, variant):+.2f}%" if variant.fp8 else "",
                f"{100 * worst:+.2f}% (step {at})" if variant.fp8 else "",
                f"{curve.seconds:.0f}",
            )
        )
    table = markdown_table(
        (
            "run",
            "FP8 scaling",
            "final validation loss",
            "vs FP32 of its parametrisation",
            "largest gap on the way",
            "seconds",
        ),
        rows,
    )
    gap_ours, gap_ao = gap(runs, ours_v), gap(runs, ao_v)
    umup32 = runs[VARIANTS[2]].curve.final_val
    sp32 = runs[VARIANTS[3]].curve.final_val
    between = (ours.curve.final_val - ao.curve.final_val) / ao.curve.final_val
    total = len(ao.fp8_layers) + len(ao.kept_layers)
    if ao.auto_filter_layers is None:
        auto_note = ""
    else:
        auto_note = (
            f'torchao\'s own size heuristic (`_auto_filter_for_recipe("tensorwise", '
            f"[])`, tuned on H100s: skip a layer with in_features ≤ 4096 and "
            f"out_features ≤ 1024) would have converted "
            f"{len(ao.auto_filter_layers)} of these {total} "
            f"layers at this width; it is opt-in, not the default, and not used here."
        )
    defaults = Config()
    lr_note = (
        ", `fp8_training.py`'s defaults (docs/results/fp8_training.md): SP's is its "
        "optimum at width 128 in docs/results/lr_transfer.md (200 steps of 16×64 "
        "tokens); u-μP's is its optimum there at widths 64, 256 and 512, within "
        "0.6% of the width-128 grid optimum (2^-1)"
        if (config.lr_sp, config.lr_umup) == (defaults.lr_sp, defaults.lr_umup)
        else ""
    )
    settings = "\n".join(f"- {k}: {v}" for k, v in asdict(config).items())
    command = "python experiments/float8_torchao.py"
    if config.quick:
        command += " --quick"
    return reflow(f"""# Real FP8: `unit_scaling.float8` (u-μP) and `torchao.float8` (SP)

`{command}` trains `fp8_training.py`'s decoder (width {config.width},
{config.layers} layers, head size 32, byte tokens of the built-in corpus) with
that experiment's data and settings — {config.steps} AdamW steps of
{config.tokens_per_step:,} tokens (a global batch of {config.accumulate}
micro-batches of {config.batch_size}×{config.seq_len}, gradients accumulated),
{config.warmup} warmup steps then cosine decay to 10%, the same seed, batches and
{config.val_batches}-batch validation set for every run — four ways: u-μP
(`uu.TransformerDecoder`, `uu.optim.AdamW`) with real FP8 from
`unit_scaling.float8.convert_to_float8_training`; the standard parametrisation
(SP: `StandardTransformerDecoder`, GPT-2 init, `torch.optim.AdamW`) with real FP8
from `torchao.float8.convert_to_float8_training` (torchao's default
"tensorwise" recipe); and both in FP32. No loss scaling anywhere. Learning
rates: SP {power_of_two(config.lr_sp)}, u-μP {power_of_two(config.lr_umup)}{lr_note}.
{timing_note(seconds, jobs)}.

**Result: u-μP with `unit_scaling.float8` ends {100 * gap_ours:+.2f}% from u-μP in
FP32; SP with `torchao.float8` ends {100 * gap_ao:+.2f}% from SP in FP32.** The FP8
runs end at {ours.curve.final_val:.3f} (u-μP, static scales) and
{ao.curve.final_val:.3f} (SP, dynamic scales): u-μP's is {abs(100 * between):.2f}%
{"lower" if between < 0 else "higher"}; the FP32 runs at {umup32:.3f} (u-μP) and
{sp32:.3f} (SP). This is one seed: the runs start from the same weights and read
the same batches, but part as soon as rounding differs anywhere, so the gaps
wander from one evaluation to the next (largest gap column, and the plot) and a
gap of a few tenths of a percent is within that wandering. The seconds are wall
time on a shared machine, evaluations included (see the end of the next
section).

{table}

![loss curves](float8_torchao.png)

## What each FP8 path runs in FP8

Both run each converted linear layer's three GEMMs on FP8 tensors through
`torch._scaled_mm`: forward E4M3(x)·E4M3(W)ᵀ, input gradient E5M2(g)·E4M3(W),
weight gradient E5M2(g)ᵀ·E4M3(x). They differ in the scales. `unit_scaling.float8`
casts each operand as it is (saturating) and passes the layer's static unit scale
as the GEMM's dequantisation scale: no amax, no extra pass over a tensor.
torchao's tensorwise recipe reduces every operand (x, W and g) to its absolute
maximum before each GEMM, scales it so that maximum lands on the format's largest
value, casts, and divides the scales out in the GEMM. Both keep attention's two
matrix products, the embedding, the norms and the loss in float32.

`unit_scaling.float8` converted {len(ours.fp8_layers)} `uu.Linear` layers to FP8
({3 * len(ours.fp8_layers)} FP8 GEMMs per micro-batch){_kept(ours.kept_layers)}:

{_bullets(ours.fp8_layers)}

`torchao.float8` converted {len(ao.fp8_layers)} `nn.Linear` layers
({3 * len(ao.fp8_layers)} FP8 GEMMs per micro-batch){_kept(ao.kept_layers)}. Its
`convert_to_float8_training` converts every `nn.Linear` when given no
`module_filter_fn`; this run passes one that accepts a layer whose sizes are
multiples of 16:

{_bullets(ao.fp8_layers)}

{auto_note}

On this CPU `torch._scaled_mm` is emulated (FP8 operands widened to float32,
exact products, float32 sums), for both paths alike, so the seconds column is CPU
emulation speed, not FP8 speed; `python -m benchmarks float8` compares the two
training steps. oneDNN's `_scaled_mm` path, which torch 2.13 takes on a CPU with
AMX when both operands are E4M3, gives the same numbers hundreds of times more
slowly. `unit_scaling.float8` turns oneDNN off around its own CPU GEMMs; torchao
does not, so this experiment turns it off for all four runs (`--onednn` leaves it
on, which slows only the torchao run); float32 GEMMs do not use it.

## Settings

{settings}
""")


def main(argv: list[str] | None = None) -> dict[str, Run]:
    """Train the four runs, write the plot and the page; the runs by name."""
    config, args = parse_config(Config, argv, parser=run_parser(__doc__.split("\n")[0]))
    torch.set_num_threads(1)
    import_torchao_float8()  # fail before training if the extra is missing
    start = time.perf_counter()
    tasks = [(config, v) for v in VARIANTS]
    outcomes = run_all(
        train_variant,
        tasks,
        args.jobs,
        lambda task, run: (
            f"{task[1].name}: validation loss {run.curve.final_val:.3f} "
            f"({run.curve.seconds:.0f} s)"
        ),
    )
    seconds = time.perf_counter() - start
    runs = dict(zip(VARIANTS, outcomes, strict=True))
    args.out.mkdir(parents=True, exist_ok=True)
    plot(config, runs, args.out / "float8_torchao.png")
    text = report(config, runs, seconds, args.jobs)
    (args.out / "float8_torchao.md").write_text(text)
    print(text)
    print(f"wrote {args.out}/float8_torchao.png, float8_torchao.md")
    return {v.name: r for v, r in runs.items()}


if __name__ == "__main__":
    main(sys.argv[1:])
