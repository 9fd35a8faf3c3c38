"""What moves u-μP's best learning rate between configurations: depth, or the rest?

At the recommended values configuration C of ``umup_defaults.py`` (8 layers,
32×128 tokens, 500 steps) trains better at lr 2^1 than at the recommended 2^0, at
widths 64 and 256, while A (2 layers, 16×64 tokens, 200 steps) and B (4 layers,
16×256 tokens, 1,000 steps) do best at 2^0. u-μP's rules multiply every hidden
weight's lr by depth^-½ (``uu.optim.lr_scale_for_depth``, depth = the number of
layers) so that the optimum stays where it is as layers are added. This script
separates what C changes:

- **depth alone**: A's shape (sequence 64, batch 16, 200 steps) at 2, 4, 8 and 16
  layers;
- **the rest alone**: C's shape (sequence 128, batch 32, 500 steps) at 2 layers
  beside its own 8;
- **its length or its steps' size**: C at 8 layers trained for A's 200 steps
  (its batch and sequence kept), between A at 8 layers (16×64 tokens a step,
  200 steps) and C itself (32×128 tokens a step, 500 steps).

Each at width 64 (``--widths`` adds others), u-μP at ``RECOMMENDED``'s
multipliers, lr on a ×2 grid from 2^-1 to 2^2, widened by a step while the
optimum (mean over the seeds) is at an edge; seeds 0 and 1, which read the same
batches at every lr. A run that ``umup_defaults.py`` already stored (the shapes of
A and C themselves) is read from its cache instead of trained again.

Every finished run is added to ``--cache`` as it finishes, so the script resumes::

    python experiments/umup_depth.py --jobs 2
    python experiments/umup_depth.py --report   # the page from stored runs
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from _common import DOCS, markdown_table, reflow
from umup_defaults import CACHE as DEFAULTS_CACHE
from umup_defaults import (
    CONFIGS,
    Grid,
    Runs,
    Shape,
    grid_best,
    load,
    train_missing,
    train_shape,
    widen,
)

import unit_scaling as uu

SEEDS = (0, 1)
WIDTHS = (64,)
GRID = (-1, 0, 1, 2)  # log2 lr, before any widening
MAX_WIDENING = 2  # grid steps the sweep may widen on each side
CACHE = DOCS / "umup_depth_runs.json"


@dataclass(frozen=True)
class Probe:
    """One shape: configuration ``base``'s sequence, batch and steps at
    ``layers`` layers, trained for ``steps`` steps when given."""

    base: str
    layers: int
    steps: int | None = None

    @property
    def shape(self) -> Shape:
        shape = dataclasses.replace(CONFIGS[self.base], layers=self.layers)
        return (
            shape
            if self.steps is None
            else dataclasses.replace(shape, steps=self.steps)
        )

    @property
    def itself(self) -> bool:
        """Whether this is the configuration's own shape."""
        return self.shape == CONFIGS[self.base]

    @property
    def label(self) -> str:
        shape = self.shape
        own = f" ({self.base} itself)" if self.itself else ""
        return (
            f"{self.base}'s shape ({shape.batch_size}×{shape.seq_len} tokens, "
            f"{shape.steps} steps), {self.layers} layers{own}"
        )


PROBES = (
    *(Probe("A", layers) for layers in (2, 4, 8, 16)),
    Probe("C", 2),
    Probe("C", 8),
    Probe("C", 8, steps=CONFIGS["A"].steps),
)


@dataclass(frozen=True)
class Run:
    probe: Probe
    width: int
    log2_lr: float
    seed: int

    @property
    def key(self) -> str:
        """``umup_defaults.py``'s key for the configurations' own shapes (so
        their stored runs are found), the configuration with its depth for the
        others."""
        probe = self.probe
        name = probe.base
        if probe.layers != CONFIGS[probe.base].layers:
            name += f"@{probe.layers}layers"
        if probe.steps is not None and probe.steps != CONFIGS[probe.base].steps:
            name += f"@{probe.steps}steps"
        multipliers = ",".join(
            f"{k}={v:g}" for k, v in sorted(uu.RECOMMENDED.multipliers.items())
        )
        return f"{name}/u-μP/{self.width}/{self.log2_lr:g}/{self.seed}/{multipliers}"

    @property
    def cost(self) -> float:
        shape = self.probe.shape
        return shape.steps * shape.batch_size * shape.seq_len * (shape.layers + 1)


