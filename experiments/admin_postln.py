"""Does Admin stabilise a deep Post-LN transformer? Default vs Admin vs Pre-LN.

Trains the same causal byte-level language model (on the built-in
``unit_scaling.data`` corpus) four ways, with the same initial weights, batches and
optimizer (Adam, constant learning rate, no warmup, no gradient clipping):

* ``Post-LN``: the plain residual, ``LN(x + f(x))`` (omega = 1);
* ``Post-LN + Admin (closed form)``: ``LN(x * omega + f(x))`` with
  ``omega = admin_torch.calculate_init(2 * layers)`` (the ``O(logn)`` default);
* ``Post-LN + Admin (profiled)``: omegas from ``admin_torch.profile_init`` on one
  batch (the original Admin method);
* ``Pre-LN``: ``x + f(LN(x))``, the usual stable baseline.

Writes ``admin_postln.png`` (loss curves) and ``admin_postln.md`` (final losses) to
``--out-dir`` (default ``docs/results/``)::

    .venv/bin/python experiments/admin_postln.py
    .venv/bin/python experiments/admin_postln.py --steps 50 --layers 12 --lr 1e-3
"""

from __future__ import annotations

import argparse
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import admin_torch
from unit_scaling.app import training
from unit_scaling.app.config import parse_config
from unit_scaling.data import VOCAB_SIZE, Corpus

VARIANTS = (
    "Post-LN",
    "Post-LN + Admin (closed form)",
    "Post-LN + Admin (profiled)",
    "Pre-LN",
)


@dataclass(frozen=True)
class Config:
    layers: int = 12
    width: int = 64
    heads: int = 4
    seq_len: int = 64
    batch_size: int = 16
    steps: int = 300
    lr: float = 1e-3
    eval_every: int = 50
    eval_batches: int = 8
    seed: int = 0
    max_bytes: int = 2**21


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        batch, seq, width = x.shape
        qkv = self.qkv(x).view(batch, seq, 3, self.heads, width // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # 3 x [batch, heads, seq, head_dim]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(batch, seq, width))


class Block(nn.Module):
    """One transformer layer: two residual branches, Post-LN or Pre-LN."""

    def __init__(
        self, width: int, heads: int, num_res_layers: int, pre_ln: bool, scale: str
    ) -> None:
        super().__init__()
        self.pre_ln = pre_ln
        self.attn = CausalSelfAttention(width, heads)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.ReLU(), nn.Linear(4 * width, width)
        )
        self.ln_attn = nn.LayerNorm(width)
        self.ln_mlp = nn.LayerNorm(width)
        self.res_attn = admin_torch.as_module(num_res_layers, scale)
        self.res_mlp = admin_torch.as_module(num_res_layers, scale)

    def forward(self, x: Tensor) -> Tensor:
        if self.pre_ln:
            x = self.res_attn(x, self.attn(self.ln_attn(x)))
            return self.res_mlp(x, self.mlp(self.ln_mlp(x)))
        x = self.ln_attn(self.res_attn(x, self.attn(x)))
        return self.ln_mlp(self.res_mlp(x, self.mlp(x)))


