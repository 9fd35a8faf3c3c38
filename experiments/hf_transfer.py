"""Learning-rate transfer for Hugging Face decoders made u-μP by ``unit_scale``.

A Llama-style and a GPT-2-style decoder (``transformers``, built from configs:
2 layers, head size 32, vocabulary 256 bytes; Llama's MLP 4x wide) at widths
64 to 512, each in two parametrisations, trained on the built-in corpus with the
data, steps and schedule of ``lr_transfer.py`` over a x2 learning-rate grid:

- **u-μP**: ``unit_scale(model, residual_scaling="u-μP")`` with
  ``uu.optim.AdamW(lr)`` (per-parameter learning rates from the tags
  ``unit_scale`` puts on every parameter);
- **SP**: the model as Hugging Face initialises it, with ``torch.optim.AdamW(lr)``.

Then each family, width and parametrisation is trained once more at the best
learning rate of its FP32 sweep in simulated FP8 (:func:`simulate_fp8`: E4M3
inputs and E5M2 gradients at every matrix product, no loss scaling; same data,
steps, schedule and seed), to see whether u-μP ends within 1% of its FP32 loss
and SP degrades. The page also sets the transformed models' best losses beside
those of the native ``uu.TransformerDecoder`` read from ``lr_transfer.py``'s
page (``--native``), when that page used the same sizes, data and steps.

Every finished run is saved to ``--cache`` (JSON; FP8 runs under the key of
their FP32 run plus ``/fp8``), so an interrupted sweep resumes where it stopped.
Writes ``hf_transfer.md`` and ``hf_transfer.png`` to ``--out`` (default
``docs/results/``); ``--quick`` is a smoke run::

    python experiments/hf_transfer.py --jobs 2
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from _common import (
    DOCS,
    HEAD_SIZE,
    Curve,
    LanguageModel,
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
from torch import nn

import unit_scaling as uu
from unit_scaling.app.config import parse_config, setting
from unit_scaling.data import VOCAB_SIZE, Corpus
from unit_scaling.transforms import simulate_fp8, unit_scale
from unit_scaling.zoo import hf_model

PARAMETRISATIONS = ("SP", "u-μP")
FP8_TOLERANCE = 0.01  # u-μP in FP8 within 1% of its FP32 loss; SP beyond it
NATIVE_TOLERANCE = 0.02  # transformed Llama's best loss within 2% of the native's
# The settings lr_transfer.py's page must share for its losses to be compared
# (head size, vocabulary and corpus are the same in both scripts' code).
SHARED: tuple[str, ...] = ("widths", "layers", "batch_size", "seq_len", "steps")
SHARED += ("warmup", "val_batches", "seed")


@dataclass(frozen=True)
class Config(TransferConfig):
    """``lr_transfer.py``'s settings (data, steps, schedule, grids), plus which
    Hugging Face families to run and where finished runs are kept."""

    umup_lrs: tuple[int, ...] = setting(tuple(range(-4, 3)), "log2 of u-μP's lrs")
    families: tuple[str, ...] = ("llama", "gpt2")
    quick: bool = setting(
        False, "a smoke run: widths 32 and 64, 2 lrs, 5 steps (FP8 runs too)"
    )
    report_only: bool = setting(False, "write the page from the cache, train nothing")
    cache: Path = setting(
        Path(__file__).resolve().parents[1]
        / "docs"
        / "results"
        / "hf_transfer_runs.json",
        "finished runs (committed, so a sweep resumes across sessions)",
    )
    native: Path = setting(
        DOCS / "lr_transfer.md",
        "lr_transfer.py's page: the native uu.TransformerDecoder's losses",
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
    fp8: bool = False  # simulated FP8 (simulate_fp8) instead of FP32

    @property
    def key(self) -> str:
        key = f"{self.family}/{self.parametrisation}/{self.width}/{self.log2_lr}"
        return f"{key}/fp8" if self.fp8 else key


def train_one(args: tuple[Config, Task]) -> Curve:
    config, task = args
    model = make_model(task.family, task.width, config)
    lr = 2.0**task.log2_lr
    optimizer: torch.optim.Optimizer
    if task.parametrisation == "u-μP":
        model = unit_scale(model, residual_scaling="u-μP")
    if task.fp8:  # as fp8_training.py: the model quantised, then its optimizer
        model = simulate_fp8(model)
    if task.parametrisation == "u-μP":
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
Fp8Losses = dict[str, dict[str, dict[int, float]]]  # family, param, width


@dataclass(frozen=True)
class Results:
    """The FP32 sweep (loss by log2 lr) and the FP8 run at each of its optima."""

    fp32: Losses
    fp8: Fp8Losses


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


def best_lr(config: Config, losses: Losses, task: Task) -> int | None:
    """The grid optimum (log2 lr) of ``task``'s family, parametrisation and width
    once its FP32 sweep has finished (None before, or if every run diverged)."""
    row = losses[task.family][task.parametrisation][task.width]
    finished = len(row) == len(config.log2_lrs(task.parametrisation))
    if not finished or not any(math.isfinite(v) for v in row.values()):
        return None
    return optimum(row)[0]


def fp8_tasks(config: Config, losses: Losses) -> list[Task]:
    """One FP8 run for each family, width and parametrisation whose FP32 sweep
    has finished, at its best learning rate."""
    tasks = []
    for f in config.families:
        for w in sorted(config.widths, reverse=True):  # longest runs first
            for p in PARAMETRISATIONS:
                best = best_lr(config, losses, Task(f, p, w, 0))
                if best is not None:
                    tasks.append(Task(f, p, w, best, fp8=True))
    return tasks


def _fp8_losses(config: Config, losses: Losses, done: dict[str, float]) -> Fp8Losses:
    fp8: Fp8Losses = {f: {p: {} for p in PARAMETRISATIONS} for f in config.families}
    for task in fp8_tasks(config, losses):
        if task.key in done:
            fp8[task.family][task.parametrisation][task.width] = done[task.key]
    return fp8


def change(fp32: float, fp8: float) -> float:
    """FP8's loss relative to FP32's (inf if the FP8 run diverged)."""
    return (fp8 - fp32) / fp32 if math.isfinite(fp8) else math.inf


def percent(x: float) -> str:
    return f"{100 * x:+.2f}%" if math.isfinite(x) else "diverged"


def span(xs: list[float]) -> str:
    """``-0.10% to +0.52%`` (or the one value)."""
    low, high = percent(min(xs)), percent(max(xs))
    return low if low == high else f"{low} to {high}"


def magnitude(xs: list[float]) -> str:
    """``15.56% to 25.47%``: the sizes of changes that share a sign."""
    return span([abs(x) for x in xs]).replace("+", "")


def plot(config: Config, results: Results, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    losses = results.fp32
    rows = len(config.families)
    fig, axes = plt.subplots(rows, 2, figsize=(12, 4.4 * rows), squeeze=False)
    colours = plt.get_cmap("viridis")
    for r, family in enumerate(config.families):
        for c, parametrisation in enumerate(PARAMETRISATIONS):
            ax = axes[r][c]
            fp8 = results.fp8[family][parametrisation]
            finite = [
                v
                for row in losses[family][parametrisation].values()
                for v in row.values()
                if math.isfinite(v)
            ] + [v for v in fp8.values() if math.isfinite(v)]
            # diverged runs off the top: the optimum's basin stays legible
            top = min(max(finite), min(finite) + 1.5) if finite else math.inf
            handles = []
            for i, width in enumerate(config.widths):
                row = losses[family][parametrisation][width]
                xs = [x for x in sorted(row) if math.isfinite(row[x])]
                if not xs:
                    continue
                colour = colours(i / max(1, len(config.widths) - 1) * 0.9)
                (line,) = ax.plot(
                    xs, [row[x] for x in xs], "o-", color=colour, label=f"{width}"
                )
                handles.append(line)
                best, _ = optimum(row)
                ax.plot(best, row[best], "*", color=colour, markersize=15, mec="k")
                if width in fp8:  # beside its FP32 optimum; at the top if off it
                    ax.plot(
                        best + 0.2,
                        min(fp8[width], top) if math.isfinite(fp8[width]) else top,
                        "D" if fp8[width] <= top else "^",
                        mfc="none",
                        mec=colour,
                        mew=2,
                        markersize=9,
                    )
            if finite:  # (room above for a ▲ at the top)
                ax.set_ylim(min(finite) - 0.05, top + 0.08)
            if fp8:
                handles.append(
                    Line2D(
                        [],
                        [],
                        marker="D",
                        linestyle="",
                        mfc="none",
                        mec="k",
                        mew=1.5,
                        label="FP8 at ★",
                    )
                )
            ax.set_title(f"{family}: {parametrisation}")
            ax.set_xlabel("log2 learning rate")
            ax.grid(alpha=0.3)
            ax.legend(handles=handles, title="width")
        axes[r][0].set_ylabel("validation loss (nats per byte)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def fp8_section(config: Config, results: Results) -> str:
    """The FP8 runs against the FP32 optima they repeat, and a verdict per family
    on the target: u-μP within 1% of FP32, SP more than 1% worse."""
    rows = []
    verdicts = []
    tolerance = f"{100 * FP8_TOLERANCE:g}%"
    for family in config.families:
        changes: dict[str, list[float]] = {p: [] for p in PARAMETRISATIONS}
        expected = 0
        for parametrisation in ("u-μP", "SP"):
            for width in config.widths:
                task = Task(family, parametrisation, width, 0)
                best = best_lr(config, results.fp32, task)
                if best is None:
                    continue
                expected += 1
                fp8 = results.fp8[family][parametrisation].get(width)
                if fp8 is None:
                    continue
                fp32 = results.fp32[family][parametrisation][width][best]
                changes[parametrisation].append(change(fp32, fp8))
                rows.append(
                    (
                        family,
                        parametrisation,
                        width,
                        f"2^{best}",
                        f"{fp32:.3f}",
                        f"{fp8:.3f}" if math.isfinite(fp8) else "diverged",
                        percent(change(fp32, fp8)),
                    )
                )
        umup, sp = changes["u-μP"], changes["SP"]
        if not umup and not sp:
            verdicts.append(f"**{family}**: no FP8 run has finished yet.")
            continue
        within = sum(abs(x) <= FP8_TOLERANCE for x in umup)
        worse = sum(x > FP8_TOLERANCE for x in sp)
        finished = len(umup) + len(sp) == expected
        met = finished and within == len(umup) > 0 and worse == len(sp) > 0
        status = "met" if met else "not met" if finished else "open"
        umup_note = (
            f"u-μP in FP8 ends {span(umup)} from its FP32 loss (within {tolerance} "
            f"at {within} of {len(umup)} widths)"
            if umup
            else "no u-μP FP8 run has finished"
        )
        sp_note = (
            f"SP in FP8 ends {span(sp)} ({worse} of {len(sp)} widths more than "
            f"{tolerance} worse)"
            if sp
            else "no SP FP8 run has finished"
        )
        halves = (
            f"u-μP's half {'met' if umup and within == len(umup) else 'not met'}, "
            f"SP's half {'met' if sp and worse == len(sp) else 'not met'}"
        )
        verdicts.append(
            f"**{family}: target {status}{'' if finished else ' (runs missing)'}** "
            f"({halves}). {umup_note}; {sp_note}."
        )
    table = markdown_table(
        (
            "family",
            "parametrisation",
            "width",
            "best lr",
            "FP32 loss",
            "FP8 loss",
            "FP8 vs FP32",
        ),
        rows,
    )
    verdict = "\n\n".join(verdicts)
    return f"""## Simulated FP8

