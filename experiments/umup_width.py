"""Why u-μP did not gain from width: the embedding's learning rate, and tying.

The update coordinate check (``coord_check.py``) shows every hidden layer's
update moving its output by the same amount at every width, and one exception:
the embedding's, which shrinks like ``width^-½``, because u-μP's Adam rule gives
every ``"weight"`` parameter the learning rate ``lr / √fan_in`` and the
embedding table's ``fan_in`` is its width. In a ``unit_scale``d GPT-2 the
readout is that same table (GPT-2 ties them), so there the readout's learning
rate shrinks like ``width^-½`` too. This script tests both explanations by
training the models of ``lr_transfer.py`` and ``hf_transfer.py`` (2 layers,
200 steps of 16×64 byte tokens, seed 0) at widths 64 to 512 with the cause
removed, beside the model as it is:

- ``native``: ``uu.TransformerDecoder`` at lr 2⁰, every multiplier at 1, and
  with ``unit_scaling.RECOMMENDED``'s multipliers;
- ``native, loss_mult only`` and ``native, residual_mult only``: one of the
  recommended multipliers at a time, to see which of them brings the gain;
- ``native, readout_mult 2^2`` and ``native, mhsa_mult 2^-2``: the readout's
  forward multiplier (which, unlike ``loss_mult``, the next layer's gradient
  sees in the forward pass too) and attention's temperature, one at a time;
- ``native, temperature probe``: ``native`` trained again, then evaluated with
  its logits multiplied by 2⁻¹…2² (is it merely under-confident?);
- ``native, width-free embedding lr``: the same, with the embedding's learning
  rate multiplied by ``√(width / 64)``: equal at width 64, constant in width
  above it (μP's rule for an input weight under Adam);
- ``gpt2``: ``unit_scale(GPT-2)`` at lr 2⁻¹ (``hf_transfer.py``'s optimum), as
  Hugging Face builds it (tied), and untied (``tie_word_embeddings=False``, so
  the readout gets u-μP's ``"output"`` rule); tied, with the shared table's
  learning rate by the ``"output"`` rule; and untied with each ``Conv1D``
  weight's learning rate taken from its true fan-in. GPT-2's ``Conv1D`` stores
  its weight as ``(in, out)``; read from the shape, as ``unit_scale`` did before
  2026-11-26, the fan-in is ``shape[1]``, so ``c_attn``'s lr is √3 too small,
  ``c_fc``'s 2× too small and the MLP's ``c_proj``'s 2× too large (a constant
  factor at every width, so not a cause of the width trend; measured here for
  its size). ``unit_scale`` now tags each with its true fan-in (``mup_fan_in``);
  the GPT-2 variants but the last keep the shape's, which they were measured
  with.

Each finished run is added to ``--cache`` (JSON) as it finishes; run again, it
trains only what is missing. Writes ``umup_width.md`` and ``umup_width.png``::

    python experiments/umup_width.py --jobs 2
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import multiprocessing
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from _common import DOCS, LanguageModel, markdown_table, reflow, train, validation_set
from hf_transfer import Config as HfConfig
from hf_transfer import make_model as hf_make_model

import unit_scaling as uu
from unit_scaling.data import Corpus
from unit_scaling.transforms import unit_scale

WIDTHS = (64, 128, 256, 512)
TEMPERATURES = (-1, 0, 1, 2)  # log2 of the loss_mult the temperature probe tries
BASE_WIDTH = 64
CACHE = DOCS / "umup_width_runs.json"
STEPS, BATCH, SEQ, WARMUP, VAL_BATCHES, SEED = 200, 16, 64, 20, 8, 0

VARIANTS = {  # name -> what it is, for the page
    "native": "uu.TransformerDecoder, lr 2^0, multipliers at 1",
    "native, width-free embedding lr": "the same, embedding lr × √(width/64)",
    "native, temperature probe": (
        "'native' once more, then its validation loss with its logits multiplied "
        "(loss_mult set after training) by 2^-1…2^2"
    ),
    "native, loss_mult only": "lr 2^0, RECOMMENDED's loss_mult, residual_mult 1",
    "native, residual_mult only": "lr 2^0, RECOMMENDED's residual_mult, loss_mult 1",
    "native, readout_mult 2^2": (
        "lr 2^0, readout_mult 4 (the logits ×4 in the forward pass), others 1"
    ),
    "native, mhsa_mult 2^-2": "lr 2^0, mhsa_mult 1/4 (attention temperature), others 1",
    "native, recommended": "uu.TransformerDecoder, lr 2^0, RECOMMENDED's multipliers",
    "native, recommended, width-free embedding lr": (
        "the same, embedding lr × √(width/64)"
    ),
    "gpt2, tied": (
        "unit_scale(GPT-2), lr 2^-1, wte tied to the readout, the table at the "
        "weight rule's lr/√width (unit_scale's tag before 2026-11-26)"
    ),
    "gpt2, tied, output rule": (
        "tied, the shared table at the output rule's lr (unit_scale's tag since)"
    ),
    "gpt2, untied": (
        "unit_scale(GPT-2), lr 2^-1, tie_word_embeddings=False, Conv1D weights' "
        "lr from shape[1] (unit_scale's rule before 2026-11-26, as every GPT-2 "
        "row above)"
    ),
    "gpt2, untied, Conv1D fan-in": (
        "the same, Conv1D weights' lr from their true fan-in (shape[0]; "
        "unit_scale's tag since)"
    ),
}


@dataclass(frozen=True)
class Task:
    variant: str
    width: int

    @property
    def key(self) -> str:
        return f"{self.variant}/{self.width}"


def _native(task: Task) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    multipliers = uu.RECOMMENDED.multipliers if "recommended" in task.variant else {}
    for name in ("loss_mult", "residual_mult"):
        if f"{name} only" in task.variant:
            multipliers = {name: uu.RECOMMENDED.multipliers[name]}
    if "readout_mult 2^2" in task.variant:
        multipliers = {"readout_mult": 4.0}
    if "mhsa_mult 2^-2" in task.variant:
        multipliers = {"mhsa_mult": 0.25}
    torch.manual_seed(SEED)
    model = uu.TransformerDecoder(
        task.width, 256, layers=2, heads=task.width // 32, **multipliers
    )
    optimizer = uu.optim.AdamW(model.parameters(), lr=1.0)
    if "width-free" in task.variant:
        embedding = model.embedding.weight
        for group in optimizer.param_groups:
            if any(p is embedding for p in group["params"]):
                group["lr"] *= math.sqrt(task.width / BASE_WIDTH)
    return model, optimizer


def _gpt2(task: Task) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = hf_make_model("gpt2", task.width, HfConfig())
    if "untied" in task.variant:
        config = model.config
        config.tie_word_embeddings = False
        torch.manual_seed(SEED)
        loss_type = model.loss_type  # (set by the zoo's builder: forward logs without)
        model = type(model)(config)
        model.loss_type = loss_type
        assert model.lm_head.weight is not model.transformer.wte.weight
    scaled = unit_scale(model, residual_scaling="u-μP")
    optimizer = uu.optim.AdamW(scaled.parameters(), lr=2.0**-1)
    if "tied" in task.variant and "untied" not in task.variant:
        # The shared table's lr, set here whatever unit_scale tags it: by the
        # weight rule, lr/sqrt(width) (unit_scale's tag before 2026-11-26), or
        # by the output rule, lr (its tag since).
        table = dict(scaled.named_parameters())["transformer.wte.weight"]
        lr = 2.0**-1
        if "output rule" not in task.variant:
            lr /= math.sqrt(table.shape[1])
        for group in optimizer.param_groups:
            if group["params"][0] is table:
                group["lr"] = lr
    if "fan-in" not in task.variant:
        # The rule the other variants were measured with: the fan-in read from
        # the shape, shape[1], where unit_scale now tags shape[0].
        conv1d = type(model.transformer.h[0].attn.c_attn)
        weights = {
            id(m.weight): m.weight.shape
            for m in scaled.modules()
            if isinstance(m, conv1d)
        }
        for group in optimizer.param_groups:
            shape = weights.get(id(group["params"][0]))
            if shape is not None:  # lr ∝ 1/sqrt(fan_in): shape[0] -> shape[1]
                group["lr"] *= math.sqrt(shape[0] / shape[1])
    return LanguageModel(scaled), optimizer


def train_one(task: Task) -> dict[str, Any]:
    torch.set_num_threads(1)
    make = _gpt2 if task.variant.startswith("gpt2") else _native
    model, optimizer = make(task)
    corpus = Corpus()
    validation = validation_set(corpus, VAL_BATCHES, BATCH, SEQ)
    curve = train(
        model,
        optimizer,
        corpus.batches("train", BATCH, SEQ, seed=SEED),
        STEPS,
        validation,
        warmup=WARMUP,
    )
    result: dict[str, Any] = {"loss": curve.final_val, "seconds": curve.seconds}
    if "temperature probe" in task.variant:  # the trained model, other temperatures
        model.eval()
        with torch.no_grad():
            for log2_t in TEMPERATURES:
                model.loss_mult = 2.0**log2_t  # type: ignore[assignment]
                losses = [float(model.loss(b)) for b in validation]  # type: ignore[operator]
                result[f"loss at 2^{log2_t}"] = sum(losses) / len(losses)
    return result


def load(path: Path) -> dict[str, dict[str, float]]:
    return json.loads(path.read_text()) if path.exists() else {}


def run(cache: Path, jobs: int) -> float:
    start = time.perf_counter()
    done = load(cache)
    tasks = [
        Task(v, w) for w in reversed(WIDTHS) for v in VARIANTS if f"{v}/{w}" not in done
    ]
    if not tasks:
        return 0.0
    context = multiprocessing.get_context("spawn")
    with context.Pool(min(jobs, len(tasks))) as pool:
        for task, result in zip(tasks, pool.imap(train_one, tasks), strict=True):
            done = load(cache)
            done[task.key] = result
            tmp = cache.with_suffix(".tmp")
            tmp.write_text(json.dumps(done, indent=1, sort_keys=True) + "\n")
            os.replace(tmp, cache)
            print(f"{task.key}: {result['loss']:.3f}", flush=True)
    return time.perf_counter() - start


def _row(done: dict[str, dict[str, float]], variant: str) -> list[float] | None:
    """The variant's losses at every width, or None while one is missing."""
    losses = [done.get(f"{variant}/{w}", {}).get("loss") for w in WIDTHS]
    return None if any(v is None for v in losses) else losses  # type: ignore[return-value]


