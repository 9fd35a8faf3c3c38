"""u-μP out of the box: the recommended values against SP tuned at every width.

``unit_scaling.RECOMMENDED`` was chosen on one proxy (configuration A at width
64, ``umup_search.py --strategy sequential``). This script checks it where it
was not chosen, on the byte-level decoder of ``lr_transfer.py`` (head size 32,
SwiGLU MLP, RMSNorm pre-norm) in three configurations, each at widths 64, 128,
256 and 512:

- **A**: 2 layers, sequence 64, batch 16, 200 steps (``lr_transfer.py``'s);
- **B**: 4 layers, sequence 256, batch 16, 1,000 steps;
- **C**: 8 layers, sequence 128, batch 32, 500 steps.

At every width of every configuration:

- **u-μP**: ``uu.TransformerDecoder(**RECOMMENDED.multipliers)`` with
  ``uu.optim.AdamW(lr=RECOMMENDED.lr)``, seeds 0, 1, 2;
- **SP**: ``StandardTransformerDecoder`` (GPT-2 init) with
  ``torch.optim.AdamW``, its learning rate swept on a ×2 grid with seed 0 (three
  values around a first guess, widened by a step while the optimum is at an
  edge), then seeds 1 and 2 at the best of them;
- at width 64 only, u-μP at the recommended multipliers with lr ×½ and ×2
  (seed 0): is the recommended lr still near the optimum of the new shape?

A seed sets the weights and the order of the training batches; both sides read
the same batches for a seed. The schedule is a linear warmup over the first 10%
of the steps, then cosine decay to 10%; the loss is the mean over a fixed
validation set of 8 batches. The targets (issue 27): at the recommended values,
u-μP's mean at width 512 is below its mean at width 64 by more than the seeds'
spread, and no worse than SP's mean at its best lr at every width.

Every finished run is added to ``--cache`` (JSON, committed beside the page) as
it finishes, so the experiment resumes across sessions: run again, it trains
only what is missing. ``--widths`` limits what is trained (the page reports
every stored run, and says which are missing)::

    python experiments/umup_defaults.py --configs B C --widths 64 128 --jobs 2
    python experiments/umup_defaults.py --report   # the page from stored runs
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch
from _common import DOCS, make_model, markdown_table, reflow, train, validation_set

import unit_scaling as uu
from unit_scaling.data import Corpus

WIDTHS = (64, 128, 256, 512)
SEEDS = (0, 1, 2)
# SP's first guess per width: lr_transfer.py's optimum (log2) at configuration A.
SP_GUESS = {64: -9, 128: -9, 256: -10, 512: -11}
MAX_WIDENING = 3  # grid steps SP's sweep may widen on each side of its guess
CACHE = DOCS / "umup_defaults_runs.json"


@dataclass(frozen=True)
class Shape:
    """What one configuration trains."""

    layers: int
    seq_len: int
    batch_size: int
    steps: int

    @property
    def warmup(self) -> int:
        return self.steps // 10

    @property
    def tokens(self) -> int:
        return self.steps * self.batch_size * self.seq_len


CONFIGS = {
    "A": Shape(layers=2, seq_len=64, batch_size=16, steps=200),
    "B": Shape(layers=4, seq_len=256, batch_size=16, steps=1000),
    "C": Shape(layers=8, seq_len=128, batch_size=32, steps=500),
}
VAL_BATCHES = 8


@dataclass(frozen=True)
class Task:
    config: str
    side: str  # "SP" or "u-μP"
    width: int
    log2_lr: float
    seed: int

    @property
    def key(self) -> str:
        extra = ""
        if self.side == "u-μP":  # the key names the multipliers it trained with
            extra = "/" + ",".join(
                f"{k}={v:g}" for k, v in sorted(uu.RECOMMENDED.multipliers.items())
            )
        return (
            f"{self.config}/{self.side}/{self.width}/{self.log2_lr:g}/{self.seed}"
            + extra
        )

    @property
    def cost(self) -> float:
        """A relative estimate of the run's time, to start the longest first."""
        shape = CONFIGS[self.config]
        return (
            shape.steps
            * shape.batch_size
            * shape.seq_len
            * shape.layers
            * (self.width**2 + 16 * self.width * shape.seq_len)
        )