def train_run(run: Run) -> dict[str, float]:
    return train_shape(run.probe.shape, "u-μP", run.width, run.log2_lr, run.seed)


def loss(runs: Runs, run: Run) -> float | None:
    found = runs.get(run.key)
    if found is None:
        return None
    value = found["loss"]
    return math.inf if value is None or not math.isfinite(value) else float(value)


def sweep(runs: Runs, probe: Probe, width: int) -> Grid:
    """log2 lr -> mean loss over the seeds (None while a seed is missing), the
    grid widened by a step while its optimum is at an edge."""
    bounds: tuple[int, int] | None = (GRID[0], GRID[-1])
    while bounds is not None:
        grid: Grid = {}
        for x in range(bounds[0], bounds[1] + 1):
            found = [loss(runs, Run(probe, width, x, s)) for s in SEEDS]
            values = [v for v in found if v is not None]
            grid[x] = statistics.fmean(values) if len(values) == len(SEEDS) else None
        bounds = widen(grid, GRID[0] - MAX_WIDENING, GRID[-1] + MAX_WIDENING)
    return grid


def best_lr(runs: Runs, probe: Probe, width: int) -> float | None:
    """The optimum of the finished sweep (log2 lr); None while it is unfinished."""
    return grid_best(sweep(runs, probe, width))


def needed(runs: Runs, widths: Iterable[int]) -> list[Run]:
    """The runs still missing that the stored ones make known, longest first."""
    todo = [
        Run(probe, width, x, seed)
        for probe in PROBES
        for width in widths
        for x in sweep(runs, probe, width)
        for seed in SEEDS
    ]
    return sorted(
        (r for r in todo if r.key not in runs), key=lambda r: r.cost, reverse=True
    )


def stored(cache: Path) -> Runs:
    """This experiment's runs over ``umup_defaults.py``'s (its keys are shared
    for the configurations' own shapes)."""
    return {**load(DEFAULTS_CACHE), **load(cache)}


def run(widths: list[int], jobs: int, cache: Path) -> float:
    """Trains the missing runs, saving each to ``cache`` as it finishes."""
    return train_missing(lambda: needed(stored(cache), widths), train_run, jobs, cache)


# -- the page ------------------------------------------------------------------


def depth_factor(layers: int) -> float:
    """log2 of the factor u-μP's rules put on a hidden weight's lr at this depth."""
    return -0.5 * math.log2(layers)


def findings(runs: Runs, width: int) -> list[str]:
    """What the finished sweeps say: each probe's optimum, and whether depth or
    the rest of C moves it."""
    lr = math.log2(uu.RECOMMENDED.lr)
    notes = []
    for probe in PROBES:
        best = best_lr(runs, probe, width)
        if best is None:
            notes.append(f"{probe.label}: sweep not finished.")
            continue
        grid = sweep(runs, probe, width)
        at_rec = grid.get(lr)
        cost = (
            f", {at_rec - grid[best]:.3f} better than at the recommended 2^{lr:g}"  # type: ignore[operator]
            if at_rec is not None and best != lr
            else ""
        )
        edge = " (at the widened grid's edge)" if best in (min(grid), max(grid)) else ""
        effective = best + depth_factor(probe.layers)
        notes.append(
            f"{probe.label}: best lr 2^{best:g}{edge}{cost}; a hidden weight's lr "
            f"there is 2^{effective:g} after the depth rule."
        )
    return notes