class LanguageModel(nn.Module):
    def __init__(self, cfg: Config, pre_ln: bool, scale: str) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(VOCAB_SIZE, cfg.width)
        self.pos_emb = nn.Parameter(torch.zeros(cfg.seq_len, cfg.width))
        self.blocks = nn.ModuleList(
            Block(cfg.width, cfg.heads, 2 * cfg.layers, pre_ln, scale)
            for _ in range(cfg.layers)
        )
        # Post-LN already ends in a LayerNorm; Pre-LN needs a final one.
        self.ln_f = nn.LayerNorm(cfg.width) if pre_ln else nn.Identity()
        self.head = nn.Linear(cfg.width, VOCAB_SIZE)
        # The initialisation of the original Transformer (and of the Admin paper):
        # Xavier-uniform weights, zero biases, unit-variance embeddings.
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.tok_emb(tokens) + self.pos_emb[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def loss(self, batch: Tensor) -> Tensor:
        logits = self(batch[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())


def build(variant: str, cfg: Config, corpus: Corpus) -> LanguageModel:
    torch.manual_seed(cfg.seed)  # same initial weights for every variant
    pre_ln = variant == "Pre-LN"
    scale = "default" if variant == "Post-LN + Admin (closed form)" else "O(n)"
    model = LanguageModel(cfg, pre_ln=pre_ln, scale=scale)
    if variant == "Post-LN + Admin (profiled)":
        profile = corpus.get_batch("train", cfg.batch_size, cfg.seq_len, 10**6)
        admin_torch.profile_init(model, profile[:, :-1])
    return model


@dataclass
class Result:
    variant: str
    omegas: list[float]  # as initialised, in forward order
    train_losses: list[float]  # one per step; ends early (at NaN) on divergence
    val_steps: list[int]
    val_losses: list[float]
    seconds: float

    @property
    def diverged(self) -> bool:
        return not all(map(math.isfinite, self.train_losses))

    @property
    def final_train(self) -> float:
        """Mean training loss over the last 5% of steps."""
        tail = self.train_losses[-max(1, len(self.train_losses) // 20) :]
        return sum(tail) / len(tail)

    @property
    def final_val(self) -> float:
        return self.val_losses[-1] if self.val_losses else math.nan


def train(variant: str, cfg: Config, corpus: Corpus) -> Result:
    model = build(variant, cfg, corpus)
    omegas = [
        m.omega.mean().item()
        for m in model.modules()
        if isinstance(m, admin_torch.OmegaResidual)
    ]
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98))
    stream = corpus.batches("train", cfg.batch_size, cfg.seq_len, seed=cfg.seed)
    generator = torch.Generator().manual_seed(cfg.seed + 1)
    validation = [
        corpus.get_batch("validation", cfg.batch_size, cfg.seq_len, generator)
        for _ in range(cfg.eval_batches)
    ]
    history = training.train(
        model,
        model.loss,
        optimizer,
        stream,
        cfg.steps,
        validation,
        cfg.eval_every,
        progress=False,
    )
    # The loop evaluates at step 0 too; the table and plot start after it.
    return Result(
        variant,
        omegas,
        history.train_loss,
        history.eval_steps[1:],
        history.validation_loss[1:],
        history.seconds,
    )


def _smooth(values: list[float], weight: float) -> list[float]:
    out, average = [], values[0]
    for value in values:
        average = weight * average + (1 - weight) * value
        out.append(average)
    return out


def plot(results: list[Result], cfg: Config, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_train, ax_val) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    # the Admin and Pre-LN curves nearly coincide: line styles keep each visible
    styles = ["-", "-", "--", ":"]
    for r, style in zip(results, styles, strict=False):
        steps = range(1, len(r.train_losses) + 1)
        smooth = _smooth(r.train_losses, 0.9)
        (line,) = ax_train.plot(steps, smooth, style, lw=1.8, label=r.variant)
        ax_val.plot(r.val_steps, r.val_losses, "o" + style, color=line.get_color())
    ax_train.set_title("training loss (EMA 0.9)")
    ax_val.set_title("validation loss")
    for ax in (ax_train, ax_val):
        ax.set_xlabel("step")
        ax.axhline(math.log(VOCAB_SIZE), color="grey", lw=0.8, ls="-.")
        ax.grid(alpha=0.3)
    ax_train.text(cfg.steps, math.log(VOCAB_SIZE) + 0.05, "uniform, ln 256", ha="right")
    ax_train.set_ylabel("cross-entropy (nats / byte)")
    ax_train.set_ylim(top=math.log(VOCAB_SIZE) + 0.5)
    ax_train.legend()
    fig.suptitle(
        f"{cfg.layers}-layer ({2 * cfg.layers} residual branches) causal byte LM, "
        f"width {cfg.width}, Adam lr {cfg.lr:g}, no warmup, "
        f"batch {cfg.batch_size}x{cfg.seq_len}, seed {cfg.seed}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def table(results: list[Result], cfg: Config) -> str:
    lines = [
        f"Settings: {', '.join(f'{k}={v}' for k, v in asdict(cfg).items())}.",
        "Adam (betas 0.9, 0.98), constant learning rate, no warmup, no clipping.",
        "",
        "| variant | omega (first, last) | final train loss | final val loss |",
        "| --- | --- | --- | --- |",
    ]
    for r in results:
        final_train = "diverged (NaN)" if r.diverged else f"{r.final_train:.3f}"
        lines.append(
            f"| {r.variant} | {r.omegas[0]:.3f}, {r.omegas[-1]:.3f} | "
            f"{final_train} | {r.final_val:.3f} |"
        )
    lines.append("")
    lines.append(
        f"Final train loss: mean of the last {max(1, cfg.steps // 20)} steps; "
        f"validation: {cfg.eval_batches} fixed batches. "
        f"Uniform guess: ln 256 = {math.log(VOCAB_SIZE):.3f}."
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=Path(__file__).parent.parent / "docs" / "results",
    )
    cfg, args = parse_config(Config, argv, parser=parser)
    out_dir: Path = args.out_dir
    corpus = Corpus(max_bytes=cfg.max_bytes)
    results = []
    for variant in VARIANTS:
        result = train(variant, cfg, corpus)
        print(
            f"{variant:30s} train {result.final_train:.3f} "
            f"val {result.final_val:.3f} ({result.seconds:.0f}s)",
            flush=True,
        )
        results.append(result)
    out_dir.mkdir(parents=True, exist_ok=True)
    plot(results, cfg, out_dir / "admin_postln.png")
    (out_dir / "admin_postln.md").write_text(table(results, cfg))
    return results


if __name__ == "__main__":
    main()
