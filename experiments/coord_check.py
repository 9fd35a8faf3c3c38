"""Coordinate check: u-μP keeps activation scales and update sizes flat across
width, SP does not.

Trains ``uu.TransformerDecoder`` with ``uu.optim.AdamW`` (u-μP, at the
recommended values ``unit_scaling.RECOMMENDED`` and with every multiplier at 1)
and the same architecture in the standard parametrisation
(``StandardTransformerDecoder`` with ``torch.optim.AdamW`` at one fixed learning
rate) at widths 64 to 512 for a few steps on the built-in corpus, recording the
RMS of every layer's output and the size of every step
(``coord_check(updates=True)``: ``‖ΔW‖/‖W‖`` and the change of the layer's
output it causes). Writes ``docs/results/img/coord_check.png``,
``docs/results/img/coord_check_updates.png`` and ``docs/results/coord_check.md``.
A few minutes on 2 CPU cores::

    python experiments/coord_check.py
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from _common import reflow

import unit_scaling as uu
from unit_scaling.analysis import coord_check, coord_check_spread, plot_coord_check
from unit_scaling.app.baseline import StandardTransformerDecoder
from unit_scaling.app.config import parse_config, setting

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 256


@dataclass(frozen=True)
class Config:
    widths: tuple[int, ...] = (64, 128, 256, 512)
    layers: int = 2
    head_size: int = 32
    steps: int = setting(10, "AdamW steps at each width")
    batch_size: int = 16
    seq_len: int = 64
    lr_sp: float = 2**-7


# Layers both models share, under the same attribute names.
PANELS = {
    "embedding": "embedding",
    "linear_qkv": "attention QKV",
    "linear_o": "attention out",
    "linear_gate": "MLP gate",
    "linear_2": "MLP out",
    "layers": "block output",
    "projection": "logits",
}


Factory = Callable[[int], tuple[torch.nn.Module, torch.optim.Optimizer]]


def make_umup(config: Config, recommended: bool) -> Factory:
    multipliers = uu.RECOMMENDED.multipliers if recommended else {}

    def make(width: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        heads = width // config.head_size
        model = uu.TransformerDecoder(width, VOCAB, config.layers, heads, **multipliers)
        return model, uu.optim.AdamW(model.parameters(), lr=uu.RECOMMENDED.lr)

    return make


UMUP = "u-μP"  # at the recommended values
UMUP_ONES = "u-μP, multipliers 1"
LABELS = (UMUP, UMUP_ONES, "SP")


def make_sp(config: Config) -> Factory:
    def make(width: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        heads = width // config.head_size
        model = StandardTransformerDecoder(width, VOCAB, config.layers, heads)
        return model, torch.optim.AdamW(model.parameters(), lr=config.lr_sp)

    return make


def role(module_name: str) -> str:
    """``layers.1.mhsa.linear_qkv`` -> ``attention QKV``; ``layers.1`` -> block."""
    last = module_name.split(".")[-1]
    return PANELS.get("layers" if last.isdigit() else last, "")


def markdown_table(spread: pd.DataFrame, step: int, roles: list[str]) -> str:
    part = spread[spread["step"] == step].pivot(
        index="role", columns="label", values=["spread", "slope"]
    )
    header = [f"{label} {what}" for what in ("spread", "slope") for label in LABELS]
    lines = [
        "| layer | " + " | ".join(header) + " |",
        "| --- |" + " ---: |" * len(header),
    ]
    for name in roles:
        cells = [f"{part.loc[name, ('spread', label)]:.2f}" for label in LABELS]
        cells += [f"{part.loc[name, ('slope', label)]:+.2f}" for label in LABELS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


UPDATE_PANELS = [name for name in PANELS.values() if name != "block output"]


def main(argv: list[str] | None = None) -> None:
    config, _ = parse_config(Config, argv, __doc__.split("\n")[0])
    torch.set_num_threads(max(1, torch.get_num_threads()))

    start = time.perf_counter()
    options = {
        "steps": config.steps,
        "batch_size": config.batch_size,
        "seq_len": config.seq_len,
        "updates": True,
    }
    factories = (make_umup(config, True), make_umup(config, False), make_sp(config))
    df = pd.concat(
        [
            coord_check(make, config.widths, label=label, **options)
            for label, make in zip(LABELS, factories, strict=True)
        ]
    )
    df["role"] = df["module"].map(role)
    df = df[df["role"] != ""]
    elapsed = time.perf_counter() - start

    r = uu.RECOMMENDED
    lrs = f"u-μP lr {r.lr:g}, SP lr {config.lr_sp:g}"
    shape = (
        f"{config.layers}-layer decoder, head size {config.head_size}, "
        f"{config.steps} AdamW steps ({lrs})"
    )
    images = ROOT / "docs" / "results" / "img"
    images.mkdir(parents=True, exist_ok=True)
    fig = plot_coord_check(
        df, by="role", panels=list(PANELS.values()), title=f"Activation RMS: {shape}"
    )
    fig.savefig(images / "coord_check.png", dpi=110)
    fig = plot_coord_check(
        df,
        by="role",
        panels=UPDATE_PANELS,
        value="output_update",
        title=f"Each step's change of a layer's output, its own update alone: {shape}",
    )
    fig.savefig(images / "coord_check_updates.png", dpi=110)

    spread = coord_check_spread(df, by="role")
    updates = coord_check_spread(df, by="role", value="output_update")
    weights = coord_check_spread(df, by="role", value="weight_update")
    last = config.steps
    summary = spread[spread["step"] == last].groupby("label")["spread"]
    embedding = updates[(updates["role"] == "embedding")].groupby("label")["slope"]
    hidden = updates[~updates["role"].isin(["embedding", "logits"])]
    hidden_slope = hidden.groupby("label")["slope"].apply(lambda x: x.abs().max())
    report = f"""# Coordinate check