Each family, width and parametrisation trained once more at the best learning
rate of its FP32 sweep (bold above) in simulated FP8: `simulate_fp8` applied to
the model (after `unit_scale` for u-μP) before its optimizer is built, as in
`fp8_training.py`, so the inputs of every matrix product are rounded to E4M3 and
their gradients to E5M2, with no loss scaling. Data, steps, schedule and seed
are those of the FP32 run. The target: u-μP within {tolerance} of its FP32
loss, SP degrading (its FP8 loss more than {tolerance} above its FP32 loss).

{table}

{verdict}
"""


Native = dict[int, tuple[int, float]]  # width -> (log2 lr, loss) of the optimum


def read_native(path: Path) -> tuple[dict[str, str], Native]:
    """From ``lr_transfer.py``'s page: its settings (as written there) and the
    best loss of ``uu.TransformerDecoder`` (u-μP) at each width."""
    text = path.read_text()
    settings = dict(
        re.findall(r"^- (\w+): (.*)$", text.split("## Settings")[-1], re.MULTILINE)
    )
    section = text.split("### u-μP")[1].split("\n#")[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    best: Native = {}
    for line in lines[2:]:  # after the header and its rule
        cells = [c.strip().strip("*") for c in line.strip("|").split("|")]
        row = {
            int(h.removeprefix("2^")): float(c)
            for h, c in zip(header, cells, strict=True)
            if h.startswith("2^") and c not in ("", "diverged")
        }
        lr = min(row, key=row.__getitem__)
        best[int(cells[0])] = (lr, row[lr])
    return settings, best


def native_section(config: Config, results: Results) -> str:
    """The transformed models' best u-μP losses beside the native
    ``uu.TransformerDecoder``'s, if ``lr_transfer.py`` ran the same sizes."""
    title = "## Against the native `uu.TransformerDecoder`"
    page = f"`{config.native.name}`"
    try:
        settings, native = read_native(config.native)
    except (OSError, IndexError, ValueError) as error:
        return f"{title}\n\nNot compared: {page} could not be read ({error}).\n"
    differ = [
        f"{k} {settings.get(k, '(missing)')} there, {getattr(config, k)} here"
        for k in SHARED
        if settings.get(k) != str(getattr(config, k))
    ]
    if differ:
        return (
            f"{title}\n\nNot compared: {page} (`lr_transfer.py`) was run at other "
            f"sizes or settings than these runs: {'; '.join(differ)}.\n"
        )
    header = ["width", "native (lr)"]
    rows = []
    gaps: dict[str, list[float]] = {f: [] for f in config.families}
    for width in config.widths:
        lr, loss = native[width]
        cells: list[str] = [str(width), f"{loss:.3f} (2^{lr})"]
        for family in config.families:
            row = results.fp32[family]["u-μP"][width]
            best = best_lr(config, results.fp32, Task(family, "u-μP", width, 0))
            if best is None:
                cells += ["", ""]
                continue
            gaps[family].append((row[best] - loss) / loss)
            cells += [f"{row[best]:.3f} (2^{best})", percent(gaps[family][-1])]
        rows.append(cells)
    for family in config.families:
        header += [f"{family} (lr)", f"{family} vs native"]
    table = markdown_table(header, rows)
    tolerance = f"{100 * NATIVE_TOLERANCE:g}%"
    llama = gaps.get("llama", [])
    if len(llama) < len(config.widths):
        verdict = "The Llama-style sweep has not finished: no verdict yet."
    else:
        within = all(abs(g) <= NATIVE_TOLERANCE for g in llama)
        side = (
            "lower (better) than"
            if max(llama) < 0
            else "higher (worse) than"
            if min(llama) > 0
            else "on both sides of"
        )
        verdict = (
            f"**Target (the transformed Llama-style model's best loss within "
            f"{tolerance} of the native decoder's): {'met' if within else 'not met'}"
            f".** At every width its best loss is {side} the native decoder's, "
            f"by {magnitude(llama) if side != 'on both sides of' else span(llama)}."
        )
        if max(llama) < -NATIVE_TOLERANCE:
            verdict += (
                f" It misses the {tolerance} band by being better, not worse: the "
                "native decoder is the one behind."
            )
    return f"""{title}

`lr_transfer.py` trains `uu.TransformerDecoder` (u-μP, `uu.optim.AdamW`) at the
same widths, depth ({config.layers} layers), head size ({HEAD_SIZE}), vocabulary
({VOCAB_SIZE} bytes), data, batch, steps and schedule as these runs, with the
Llama-style model's MLP (SwiGLU, 4× wide), over a ×2 grid of learning rates.
Its best validation loss at each width, read from {page} (not re-run), beside
the best u-μP losses of the transformed models here (their differences relative
to the native loss):

{table}

{verdict}

The two are not the same network beyond their parametrisation: the Llama-style
model encodes positions with RoPE and its RMSNorms have gains, while
`uu.TransformerDecoder` has no position encoding and no gains. The native
decoder's grid (log2 lr) is {settings.get("umup_lrs")}, the transformed models'
{config.umup_lrs}. The native numbers are those of {page} as
committed; `index.md` says whether that page predates later changes to the
native modules.
"""