def summary(runs: Runs, width: int) -> str:
    """The answer the sweeps give (empty while one is unfinished)."""
    best = {p: best_lr(runs, p, width) for p in PROBES}
    if any(v is None for v in best.values()):
        return ""
    lr = math.log2(uu.RECOMMENDED.lr)
    deep = [p for p in PROBES if p.base == "A"]
    depth_alone = "/".join(f"2^{best[p]:g}" for p in deep)
    layers = "/".join(str(p.layers) for p in deep)
    moved = {best[p] for p in deep} != {lr}
    shallow_c, own_c = best[Probe("C", 2)], best[Probe("C", CONFIGS["C"].layers)]
    lines = [
        f"**Depth alone** {'moves' if moved else 'does not move'} the optimum: "
        f"A's shape at {layers} layers does best at {depth_alone}"
        + ("" if moved else ", so u-μP's depth rule holds it in place here")
        + ".",
        f"**The rest of C alone** (its batch, sequence and steps at 2 layers): "
        f"2^{shallow_c:g}.",
        f"**Both** (C itself, {CONFIGS['C'].layers} layers): 2^{own_c:g}.",
    ]
    if not moved and shallow_c == lr and own_c != lr:
        c_layers = (2, CONFIGS["C"].layers)
        hidden = [best[Probe("C", n)] + depth_factor(n) for n in c_layers]  # type: ignore[operator]
        same = hidden[0] == hidden[1]
        lines.append(
            "Neither of C's differences moves the optimum alone; together they "
            "do, an interaction u-μP's rules do not model and a reason no single "
            "lr is best for every configuration. On A's shape the hidden weights' "
            "best lr falls with depth as the depth rule (× depth^-½) says; on C's, "
            f"the {c_layers[1]}-layer model's hidden weights do best at "
            f"2^{hidden[1]:g} after the rule"
            + (
                f", the same as the {c_layers[0]}-layer model's, as if the rule "
                "were not there."
                if same
                else f", the {c_layers[0]}-layer model's at 2^{hidden[0]:g}."
            )
        )
    short = next((p for p in PROBES if p.steps is not None), None)
    if short is not None:
        lines.append(_length_or_tokens(runs, width, short))
    return "\n".join(f"- {line}" for line in lines)


def _gap(runs: Runs, probe: Probe, width: int, x: float, y: float) -> list[float]:
    """Per seed: the loss at lr 2^x minus the loss at 2^y."""
    return [
        loss(runs, Run(probe, width, x, s)) - loss(runs, Run(probe, width, y, s))  # type: ignore[operator]
        for s in SEEDS
    ]


def _length_or_tokens(runs: Runs, width: int, short: Probe) -> str:
    """What the shortened probe says: how far C's preference for its own
    optimum over A's (at the same depth) comes from the tokens in each step,
    and how far from the number of steps."""
    full = Probe(short.base, short.layers)
    same_depth = next(p for p in PROBES if p.base == "A" and p.layers == short.layers)
    x_full, x_a = best_lr(runs, full, width), best_lr(runs, same_depth, width)
    at_short = best_lr(runs, short, width)
    shape = short.shape
    line = (
        f"**{short.base}'s shape at {short.layers} layers for {shape.steps} steps** "
        f"(its {shape.batch_size}×{shape.seq_len} tokens a step, A's length): best "
        f"2^{at_short:g}"
    )
    if x_full == x_a:
        return line + f", and 2^{x_a:g} at both ends: nothing to separate."
    shapes = {
        f"A's shape at {short.layers} layers": same_depth,
        f"{short.base}'s at {shape.steps} steps": short,
        f"{short.base}'s at {full.shape.steps} steps": full,
    }
    gaps = {name: _gap(runs, p, width, x_full, x_a) for name, p in shapes.items()}  # type: ignore[arg-type]
    means = [statistics.fmean(g) for g in gaps.values()]
    tokens, length = means[0] - means[1], means[1] - means[2]
    if tokens >= 3 * length:
        verdict = "mostly the tokens in each step move it, not the number of steps"
    elif length >= 3 * tokens:
        verdict = "mostly the number of steps moves it, not the tokens in each step"
    else:
        verdict = "both move it, in similar measure"
    per_shape = "; ".join(
        f"{name} {statistics.fmean(g):+.3f} ({', '.join(f'{v:+.3f}' for v in g)})"
        for name, g in gaps.items()
    )
    return (
        f"{line}. Loss at 2^{x_full:g} minus loss at 2^{x_a:g} (mean; each seed): "
        f"{per_shape}. Of the change, the tokens a step account for {tokens:.3f} "
        f"and the length for {length:.3f}: {verdict}."
    )


def table(runs: Runs, width: int) -> str:
    grids = {p: sweep(runs, p, width) for p in PROBES}
    xs = sorted({x for g in grids.values() for x in g})
    rows = []
    for probe, grid in grids.items():
        best = best_lr(runs, probe, width)
        cells = []
        for x in xs:
            value = grid.get(x)
            text = "—" if value is None else f"{value:.3f}"
            cells.append(f"**{text}**" if x == best else text)
        rows.append((probe.label, *cells, "—" if best is None else f"2^{best:g}"))
    header = ("shape", *(f"lr 2^{x:g}" for x in xs), "best")
    return markdown_table(header, rows)