def train_one(task: Task) -> dict[str, float]:
    return train_shape(
        CONFIGS[task.config], task.side, task.width, task.log2_lr, task.seed
    )


def train_shape(
    shape: Shape, side: str, width: int, log2_lr: float, seed: int
) -> dict[str, float]:
    """One run of ``side`` ("SP" or "u-μP", at ``RECOMMENDED``'s multipliers) of
    ``shape`` at ``width`` and lr ``2**log2_lr``, on one CPU thread; the seed
    sets the weights and the order of the training batches."""
    torch.set_num_threads(1)
    corpus = Corpus()
    torch.manual_seed(seed)
    if side == "u-μP":
        model = uu.TransformerDecoder(
            hidden_size=width,
            vocab_size=256,
            layers=shape.layers,
            heads=width // 32,
            **uu.RECOMMENDED.multipliers,
        )
        optimizer: torch.optim.Optimizer = uu.optim.AdamW(
            model.parameters(), lr=2.0**log2_lr
        )
    else:
        model = make_model("SP", width, shape.layers, seed)
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=2.0**log2_lr, weight_decay=0.0
        )
    curve = train(
        model,
        optimizer,
        corpus.batches("train", shape.batch_size, shape.seq_len, seed=seed),
        shape.steps,
        validation_set(corpus, VAL_BATCHES, shape.batch_size, shape.seq_len),
        warmup=shape.warmup,
        eval_every=shape.steps // 4,
    )
    return {
        "loss": curve.final_val,
        "seconds": curve.seconds,
        "val_loss": curve.val_loss,  # type: ignore[dict-item]
        "eval_steps": curve.eval_steps,  # type: ignore[dict-item]
    }


Runs = dict[str, dict[str, float]]


def load(path: Path) -> Runs:
    return json.loads(path.read_text()) if path.exists() else {}