# GPT-2's u-μP row before unit_scale tagged its Conv1D weights with their fan-in
# (2026-11-26): width -> (log2 lr, loss) at each width's optimum. The runs were
# trained again with the tag; the page compares the two.
GPT2_UMUP_BEFORE_FAN_IN: dict[int, tuple[int, float]] = {
    64: (-1, 2.285),
    128: (-1, 2.225),
    256: (-2, 2.236),
    512: (-2, 2.257),
}


def fan_in_note(by_width: Mapping[int, Mapping[int, float]]) -> str:
    """How GPT-2's u-μP optima moved when ``unit_scale`` began tagging ``Conv1D``
    weights with their fan-in, at the widths both have; "" if none."""
    widths = [w for w in GPT2_UMUP_BEFORE_FAN_IN if by_width.get(w)]
    if not widths:
        return ""
    before = {w: GPT2_UMUP_BEFORE_FAN_IN[w] for w in widths}
    now = {}
    for w in widths:
        best = int(optimum(by_width[w])[0])
        now[w] = (best, by_width[w][best])

    def cells(optima: Mapping[int, tuple[int, float]]) -> str:
        return " / ".join(f"{loss:.3f} (2^{lr})" for lr, loss in optima.values())

    def widest_minus_narrowest(optima: Mapping[int, tuple[int, float]]) -> float:
        return optima[widths[-1]][1] - optima[widths[0]][1]

    change = " / ".join(f"{now[w][1] - before[w][1]:+.3f}" for w in widths)
    return (
        "These runs were trained again after `unit_scale` began tagging GPT-2's "
        "`Conv1D` weights with their fan-in (2026-11-26; before, `c_attn` learned "
        "√3 too slowly, `c_fc` 2× too slowly and the MLP's `c_proj` 2× too fast). "
        f"Best loss (lr) at widths {' / '.join(map(str, widths))}: before "
        f"{cells(before)}, now {cells(now)}; change {change}. Widest minus "
        f"narrowest: before {widest_minus_narrowest(before):+.3f}, now "
        f"{widest_minus_narrowest(now):+.3f}."
    )


