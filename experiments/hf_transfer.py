"""Learning-rate transfer for Hugging Face decoders made u-μP by ``unit_scale``.

A Llama-style and a GPT-2-style decoder (``transformers``, built from configs:
2 layers, head size 32, vocabulary 256 bytes; Llama's MLP 4x wide) at widths
64 to 512, each in two parametrisations, trained on the built-in corpus with the
data, steps and schedule of ``lr_transfer.py`` over a x2 learning-rate grid:

- **u-μP**: ``unit_scale(model, residual_scaling="u-μP")`` with
  ``uu.optim.AdamW(lr)`` (per-parameter learning rates from the tags
  ``unit_scale`` puts on every parameter);
- **SP**: the model as Hugging Face initialises it, with ``torch.optim.AdamW(lr)``.

Every finished run is saved to ``--cache`` (JSON), so an interrupted sweep
resumes where it stopped. Writes ``hf_transfer.md`` and ``hf_transfer.png`` to
``--out`` (default ``docs/results/``); ``--quick`` is a smoke run::

    python experiments/hf_transfer.py --jobs 2
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from _common import (
    Curve,
    markdown_table,
    reflow,
    run_all,
    run_parser,
    timing_note,
    train,
    validation_set,
)
from lr_transfer import Config as TransferConfig
from lr_transfer import optimum, shift
from torch import Tensor, nn

import unit_scaling as uu
from unit_scaling.app.config import parse_config, setting
from unit_scaling.data import VOCAB_SIZE, Corpus
from unit_scaling.transforms import unit_scale
from unit_scaling.zoo import hf_model

PARAMETRISATIONS = ("SP", "u-μP")
HEAD_SIZE = 32


@dataclass(frozen=True)
class Config(TransferConfig):
    """``lr_transfer.py``'s settings (data, steps, schedule, grids), plus which
    Hugging Face families to run and where finished runs are kept."""

    umup_lrs: tuple[int, ...] = setting(tuple(range(-4, 3)), "log2 of u-μP's lrs")
    families: tuple[str, ...] = ("llama", "gpt2")
    quick: bool = setting(False, "a smoke run: widths 32 and 64, 2 lrs, 5 steps")
    report_only: bool = setting(False, "write the page from the cache, train nothing")
    cache: Path = setting(
        Path(__file__).resolve().parents[1]
        / "docs"
        / "results"
        / "hf_transfer_runs.json",
        "finished runs (committed, so a sweep resumes across sessions)",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.quick:
            for name, value in (
                ("widths", (32, 64)),
                ("sp_lrs", (-9, -8)),
                ("umup_lrs", (-2, -1)),
                ("steps", 5),
                ("warmup", 1),
                ("val_batches", 1),
            ):
                object.__setattr__(self, name, value)


class LanguageModel(nn.Module):
    """A Hugging Face causal LM with the ``loss(batch)`` the training loop calls
    (the model shifts the labels itself)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def loss(self, batch: Tensor) -> Tensor:
        loss: Tensor = self.model(input_ids=batch, labels=batch).loss
        return loss