def save(runs: Runs, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(runs, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def loss(runs: Runs, task: Task) -> float | None:
    run = runs.get(task.key)
    if run is None:
        return None
    value = run["loss"]
    return math.inf if value is None or not math.isfinite(value) else float(value)


Grid = dict[float, float | None]


def widen(grid: Grid, floor: int, ceiling: int) -> tuple[int, int] | None:
    """The next bounds of a ×2 lr sweep (log2 lr -> loss, None: to run): a step
    further while its optimum is at an edge, within ``floor`` and ``ceiling``;
    None when the sweep is done or waits for runs."""
    if any(v is None for v in grid.values()):
        return None
    low, high, best = min(grid), max(grid), grid_best(grid)
    if best == low and low > floor:
        return int(low) - 1, int(high)
    if best == high and high < ceiling:
        return int(low), int(high) + 1
    return None


def grid_best(grid: Grid) -> float | None:
    """The optimum of a finished sweep; None while a point is missing."""
    if any(v is None for v in grid.values()):
        return None
    return min(grid, key=lambda x: grid[x])  # type: ignore[arg-type,return-value]


def sp_sweep(runs: Runs, config: str, width: int) -> Grid:
    """SP's seed-0 sweep as far as it has gone: log2 lr -> loss (None: to run)."""
    guess = SP_GUESS[width]
    bounds: tuple[int, int] | None = (guess - 1, guess + 1)
    while bounds is not None:
        grid: Grid = {
            x: loss(runs, Task(config, "SP", width, x, 0))
            for x in range(bounds[0], bounds[1] + 1)
        }
        bounds = widen(grid, guess - 1 - MAX_WIDENING, guess + 1 + MAX_WIDENING)
    return grid


def sp_best(runs: Runs, config: str, width: int) -> float | None:
    """SP's best lr of seed 0's finished sweep; None while it is unfinished."""
    return grid_best(sp_sweep(runs, config, width))


def needed(runs: Runs, configs: Iterable[str], widths: Iterable[int]) -> list[Task]:
    """The runs still missing that the stored ones make known."""
    lr = math.log2(uu.RECOMMENDED.lr)
    tasks = []
    for config in configs:
        for width in widths:
            tasks += [Task(config, "u-μP", width, lr, s) for s in SEEDS]
            if width == min(WIDTHS):
                tasks += [Task(config, "u-μP", width, lr + d, 0) for d in (-1, 1)]
            grid = sp_sweep(runs, config, width)
            tasks += [Task(config, "SP", width, x, 0) for x, v in grid.items()]
            best = sp_best(runs, config, width)
            if best is not None:
                tasks += [Task(config, "SP", width, best, s) for s in SEEDS[1:]]
    return sorted(
        (t for t in tasks if t.key not in runs), key=lambda t: t.cost, reverse=True
    )


def run(configs: list[str], widths: list[int], jobs: int, cache: Path) -> float:
    """Trains the missing runs, saving each as it finishes; returns seconds."""
    return train_missing(
        lambda: needed(load(cache), configs, widths), train_one, jobs, cache
    )


class Keyed(Protocol):
    @property
    def key(self) -> str: ...


K = TypeVar("K", bound=Keyed)


def train_missing(
    find: Callable[[], list[K]],
    train_fn: Callable[[K], dict[str, float]],
    jobs: int,
    cache: Path,
) -> float:
    """Trains what ``find()`` says is missing with ``train_fn`` (a module-level
    function, for the spawned processes), saving each run to ``cache`` as it
    finishes, until nothing is missing; returns seconds."""
    start = time.perf_counter()
    context = multiprocessing.get_context("spawn")
    while tasks := find():
        print(f"{len(tasks)} runs to train", flush=True)
        with context.Pool(min(jobs, len(tasks))) as pool:
            for task, result in zip(
                tasks, pool.imap(train_fn, tasks), strict=True
            ):  # imap, in order: each result saved as soon as its turn comes
                runs = load(cache)
                runs[task.key] = result
                save(runs, cache)
                elapsed = time.perf_counter() - start
                print(
                    f"[{elapsed:6.0f} s] {task.key}: {result['loss']:.3f} "
                    f"({result['seconds']:.0f} s)",
                    flush=True,
                )
    return time.perf_counter() - start


# -- the page ------------------------------------------------------------------


@dataclass(frozen=True)
class Summary:
    losses: list[float]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.losses)

    @property
    def spread(self) -> float:
        """Largest minus smallest loss over the seeds."""
        return max(self.losses) - min(self.losses)

    @property
    def std(self) -> float:
        return statistics.stdev(self.losses) if len(self.losses) > 1 else 0.0

    def text(self) -> str:
        if len(self.losses) < len(SEEDS):
            return f"{self.mean:.3f} ({len(self.losses)} seed(s))"
        low, high = min(self.losses), max(self.losses)
        return f"{self.mean:.3f} ± {self.std:.3f} ({low:.3f}–{high:.3f})"


def seeds(runs: Runs, config: str, side: str, width: int) -> Summary | None:
    if side == "u-μP":
        log2_lr = math.log2(uu.RECOMMENDED.lr)
    else:
        best = sp_best(runs, config, width)
        if best is None:
            return None
        log2_lr = best
    found = [loss(runs, Task(config, side, width, log2_lr, s)) for s in SEEDS]
    values = [v for v in found if v is not None]
    return Summary(values) if values else None


def verdicts(runs: Runs, config: str) -> tuple[str, str]:
    """Target (a), u-μP gains with width, and (b), no worse than SP: each
    'met', 'not met' or 'not measured yet', with the numbers."""
    first, last = seeds(runs, config, "u-μP", WIDTHS[0]), None
    last = seeds(runs, config, "u-μP", WIDTHS[-1])
    if first is None or last is None:
        gain = "not measured yet (width 512 has not run)"
    elif len(last.losses) < len(SEEDS):
        gain = (
            f"not measured yet; so far width 512 {last.text()} against width 64 "
            f"{first.mean:.3f}"
        )
    else:
        margin = max(first.spread, last.spread)
        drop = first.mean - last.mean
        ok = drop > margin
        gain = (
            f"{'met' if ok else 'NOT met'}: width 512 {last.mean:.3f}, width 64 "
            f"{first.mean:.3f}, a drop of {drop:.3f} against a seed spread of "
            f"{margin:.3f}"
        )
    rows, complete = [], True
    for width in WIDTHS:
        umup, sp = seeds(runs, config, "u-μP", width), seeds(runs, config, "SP", width)
        if umup is None or sp is None or min(len(umup.losses), len(sp.losses)) < 3:
            complete = False
            continue
        rows.append((width, umup.mean - sp.mean))
    worst = max((d for _, d in rows), default=math.nan)
    if not rows:
        versus = "not measured yet"
    else:
        ok = worst <= 0
        measured = ", ".join(f"{w}: {d:+.3f}" for w, d in rows)
        versus = (
            f"{'met' if ok else 'NOT met'} at the widths measured (u-μP − SP by "
            f"width, {measured})"
            + ("" if complete else "; other widths not measured yet")
        )
    done = {w for w, _ in rows}
    early = [e for w in WIDTHS if w not in done and (e := _sp_ahead(runs, config, w))]
    if early:
        versus += "; early sign against it: " + "; ".join(early)
    return gain, versus


def _sp_ahead(runs: Runs, config: str, width: int) -> str:
    """Where a width is not finished: any SP run already better than u-μP at
    the recommended values on the same seed (SP's tuned mean can only gain from
    the rest of its sweep; other seeds may still reverse it)."""
    lr = math.log2(uu.RECOMMENDED.lr)
    swept = sp_sweep(runs, config, width)  # seed 0's lrs: every lr any SP seed runs
    for seed in SEEDS:
        umup = loss(runs, Task(config, "u-μP", width, lr, seed))
        if umup is None:
            continue
        sp = {
            x: v
            for x in swept
            if (v := loss(runs, Task(config, "SP", width, x, seed))) is not None
        }
        if sp and min(sp.values()) < umup:
            x = min(sp, key=lambda k: sp[k])
            return (
                f"at width {width}, seed {seed}, SP at 2^{x:g} ({sp[x]:.3f}) is "
                f"already below u-μP ({umup:.3f})"
            )
    return ""


def table(runs: Runs, config: str) -> str:
    body = []
    for width in WIDTHS:
        umup = seeds(runs, config, "u-μP", width)
        sp = seeds(runs, config, "SP", width)
        grid = sp_sweep(runs, config, width)
        swept = ", ".join(
            f"2^{x:g}: {v:.3f}" for x, v in sorted(grid.items()) if v is not None
        )
        best = sp_best(runs, config, width)
        diff = (
            f"{umup.mean - sp.mean:+.3f}"
            if umup is not None and sp is not None
            else "—"
        )
        body.append(
            (
                width,
                umup.text() if umup else "not run",
                f"{sp.text()} at 2^{best:g}" if sp and best is not None else "not run",
                diff,
                swept or "not run",
            )
        )
    return markdown_table(
        (
            "width",
            "u-μP, recommended",
            "SP at its best lr",
            "u-μP − SP",
            "SP sweep, seed 0",
        ),
        body,
    )


def lr_check(runs: Runs, config: str) -> str:
    """u-μP at the recommended lr and at every other lr stored (always one step
    either side), at width 64 and at every width where a run off the recommended
    lr is stored. Each lr is compared with the recommended one on the seeds both
    have: its cell is its mean over those seeds and, in brackets, that minus the
    recommended lr's mean over the same seeds (the seeds named when they are not
    all of the recommended lr's); a note says by how much the best beats it."""
    lr = math.log2(uu.RECOMMENDED.lr)

    def by_seed(width: int, x: float) -> dict[int, float]:
        return {
            s: v
            for s in SEEDS
            if (v := loss(runs, Task(config, "u-μP", width, x, s))) is not None
        }

    stored = {
        x
        for x in range(int(lr) - 4, int(lr) + 5)
        for width in WIDTHS
        if x != lr and by_seed(width, x)
    }
    steps = sorted(stored | {lr - 1, lr, lr + 1})
    rows, notes = [], []
    for width in WIDTHS:
        found = {x: by_seed(width, x) for x in steps}
        others = [x for x in steps if x != lr and found[x]]
        if width != WIDTHS[0] and not others:
            continue
        own = found[lr]
        cells, gains = [], {}
        for x in steps:
            shared = sorted(set(found[x]) & set(own)) if x != lr else sorted(own)
            if not shared:
                cells.append("not run")
                continue
            mean = statistics.fmean(found[x][s] for s in shared)
            if x == lr:
                cells.append(f"{mean:.3f}")
                continue
            gain = statistics.fmean(own[s] for s in shared) - mean
            gains[x] = (gain, shared)
            named = "" if shared == sorted(own) else f", {_seeds(shared)}"
            cells.append(f"{mean:.3f} ({-gain:+.3f}{named})")
        rows.append(
            (
                f"width {width} ({_seeds(sorted(own))})" if own else f"width {width}",
                *cells,
            )
        )
        best = max(gains, key=lambda x: gains[x][0], default=None)
        if best is not None and gains[best][0] > 0:
            edge = not found.get(best + (1 if best > lr else -1))
            notes.append(
                f"At width {width} lr 2^{best:g} beats the recommended 2^{lr:g} by "
                f"{gains[best][0]:.3f} ({_seeds(gains[best][1])}"
                + (
                    "; nothing was run past it, so the optimum may lie further"
                    if edge
                    else ""
                )
                + ")."
            )
    table = markdown_table(
        ("u-μP, recommended multipliers", *(f"lr 2^{x:g}" for x in steps)), rows
    )
    return table + "".join(f"\n\n{n}" for n in notes)


def _seeds(seeds: list[int]) -> str:
    return ("seed " if len(seeds) == 1 else "seeds ") + ", ".join(map(str, seeds))


def plot(runs: Runs, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(CONFIGS), figsize=(5 * len(CONFIGS), 4.2))
    unfinished_label = "hollow: unfinished (fewer seeds; SP: its sweep's best so far)"
    for ax, (name, shape) in zip(axes, CONFIGS.items(), strict=True):
        for side, colour in (("u-μP", "tab:blue"), ("SP", "tab:orange")):
            xs, means, lows, highs = [], [], [], []
            unfinished: list[tuple[int, float]] = []
            for width in WIDTHS:
                summary = seeds(runs, name, side, width)
                if summary is None:
                    if side == "SP":  # its seed-0 sweep's best so far, if any
                        swept = [
                            v
                            for v in sp_sweep(runs, name, width).values()
                            if v is not None
                        ]
                        if swept:
                            unfinished.append((width, min(swept)))
                    continue
                if len(summary.losses) < len(SEEDS):
                    unfinished.append((width, summary.mean))
                xs.append(width)
                means.append(summary.mean)
                lows.append(summary.mean - min(summary.losses))
                highs.append(max(summary.losses) - summary.mean)
                ax.plot(
                    [width] * len(summary.losses),
                    summary.losses,
                    ".",
                    color=colour,
                    alpha=0.5,
                )
            label = (
                f"u-μP, recommended (lr {uu.RECOMMENDED.lr:g})"
                if side == "u-μP"
                else "SP, lr tuned per width"
            )
            ax.errorbar(
                xs,
                means,
                yerr=[lows, highs],
                fmt="o-",
                color=colour,
                capsize=3,
                label=label,
            )
            if unfinished:
                ax.plot(
                    *zip(*unfinished, strict=True),
                    "o",
                    color=colour,
                    markerfacecolor="white",
                    markersize=9,
                    zorder=3,
                    label=unfinished_label,
                )
                unfinished_label = "_"  # one legend entry for the figure
        ax.set_xscale("log", base=2)
        ax.set_xlim(WIDTHS[0] / 1.3, WIDTHS[-1] * 1.3)
        ax.set_xticks(list(WIDTHS), [str(w) for w in WIDTHS])
        ax.minorticks_off()
        if not any(line.get_xdata().size for line in ax.lines):
            ax.text(0.5, 0.5, "not run yet", transform=ax.transAxes, ha="center")
        ax.grid(alpha=0.3)
        ax.set_title(
            f"{name}: {shape.layers} layers, {shape.batch_size}×{shape.seq_len} "
            f"tokens, {shape.steps} steps",
            fontsize=10,
        )
        ax.set_xlabel("width")
    axes[0].set_ylabel("validation loss (mean of seeds; bars: min–max)")
    entries: dict[str, Any] = {}  # one entry per label, from whichever panel
    for ax in axes:
        for handle, text in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(text, handle)
    fig.legend(
        list(entries.values()), list(entries), fontsize=8, loc="lower center", ncol=3
    )
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def remaining(runs: Runs) -> tuple[int, float]:
    """Runs still to train for the whole page, and an estimate of their
    core-minutes (from the finished runs' seconds per unit of ``Task.cost``).
    SP's seeds at a width whose sweep is unfinished are counted; a sweep's
    further widening cannot be known in advance and is not."""
    tasks = needed(runs, CONFIGS, WIDTHS)
    extra = [
        Task(c, "SP", w, SP_GUESS[w], s)
        for c in CONFIGS
        for w in WIDTHS
        if sp_best(runs, c, w) is None
        for s in SEEDS[1:]
    ]
    finished = [
        (runs[t.key]["seconds"], t.cost)
        for c in CONFIGS
        for t in _all_tasks(runs, c)
        if t.key in runs
    ]
    per_cost = sum(s for s, _ in finished) / max(1.0, sum(c for _, c in finished))
    todo = tasks + extra
    return len(todo), sum(t.cost for t in todo) * per_cost / 60


def _all_tasks(runs: Runs, config: str) -> list[Task]:
    """Every task of ``config`` the stored runs make known, finished or not."""
    lr = math.log2(uu.RECOMMENDED.lr)
    tasks = []
    for width in WIDTHS:
        tasks += [Task(config, "u-μP", width, lr, s) for s in SEEDS]
        tasks += [Task(config, "u-μP", width, lr + d, 0) for d in (-1, 1)]
        tasks += [
            Task(config, "SP", width, x, 0) for x in sp_sweep(runs, config, width)
        ]
        best = sp_best(runs, config, width)
        if best is not None:
            tasks += [Task(config, "SP", width, best, s) for s in SEEDS[1:]]
    return tasks


def report(runs: Runs, out: Path, seconds: float | None) -> None:
    plot(runs, out / "umup_defaults.png")
    core_minutes = sum(r["seconds"] for r in runs.values()) / 60
    missing, missing_minutes = remaining(runs)
    sections = []
    for name, shape in CONFIGS.items():
        gain, versus = verdicts(runs, name)
        sections.append(
            f"## {name}: {shape.layers} layers, sequence {shape.seq_len}, batch "
            f"{shape.batch_size}, {shape.steps} steps\n\n"
            f"- (a) u-μP better at width 512 than at 64: {gain}.\n"
            f"- (b) u-μP no worse than SP at every width: {versus}.\n\n"
            f"{table(runs, name)}\n\nIs the recommended lr near u-μP's optimum at "
            f"this shape?\n\n{lr_check(runs, name)}\n"
        )
    r = uu.RECOMMENDED
    timing = (
        f" This invocation: {seconds / 60:.1f} min on {os.cpu_count()} CPU cores."
        if seconds
        else ""
    )
    text = f"""# u-μP out of the box

`python experiments/umup_defaults.py` (see its docstring) trains
`uu.TransformerDecoder` at the recommended values, `unit_scaling.RECOMMENDED`
(lr 2^{math.log2(r.lr):g}, `residual_mult` 2^{math.log2(r.residual_mult):g},
`loss_mult` 2^{math.log2(r.loss_mult):g}, every other multiplier 1), beside SP
(`StandardTransformerDecoder`, GPT-2 init) with its learning rate tuned at every
width, in three configurations at widths {", ".join(map(str, WIDTHS))}; 3 seeds
for each side at each width. The values were chosen on configuration A at width
64 ([the sequential search](umup_search_sequential.md)); B and C were not used to
choose them.

![u-μP at the recommended values against SP tuned per width](umup_defaults.png)

Validation loss: mean ± standard deviation (min–max) over the seeds.

**Compute.** Stored runs: {len(runs)}, {core_minutes:.0f} core-minutes of
training (one CPU thread a run; many ran beside other work on a 2-core machine,
so these are upper bounds).{timing} Still to run for the whole page: {missing}
runs, about {missing_minutes / 60:.1f} core-hours at the same rate (more if an
SP sweep has to widen). The page is written from the stored runs
(`umup_defaults_runs.json`); `python experiments/umup_defaults.py` trains the
missing ones and rewrites it.

## Why u-μP at every multiplier 1 did not gain from width

From [the update coordinate check](coord_check.md#updates) and [why u-μP did not
gain from width](umup_width.md) (one seed each):

- Under u-μP every hidden layer's step moves its output by the same amount at
  every width, as μP asks; the embedding's step shrinks like width^-½ (u-μP's
  Adam rule gives the table lr/√fan_in, and an embedding's fan_in is the width).
  Making it constant in width recovers part of the gain at multipliers 1 (width
  512 − width 64: −0.002 becomes −0.047), none at the recommended values.
- `loss_mult` is what brings the gain: alone it makes width 512 0.117 better than
  width 64, `residual_mult` alone 0.018, attention's temperature (`mhsa_mult`
  2^-2) none. `readout_mult` 2^2 gives the same losses as `loss_mult` 2^2 to the
  third decimal, so what matters is the scale of the logits, μP's output
  multiplier on top of u-μP's 1/fan_in readout. The models trained with it at 1
  are not merely under-confident (rescaling their logits afterwards does not
  help): it acts on training. Why the readout's scale decides whether width pays
  off at this budget is not established.
- A `unit_scale`d GPT-2 ties its readout to the embedding table, which took the
  weight rule's lr/√width in both uses. Untied, it gains from width (−0.242 from
  64 to 512 at lr 2^-1, with its `Conv1D` weights tagged with their fan-in);
  tied, with the table now tagged `output`, it is 0.16–0.22 better at every width
  but nearly flat (−0.044 at each width's best lr, with the fan-in tag). Untie it
  for u-μP.

{chr(10).join(sections)}
## What moves u-μP's best learning rate

Configuration C's optimum lies above the recommended lr where A's and B's do not
(the lr checks above). [What moves u-μP's best learning rate](umup_depth.md)
sweeps the lr on shapes between A and C to find out which of C's differences
moves it.
"""
    (out / "umup_defaults.md").write_text(reflow(text))


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS))
    parser.add_argument("--widths", nargs="+", type=int, default=list(WIDTHS))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--cache", type=Path, default=CACHE)
    parser.add_argument("--out", type=Path, default=DOCS)
    parser.add_argument("--report", action="store_true", help="only write the page")
    args = parser.parse_args()
    unknown = set(args.configs) - set(CONFIGS)
    if unknown or not set(args.widths) <= set(WIDTHS):
        sys.exit(f"configs must be among {list(CONFIGS)}, widths among {WIDTHS}")
    seconds = (
        None if args.report else run(args.configs, args.widths, args.jobs, args.cache)
    )
    report(load(args.cache), args.out, seconds)


if __name__ == "__main__":
    main()