def report(
    config: Config, results: Results, seconds: float, jobs: int, trained: int
) -> str:
    """The page; ``trained`` of its runs were trained by this call, ``seconds``
    long, the others read from the cache."""
    losses = results.fp32
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
            note = (
                fan_in_note(by_width)
                if (family, parametrisation) == ("gpt2", "u-μP")
                else ""
            )
            sections.append(
                f"### {family}, {parametrisation}\n\n{table}\n\n{verdict}\n"
                + (f"\n{note}\n" if note else "")
            )
    settings = "\n".join(f"- {k}: {v}" for k, v in asdict(config).items())
    total = sum(len(r) for f in losses.values() for p in f.values() for r in p.values())
    total += sum(len(p) for f in results.fp8.values() for p in f.values())
    timing = (
        f"the runs read from `{config.cache.name}` (each saved as it finished)"
        if trained == 0
        else f"this call: {timing_note(seconds, jobs)}"
        if trained == total
        else f"this call trained {trained} of these {total} runs, the others read "
        f"from `{config.cache.name}`: {timing_note(seconds, jobs)}"
    )
    return reflow(f"""# Learning-rate transfer of `unit_scale`d Hugging Face decoders

Written by `python experiments/hf_transfer.py` (see its docstring). Each cell is
the validation loss after {config.steps} steps; {timing}. In the plot, ◇ marks
the run in simulated FP8 at each FP32 optimum (★), drawn just right of it (▲ at
the top: an FP8 loss above the axis).

![hf transfer](hf_transfer.png)

{chr(10).join(sections)}
{fp8_section(config, results)}
{native_section(config, results)}
## Settings

{settings}
""")


