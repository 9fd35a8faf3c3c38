"""Learning-rate transfer across width: u-μP's optimum stays put, SP's moves.

Sweeps the AdamW learning rate on a ×2 grid at widths 64 to 512 for the
standard parametrisation (SP: ``StandardTransformerDecoder`` with GPT-2 init and
``torch.optim.AdamW``) and for u-μP (``uu.TransformerDecoder`` with
``uu.optim.AdamW``): the same 2-layer byte-level decoder (head size 32), the same
initial seed, training batches and validation set for every run. Writes
``lr_transfer.png`` (validation loss against learning rate, one curve per width,
optimum marked) and ``lr_transfer.md`` (every loss, the optimum per width and its
shift across widths in grid steps) to ``--out`` (default ``docs/results/``)::

    .venv/bin/python experiments/lr_transfer.py
    .venv/bin/python experiments/lr_transfer.py --widths 64 128 --steps 100
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from _common import (
    PARAMETRISATIONS,
    Curve,
    lr_table,
    make_model,
    make_optimizer,
    optimum,
    plot_lr_curves,
    reflow,
    run_all,
    run_parser,
    timing_note,
    train,
    validation_set,
)

from unit_scaling.app.config import parse_config, setting
from unit_scaling.data import Corpus


@dataclass(frozen=True)
class Config:
    widths: tuple[int, ...] = (64, 128, 256, 512)
    # each sweep is a ×2 grid of learning rates
    sp_lrs: tuple[int, ...] = setting(tuple(range(-12, -5)), "log2 of SP's lrs")
    umup_lrs: tuple[int, ...] = setting(tuple(range(-3, 4)), "log2 of u-μP's lrs")
    layers: int = 2
    batch_size: int = 16
    seq_len: int = 64
    steps: int = 200
    warmup: int = 20
    val_batches: int = 8
    cap: float = setting(3.5, "plot losses above this (and diverged runs) here")
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("widths", "sp_lrs", "umup_lrs"):  # the plots read them in order
            object.__setattr__(self, name, tuple(sorted(getattr(self, name))))

    def log2_lrs(self, parametrisation: str) -> tuple[int, ...]:
        return self.umup_lrs if parametrisation == "u-μP" else self.sp_lrs


@dataclass(frozen=True)
class Task:
    parametrisation: str
    width: int
    log2_lr: int


def train_one(args: tuple[Config, Task]) -> Curve:
    config, task = args
    corpus = Corpus()
    model = make_model(task.parametrisation, task.width, config.layers, config.seed)
    optimizer = make_optimizer(task.parametrisation, model, 2.0**task.log2_lr)
    return train(
        model,
        optimizer,
        corpus.batches("train", config.batch_size, config.seq_len, seed=config.seed),
        config.steps,
        validation_set(corpus, config.val_batches, config.batch_size, config.seq_len),
        warmup=min(config.warmup, config.steps),
    )


Losses = dict[str, dict[int, dict[int, float]]]  # parametrisation -> width -> log2 lr


def shift(losses: Losses, parametrisation: str) -> tuple[int, int]:
    """(largest minus smallest grid optimum across widths, optimum at the widest
    width minus at the narrowest), in grid steps."""
    by_width = losses[parametrisation]
    best = [optimum(by_width[w])[0] for w in sorted(by_width)]
    return max(best) - min(best), best[-1] - best[0]


def plot(config: Config, losses: Losses, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
    finite = [
        v
        for p in losses.values()
        for w in p.values()
        for v in w.values()
        if math.isfinite(v)
    ]
    floor = min(finite)
    for ax, parametrisation in zip(axes, PARAMETRISATIONS, strict=True):
        plot_lr_curves(ax, losses[parametrisation], config.cap)
        spread, _ = shift(losses, parametrisation)
        name = (
            "SP (GPT-2 init, torch AdamW)"
            if parametrisation == "SP"
            else "u-μP (uu.TransformerDecoder, uu.optim.AdamW)"
        )
        ax.set_title(f"{name}\noptimum moves {spread} grid step(s) across widths")
        ax.set_xlabel("learning rate")
        xs = config.log2_lrs(parametrisation)
        ax.set_xticks(list(xs), [f"$2^{{{x}}}$" for x in xs])
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("validation loss (nats per byte)")
    axes[0].set_ylim(floor - 0.05, config.cap + 0.08)
    axes[1].legend(
        title=f"★ optimum\n▲ loss above {config.cap:g}\n× diverged", loc="upper center"
    )
    fig.suptitle(
        f"Learning-rate transfer: {config.layers}-layer decoder, {config.steps} steps "
        f"of {config.batch_size}×{config.seq_len} tokens, validation loss"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(config: Config, losses: Losses, seconds: float, jobs: int) -> str:
    sections = []
    for parametrisation in PARAMETRISATIONS:
        xs = config.log2_lrs(parametrisation)
        table = lr_table({w: losses[parametrisation][w] for w in config.widths}, xs)
        spread, drift = shift(losses, parametrisation)
        edges = [
            w
            for w in config.widths
            if optimum(losses[parametrisation][w])[0] in (xs[0], xs[-1])
        ]
        edge_note = (
            f" At width(s) {', '.join(map(str, edges))} the optimum is at the edge "
            "of the grid, so the true optimum may lie beyond it."
            if edges
            else ""
        )
        sections.append(
            f"### {parametrisation}\n\n{table}\n\nThe optimum moves **{spread} grid "
            f"step(s)** across widths {config.widths[0]}–{config.widths[-1]} "
            f"({drift:+d} from the narrowest to the widest).{edge_note}\n"
        )
    sp_spread, sp_drift = shift(losses, "SP")
    umup_spread, umup_drift = shift(losses, "u-μP")
    tokens = config.steps * config.batch_size * config.seq_len
    settings = "\n".join(f"- {k}: {v}" for k, v in asdict(config).items())
    runs = len(config.widths) * (len(config.sp_lrs) + len(config.umup_lrs))
    return reflow(f"""# Learning-rate transfer across width