`python experiments/coord_check.py` ({elapsed:.0f} s on {os.cpu_count()} CPU cores)
trains a {config.layers}-layer decoder at widths {", ".join(map(str, config.widths))}
for {config.steps} AdamW steps (batch {config.batch_size} × {config.seq_len} byte tokens
of the built-in corpus, the same batches at every width) and records, for every layer
(layers of one kind averaged over depth, geometric mean), the RMS of its output and
the size of each step (`coord_check(..., updates=True)`):

- **{UMUP}**: `uu.TransformerDecoder(**uu.RECOMMENDED.multipliers)` +
  `uu.optim.AdamW(lr=uu.RECOMMENDED.lr)` (lr {r.lr:g}, `residual_mult`
  {r.residual_mult:g}, `loss_mult` {r.loss_mult:g});
- **{UMUP_ONES}**: the same with every multiplier at 1;
- **SP**: `StandardTransformerDecoder` (GPT-2 init) +
  `torch.optim.AdamW(lr={config.lr_sp:g})`.

## Activations

![coordinate check](img/coord_check.png)

*spread* is log₂(largest / smallest RMS across the widths) — 0 is flat, 1 is a
factor of two; *slope* is the least-squares slope of log₂ RMS against log₂ width
(½ means RMS ∝ √width).

### At initialisation (step 0)

{markdown_table(spread, 0, list(PANELS.values()))}

### After {last} steps

{markdown_table(spread, last, list(PANELS.values()))}

Largest spread after {last} steps: {UMUP} {summary.max()[UMUP]:.2f}, SP
{summary.max()["SP"]:.2f} (mean over layers: {UMUP} {summary.mean()[UMUP]:.2f},
SP {summary.mean()["SP"]:.2f}).

u-μP's hidden activations stay at the same RMS at every width, at initialisation
and while training. SP's grow with width from the start (fixed init std 0.02 makes a
linear layer's output RMS ∝ √width) and much faster once training starts. The one
u-μP curve that is not flat at step 0 is the logits: μP's readout multiplier
1/fan_in makes them shrink like width^-½ at initialisation by design, and training
lifts them to a width-independent value within a few steps.

## Updates

μP is stated in terms of updates: each step should change every layer's output by
an amount that does not depend on width. `output_update` is ‖Δy‖/‖y‖, the change of
a layer's output on the same input caused by that layer's own step (upstream layers'
steps do not enter); `weight_update` is ‖ΔW‖/‖W‖ of the layer's own parameters.

![update coordinate check](img/coord_check_updates.png)

Slope of log₂ `output_update` against log₂ width (0: the same change at every
width), at the first step and at the last:

### Step 0

{markdown_table(updates, 0, UPDATE_PANELS)}

### Step {last - 1}

{markdown_table(updates, last - 1, UPDATE_PANELS)}

Slope of log₂ `weight_update` at the first step:

{markdown_table(weights, 0, UPDATE_PANELS)}

Reading it:

- **Hidden layers follow μP under u-μP**: the largest |slope| of a hidden layer's
  output update over all steps is {hidden_slope[UMUP]:.2f} at the recommended
  values and {hidden_slope[UMUP_ONES]:.2f} with multipliers at 1 (SP:
  {hidden_slope["SP"]:.2f}). Their weights move by ‖ΔW‖/‖W‖ ∝ width^-½ (u-μP's Adam
  rule, lr/√fan_in, on unit-scale weights), which is exactly what keeps ‖ΔW·x‖
  constant: x has `width` coordinates that the update is aligned with.
- **The embedding is the exception**: its output update has a slope of
  {embedding.mean()[UMUP]:+.2f} under u-μP (SP: {embedding.mean()["SP"]:+.2f}). An
  embedding's output is the looked-up rows themselves, so no sum over the width
  makes up for a smaller step, and u-μP's rule gives the table (`fan_in` = width)
  lr/√width. At width 512 the embedding learns √8 ≈ 2.8× more slowly than at width 64.
  What this costs in loss is measured in [why u-μP did not gain from
  width](umup_width.md).
- **The logits** start ∝ width^-½ (μP's readout), so their relative change at
  step 0 grows with width; after a few steps it levels off.
"""
    (ROOT / "docs" / "results" / "coord_check.md").write_text(reflow(report))
    print(report)


if __name__ == "__main__":
    main()