def main(argv: list[str] | None = None) -> Results:
    config, args = parse_config(Config, argv, parser=run_parser(__doc__.split("\n")[0]))
    torch.set_num_threads(1)
    done: dict[str, float] = (
        json.loads(config.cache.read_text()) if config.cache.exists() else {}
    )

    def pending(tasks: list[Task]) -> list[Task]:
        return [t for t in tasks if t.key not in done and not config.report_only]

    sweep = pending(
        [
            Task(f, p, w, x)
            for f in config.families  # one family complete before the next
            for w in sorted(config.widths, reverse=True)  # longest runs first
            for p in PARAMETRISATIONS
            for x in config.log2_lrs(p)
        ]
    )
    start = time.perf_counter()

    def record(args: tuple[Config, Task], curve: Curve) -> str:
        task = args[1]
        done[task.key] = curve.final_val
        config.cache.parent.mkdir(parents=True, exist_ok=True)
        config.cache.write_text(json.dumps(done, indent=1))
        return (
            f"{task.key}: validation loss {curve.final_val:.3f} ({curve.seconds:.0f} s)"
        )

    def run(tasks: list[Task]) -> int:
        if tasks:  # (a pool of no processes is an error)
            run_all(train_one, [(config, t) for t in tasks], args.jobs, record)
        return len(tasks)

    trained = run(sweep)  # the FP32 sweep first, then FP8 at its optima
    losses = _losses(config, done)
    trained += run(pending(fp8_tasks(config, losses)))
    results = Results(losses, _fp8_losses(config, losses, done))
    seconds = time.perf_counter() - start
    args.out.mkdir(parents=True, exist_ok=True)
    plot(config, results, args.out / "hf_transfer.png")
    text = report(config, results, seconds, args.jobs, trained)
    (args.out / "hf_transfer.md").write_text(text)
    print(text)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