def make_model(family: str, width: int, config: Config) -> nn.Module:
    heads = max(1, width // HEAD_SIZE)
    torch.manual_seed(config.seed)
    if family == "llama":
        return hf_model(
            "llama",
            hidden_size=width,
            intermediate_size=4 * width,
            num_attention_heads=heads,
            num_key_value_heads=heads,
            num_hidden_layers=config.layers,
            vocab_size=VOCAB_SIZE,
            use_cache=False,
        )
    return hf_model(
        "gpt2",
        n_embd=width,
        n_head=heads,
        n_layer=config.layers,
        n_positions=config.seq_len + 1,
        vocab_size=VOCAB_SIZE,
        use_cache=False,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )


@dataclass(frozen=True)
class Task:
    family: str
    parametrisation: str
    width: int
    log2_lr: int

    @property
    def key(self) -> str:
        return f"{self.family}/{self.parametrisation}/{self.width}/{self.log2_lr}"


def train_one(args: tuple[Config, Task]) -> Curve:
    config, task = args
    model = make_model(task.family, task.width, config)
    lr = 2.0**task.log2_lr
    optimizer: torch.optim.Optimizer
    if task.parametrisation == "u-μP":
        model = unit_scale(model, residual_scaling="u-μP")
        optimizer = uu.optim.AdamW(model.parameters(), lr=lr)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    corpus = Corpus()
    return train(
        LanguageModel(model),
        optimizer,
        corpus.batches("train", config.batch_size, config.seq_len, seed=config.seed),
        config.steps,
        validation_set(corpus, config.val_batches, config.batch_size, config.seq_len),
        warmup=min(config.warmup, config.steps),
    )


Losses = dict[str, dict[str, dict[int, dict[int, float]]]]  # family, param, width


def _losses(config: Config, done: dict[str, float]) -> Losses:
    return {
        f: {
            p: {
                w: {
                    x: done[Task(f, p, w, x).key]
                    for x in config.log2_lrs(p)
                    if Task(f, p, w, x).key in done
                }
                for w in config.widths
            }
            for p in PARAMETRISATIONS
        }
        for f in config.families
    }


def plot(config: Config, losses: Losses, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = len(config.families)
    fig, axes = plt.subplots(rows, 2, figsize=(12, 4.4 * rows), squeeze=False)
    colours = plt.get_cmap("viridis")
    for r, family in enumerate(config.families):
        for c, parametrisation in enumerate(PARAMETRISATIONS):
            ax = axes[r][c]
            for i, width in enumerate(config.widths):
                row = losses[family][parametrisation][width]
                xs = [x for x in sorted(row) if math.isfinite(row[x])]
                if not xs:
                    continue
                colour = colours(i / max(1, len(config.widths) - 1) * 0.9)
                ax.plot(xs, [row[x] for x in xs], "o-", color=colour, label=f"{width}")
                best, _ = optimum(row)
                ax.plot(best, row[best], "*", color=colour, markersize=15, mec="k")
            finite = [
                v
                for row in losses[family][parametrisation].values()
                for v in row.values()
                if math.isfinite(v)
            ]
            if finite:  # diverged runs off the top: the optimum's basin stays legible
                ax.set_ylim(min(finite) - 0.05, min(max(finite), min(finite) + 1.5))
            ax.set_title(f"{family}: {parametrisation}")
            ax.set_xlabel("log2 learning rate")
            ax.grid(alpha=0.3)
            ax.legend(title="width")
        axes[r][0].set_ylabel("validation loss (nats per byte)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(config: Config, losses: Losses, seconds: float, jobs: int) -> str:
    sections = []
    for family in config.families:
        for parametrisation in PARAMETRISATIONS:
            xs = config.log2_lrs(parametrisation)
            by_width = losses[family][parametrisation]
            rows = []
            for width in config.widths:
                row = by_width[width]
                if not row:
                    continue
                best, _ = optimum(row)
                cells = [
                    ""
                    if x not in row
                    else f"**{row[x]:.3f}**"
                    if x == best
                    else f"{row[x]:.3f}"
                    for x in xs
                ]
                rows.append((width, *cells, f"2^{best}"))
            table = markdown_table(("width", *(f"2^{x}" for x in xs), "best"), rows)
            complete = all(len(by_width[w]) == len(xs) for w in config.widths)
            moved = shift(losses[family], parametrisation)[0] if complete else None
            verdict = (
                f"The optimum moves **{moved} grid step(s)** across widths."
                if moved is not None
                else "Not every run has finished yet."
            )
            sections.append(
                f"### {family}, {parametrisation}\n\n{table}\n\n{verdict}\n"
            )
    settings = "\n".join(f"- {k}: {v}" for k, v in asdict(config).items())
    timing = (
        f"the runs read from `{config.cache.name}` (each saved as it finished)"
        if config.report_only
        else f"this call: {timing_note(seconds, jobs)}"
    )
    return reflow(f"""# Learning-rate transfer of `unit_scale`d Hugging Face decoders

Written by `python experiments/hf_transfer.py` (see its docstring). Each cell is
the validation loss after {config.steps} steps; {timing}.

![hf transfer](hf_transfer.png)

{chr(10).join(sections)}
## Settings

{settings}
""")


def main(argv: list[str] | None = None) -> Losses:
    config, args = parse_config(Config, argv, parser=run_parser(__doc__.split("\n")[0]))
    torch.set_num_threads(1)
    done: dict[str, float] = (
        json.loads(config.cache.read_text()) if config.cache.exists() else {}
    )
    tasks = [
        Task(f, p, w, x)
        for f in config.families  # one family complete before the next
        for w in sorted(config.widths, reverse=True)  # longest runs first
        for p in PARAMETRISATIONS
        for x in config.log2_lrs(p)
        if Task(f, p, w, x).key not in done and not config.report_only
    ]
    start = time.perf_counter()

    def record(args: tuple[Config, Task], curve: Curve) -> str:
        task = args[1]
        done[task.key] = curve.final_val
        config.cache.parent.mkdir(parents=True, exist_ok=True)
        config.cache.write_text(json.dumps(done, indent=1))
        return (
            f"{task.key}: validation loss {curve.final_val:.3f} ({curve.seconds:.0f} s)"
        )

    run_all(train_one, [(config, t) for t in tasks], args.jobs, record)
    losses = _losses(config, done)
    seconds = time.perf_counter() - start
    args.out.mkdir(parents=True, exist_ok=True)
    plot(config, losses, args.out / "hf_transfer.png")
    text = report(config, losses, seconds, args.jobs)
    (args.out / "hf_transfer.md").write_text(text)
    print(text)
    return losses


if __name__ == "__main__":
    main(sys.argv[1:])