`python experiments/lr_transfer.py` trains a {config.layers}-layer byte-level
decoder (head size 32, SwiGLU MLP, RMSNorm pre-norm) at widths
{", ".join(map(str, config.widths))} for {config.steps} AdamW steps of
{config.batch_size}×{config.seq_len} tokens ({tokens:,} tokens; {config.warmup}
warmup steps, then cosine decay to 10%), sweeping the learning rate on a ×2 grid:

- **SP**: `StandardTransformerDecoder` (GPT-2 init: N(0, 0.02), residual output
  projections 0.02/√(2·layers)) with `torch.optim.AdamW(lr)`;
- **u-μP**: `uu.TransformerDecoder` with `uu.optim.AdamW(lr)` (per-tensor
  learning rates from u-μP's rules).

Every run starts from the same seed and reads the same batches; the loss is the
mean over a fixed validation set of {config.val_batches} batches
({config.val_batches * config.batch_size * config.seq_len:,} tokens). {runs} runs:
{timing_note(seconds, jobs)}.

**Result: the optimal learning rate moves {umup_spread} grid step(s) for u-μP and
{sp_spread} for SP across the {config.widths[-1] // config.widths[0]}× width
range ({umup_drift:+d} and {sp_drift:+d} from width {config.widths[0]} to
{config.widths[-1]}).**

![learning-rate transfer](lr_transfer.png)

Validation loss for each width (rows) and learning rate (columns), optimum in
bold; *fitted* is the vertex of a parabola through the optimum and its two
neighbours (in log₂ lr), a finer estimate than the grid.

{chr(10).join(sections)}
## Settings

{settings}
""")


def main(argv: list[str] | None = None) -> Losses:
    config, args = parse_config(Config, argv, parser=run_parser(__doc__.split("\n")[0]))
    torch.set_num_threads(1)
    start = time.perf_counter()
    tasks = [
        Task(p, w, x)
        for w in sorted(config.widths, reverse=True)  # longest runs first
        for p in PARAMETRISATIONS
        for x in config.log2_lrs(p)
    ]
    curves = run_all(
        train_one,
        [(config, t) for t in tasks],
        args.jobs,
        lambda a, c: (
            f"{a[1].parametrisation:4s} width {a[1].width:4d} lr 2^{a[1].log2_lr:<3d}: "
            f"validation loss {c.final_val:.3f} ({c.seconds:.0f} s)"
        ),
    )
    losses: Losses = {p: {w: {} for w in config.widths} for p in PARAMETRISATIONS}
    for task, curve in zip(tasks, curves, strict=True):
        losses[task.parametrisation][task.width][task.log2_lr] = curve.final_val
    seconds = time.perf_counter() - start

    args.out.mkdir(parents=True, exist_ok=True)
    plot(config, losses, args.out / "lr_transfer.png")
    text = report(config, losses, seconds, args.jobs)
    (args.out / "lr_transfer.md").write_text(text)
    print(text)
    print(f"wrote {args.out}/lr_transfer.png and lr_transfer.md")
    return losses


if __name__ == "__main__":
    main(sys.argv[1:])