def plot(runs: Runs, path: Path, width: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (
        ("A", False, "A's shape: loss against the lr you set"),
        (
            "A",
            True,
            "A's shape: against a hidden weight's lr\n(lr/√depth, u-μP's rule)",
        ),
        ("C", False, "C's shape: loss against the lr you set"),
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 5.0))
    colours = plt.get_cmap("viridis")
    depths = sorted({p.layers for p in PROBES})
    for ax, (base, effective, title) in zip(axes, panels, strict=True):
        for probe in (p for p in PROBES if p.base == base):
            grid = {x: v for x, v in sweep(runs, probe, width).items() if v is not None}
            if not grid:
                continue
            shift = depth_factor(probe.layers) if effective else 0.0
            xs = [x + shift for x in grid]
            colour = colours(depths.index(probe.layers) / max(1, len(depths) - 1))
            steps = "" if probe.steps is None else f", {probe.steps} steps"
            ax.plot(
                xs,
                list(grid.values()),
                "o-" if probe.steps is None else "o--",
                color=colour,
                label=f"{probe.layers} layers{steps}",
            )
            best = min(grid, key=grid.__getitem__)
            ax.plot(best + shift, grid[best], "*", color=colour, markersize=14)
        if not effective:
            ax.axvline(
                math.log2(uu.RECOMMENDED.lr),
                color="grey",
                ls="--",
                lw=1,
                label="recommended lr",
            )
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("log2 lr" + (" × depth^-½" if effective else ""))
        ax.grid(alpha=0.3)
        ax.legend(  # below the axes: the curves span the whole panel
            fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=3
        )
    axes[0].set_ylabel(f"validation loss, mean of seeds {SEEDS} (★ best)")
    fig.suptitle(f"u-μP at the recommended multipliers, width {width}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(runs: Runs, out: Path, widths: Iterable[int], seconds: float | None) -> None:
    keys = {r.key for r in _known(runs, widths)}
    own = {k: v for k, v in runs.items() if k in keys}
    core_minutes = sum(v["seconds"] for v in own.values()) / 60
    timing = (
        f" This invocation: {seconds / 60:.1f} min on {os.cpu_count()} CPU cores."
        if seconds
        else ""
    )
    sections = []
    for width in widths:
        image = f"umup_depth_{width}.png"
        plot(runs, out / image, width)
        notes = "\n".join(f"- {n}" for n in findings(runs, width))
        answer = summary(runs, width)
        sections.append(
            f"## Width {width}\n\n![loss against lr by depth]({image})\n\n"
            + (f"{answer}\n\n" if answer else "")
            + f"Validation loss, mean of seeds {', '.join(map(str, SEEDS))}; the "
            f"best of each row in bold.\n\n{table(runs, width)}\n\n{notes}\n"
        )
    missing = needed(runs, widths)
    text = f"""# What moves u-μP's best learning rate: depth, or the rest?

`python experiments/umup_depth.py` (see its docstring) sweeps u-μP's learning rate
at the recommended multipliers (`unit_scaling.RECOMMENDED`) on shapes between
configurations A and C of [u-μP out of the box](umup_defaults.md): A's sequence,
batch and steps at 2 to 16 layers (depth alone), and C's at 2 layers beside its
own 8 (the rest alone), and C at 8 layers for A's {CONFIGS["A"].steps} steps
(its length, or the tokens in each step?). u-μP's rules give a hidden weight
lr × depth^-½, which should hold the best lr in place as depth grows.

**Compute.** {len(own)} runs, {core_minutes:.0f} core-minutes (one CPU thread a
run, on a 2-core machine beside other work: upper bounds).{timing}
{f"Still to run: {len(missing)}." if missing else "Every sweep is finished."}

{chr(10).join(sections)}"""
    (out / "umup_depth.md").write_text(reflow(text))


def _known(runs: Runs, widths: Iterable[int]) -> list[Run]:
    return [
        Run(probe, width, x, seed)
        for probe in PROBES
        for width in widths
        for x in sweep(runs, probe, width)
        for seed in SEEDS
    ]


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--widths", nargs="+", type=int, default=list(WIDTHS))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--cache", type=Path, default=CACHE)
    parser.add_argument("--out", type=Path, default=DOCS)
    parser.add_argument("--report", action="store_true", help="only write the page")
    args = parser.parse_args()
    if any(w % 32 for w in args.widths):
        sys.exit("widths must be multiples of 32 (the head size)")
    seconds = None if args.report else run(args.widths, args.jobs, args.cache)
    report(stored(args.cache), args.out, args.widths, seconds)


if __name__ == "__main__":
    main()