def _trend(losses: list[float]) -> str:
    return " / ".join(f"{v:.3f}" for v in losses) + (
        f" (width {WIDTHS[-1]} − width {WIDTHS[0]}: {losses[-1] - losses[0]:+.3f})"
    )


def findings(done: dict[str, dict[str, float]]) -> str:
    """What the runs show, as a list (each item only once its runs are in)."""
    row = functools.partial(_row, done)
    items = []
    native, free = row("native"), row("native, width-free embedding lr")
    if native and free:
        items.append(
            f"**The embedding's lr rule costs the defaults part of their gain.** At "
            f"every multiplier 1: {_trend(native)}; with the embedding's lr constant "
            f"in width: {_trend(free)}."
        )
    rec, rec_free = (
        row("native, recommended"),
        row("native, recommended, width-free embedding lr"),
    )
    if rec and rec_free:
        items.append(
            f"**At the recommended multipliers it does not matter**: "
            f"{_trend(rec)}, and with the width-free embedding lr {_trend(rec_free)}. "
            "So the library's rule (the seed library's too) stays as it is."
        )
    probes = [done.get(f"native, temperature probe/{w}") for w in WIDTHS]
    if all(probes):
        cells, bests = [], []
        for width, probe in zip(WIDTHS, probes, strict=True):
            assert probe is not None
            by_t = {t: probe[f"loss at 2^{t}"] for t in TEMPERATURES}
            best = min(by_t, key=by_t.__getitem__)
            bests.append(best)
            cells.append(f"width {width}: 2^{best} ({by_t[best]:.3f} vs {by_t[0]:.3f})")
        sharper = any(b > 0 for b in bests)
        items.append(
            "**Is the model trained at multipliers 1 just under-confident?** Its "
            "logits multiplied after training by 2^-1…2^2 (`loss_mult` set then, "
            "nothing retrained); the best factor (loss there vs at 2^0): "
            + "; ".join(cells)
            + (
                ". Partly: a sharper softmax after training helps, but "
                if sharper
                else ". No: the trained models are calibrated at 2^0, so "
            )
            + "`loss_mult` does its work during training: it multiplies the "
            "logits that the readout's steps build and the signal every layer "
            "learns from, which rescaling them afterwards does not."
        )
    loss_only, residual_only = (
        row("native, loss_mult only"),
        row("native, residual_mult only"),
    )
    if loss_only and residual_only:
        items.append(
            f"**Which multiplier brings the gain**: `loss_mult` alone "
            f"{_trend(loss_only)}; `residual_mult` alone {_trend(residual_only)}."
        )
    readout, attention = row("native, readout_mult 2^2"), row("native, mhsa_mult 2^-2")
    if readout:
        items.append(
            f"**`readout_mult` 2² in place of `loss_mult` 2²** (the same logits "
            f"in the loss, also scaled in the forward pass): {_trend(readout)}."
        )
    if attention:
        items.append(
            f"**Attention's temperature** (`mhsa_mult` 2⁻², others 1): "
            f"{_trend(attention)}."
        )
    tied, untied = row("gpt2, tied"), row("gpt2, untied")
    if tied and untied:
        items.append(
            f"**GPT-2's tied readout is why it did not gain.** Tied (the table "
            f"tagged `weight`, lr/√width): {_trend(tied)}; untied (its own "
            f"readout, tagged `output`): {_trend(untied)}."
        )
    output_rule = row("gpt2, tied, output rule")
    if output_rule and tied:
        gains = [a - b for a, b in zip(tied, output_rule, strict=True)]
        items.append(
            f"**Tied, with the shared table at the output rule's lr**: "
            f"{_trend(output_rule)}, {min(gains):.3f} to {max(gains):.3f} below the "
            "weight rule at every width, so `unit_scale` now tags a readout tied "
            "to an embedding table `output` (it used to keep `weight`). The tag "
            "fixes the level, not the trend: the one table serves an input and "
            "an output, whose u-μP rules differ, and only untying let GPT-2 gain "
            "from width here. Untie it (`tie_word_embeddings=False`) for u-μP."
        )
    fan_in = row("gpt2, untied, Conv1D fan-in")
    if untied and fan_in:
        change = [a - b for a, b in zip(fan_in, untied, strict=True)]
        items.append(
            f"**GPT-2's Conv1D weights' fan-in** (their lr from `shape[0]`, the "
            f"true fan-in, instead of `shape[1]`): {_trend(fan_in)} against "
            f"{_trend(untied)}. The lr error is the same factor at every width, "
            f"yet fixing it moves the loss by {change[0]:+.3f} at width "
            f"{WIDTHS[0]} and {change[-1]:+.3f} at {WIDTHS[-1]}: it matters, but "
            "it is not what held GPT-2 back. `unit_scale` now tags each `Conv1D` "
            "weight with its true fan-in (`mup_fan_in`), so this row is what "
            "`unit_scale(GPT-2)` untied gets."
        )
    return "\n".join(f"- {item}" for item in items)


def report(done: dict[str, dict[str, float]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 5.6))
    rows = []
    for variant in VARIANTS:
        losses = [done.get(f"{variant}/{w}", {}).get("loss") for w in WIDTHS]
        rows.append(
            (
                f"{variant}: {VARIANTS[variant]}",
                *("—" if v is None else f"{v:.3f}" for v in losses),
            )
        )
        if "probe" in variant:  # its losses are native's (the same run again)
            continue
        ax = axes[1] if variant.startswith("gpt2") else axes[0]
        xs = [w for w, v in zip(WIDTHS, losses, strict=True) if v is not None]
        ys = [v for v in losses if v is not None]
        style = "--" if "width-free" in variant or "untied" in variant else "-"
        ax.plot(xs, ys, "o" + style, label=variant)
    for ax, title in zip(
        axes,
        ("uu.TransformerDecoder, lr 2^0", "unit_scale(GPT-2), lr 2^-1"),
        strict=True,
    ):
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(WIDTHS), [str(w) for w in WIDTHS])
        ax.minorticks_off()
        ax.grid(alpha=0.3)
        ax.set_xlabel("width")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    axes[0].set_ylabel("validation loss after 200 steps (seed 0)")
    fig.tight_layout()
    fig.savefig(out / "umup_width.png", dpi=120)
    plt.close(fig)
    minutes = sum(r["seconds"] for r in done.values()) / 60
    table = markdown_table(("variant", *(f"width {w}" for w in WIDTHS)), rows)
    text = f"""# Why u-μP did not gain from width

Written by `python experiments/umup_width.py` (see its docstring): {len(done)}
runs, {minutes:.0f} core-minutes. Validation loss after 200 steps of 16×64 byte
tokens, 2 layers, seed 0: one seed a cell, so differences below about 0.02 (the
spread of 3 seeds at these settings, [sequential search](umup_search_sequential.md))
are noise.

![loss against width](umup_width.png)

{table}

## What it shows

{findings(done)}
"""
    (out / "umup_width.md").write_text(reflow(text))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--cache", type=Path, default=CACHE)
    parser.add_argument("--out", type=Path, default=DOCS)
    args = parser.parse_args()
    run(args.cache, args.jobs)
    report(load(args.cache), args.out)


if __name__ == "__main__":
    main()
