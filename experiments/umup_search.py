"""u-μP tuned on a width-64 proxy, against SP tuned at every width.

With every multiplier at its default of 1, u-μP trails SP at width 512
(``lr_transfer.md``). The u-μP paper's answer is its cheap independent search
on a small proxy, whose result transfers unchanged to large models. This script
runs it (:mod:`unit_scaling.app.sweep`) and checks the transfer:

(a) search at width 64: the learning rate over a ×2 grid with every multiplier
    at 1, then each of the five multipliers of
    :data:`~unit_scaling.app.sweep.UMUP_MULTIPLIERS` over a ×2 grid at that
    learning rate, combined, then the learning rate again;
(b) transfer: the found multipliers at widths 128, 256 and 512, the learning
    rate swept at each width (to see where its optimum lands);
(c) SP (``StandardTransformerDecoder``, GPT-2 init, ``torch.optim.AdamW``) with
    its learning rate swept at every width: the strongest fair baseline;
(d) ``--seeds`` seeds at each side's chosen point at every width: u-μP at the
    point found at width 64, unchanged; SP at its best learning rate of that
    width; and, for reference, u-μP with every multiplier at 1 at the learning
    rate of the search's first stage.

Model, data, steps, schedule and validation set are ``lr_transfer.py``'s, so
the SP runs repeat its numbers. The target: at width 512, the mean validation
loss of the tuned-at-64 u-μP is no worse than SP's, and its learning-rate
optimum stays within one grid step of width 64's at every width.

Every run is stored as it finishes in ``--runs`` (default
``experiments/.runs/umup_search/``, one folder per model); run again, the script
trains only the runs that are missing. Writes ``umup_search.md``,
``umup_search.png`` and ``umup_search_proxy.png`` (the search itself) to
``--out`` (default ``docs/results/``)::

    .venv/bin/python experiments/umup_search.py --jobs 2
    .venv/bin/python experiments/umup_search.py --quick --out /tmp/umup_quick
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from _common import (
    lr_table,
    markdown_table,
    model_factory,
    optimizer_factory,
    optimum,
    plot_lr_curves,
    reflow,
    run_parser,
    timing_note,
)

from unit_scaling.app.config import parse_config, setting
from unit_scaling.app.sweep import (
    UMUP_MULTIPLIERS,
    Point,
    Run,
    SearchResult,
    Sweep,
    SweepConfig,
    train_all,
)

RUNS = Path(__file__).resolve().parent / ".runs" / "umup_search"
SIDES = ("SP", "u-μP tuned on the proxy", "u-μP, multipliers at 1")
COLOURS = dict(zip(SIDES, ("tab:blue", "tab:red", "tab:grey"), strict=True))
QUICK = {
    "search_width": 16,
    "widths": (16, 32),
    "layers": 1,
    "batch_size": 4,
    "seq_len": 16,
    "steps": 3,
    "warmup": 1,
    "val_batches": 1,
    "eval_every": 0,
    "umup_lrs": (-1, 0, 1),
    "sp_lrs": (-7, -6, -5),
    "multiplier_grid": (-1, 0, 1),
    "multipliers": ("mhsa_mult", "loss_mult"),
    "seeds": 2,
    "cap": 6.0,
}


@dataclass(frozen=True)
class Config:
    search_width: int = setting(64, "width of the proxy the search runs on")
    widths: tuple[int, ...] = setting((64, 128, 256, 512), "widths to compare at")
    layers: int = 2
    batch_size: int = 16
    seq_len: int = 64
    steps: int = 200
    warmup: int = 20
    val_batches: int = 8
    eval_every: int = setting(50, "steps between validations of each run")
    umup_lrs: tuple[int, ...] = setting(tuple(range(-3, 4)), "log2 of u-μP's lrs")
    sp_lrs: tuple[int, ...] = setting(tuple(range(-12, -5)), "log2 of SP's lrs")
    multiplier_grid: tuple[int, ...] = setting(
        tuple(range(-3, 4)), "log2 of each multiplier's values in the search"
    )
    multipliers: tuple[str, ...] = setting(UMUP_MULTIPLIERS, "multipliers to search")
    seeds: int = setting(3, "seeds at each side's chosen point")
    strategy: str = setting(
        "independent",
        "the search: independent (the u-μP paper's) or sequential (each "
        "multiplier at the values chosen before it); a sequential run writes "
        "umup_search_sequential.*",
    )
    cap: float = setting(3.5, "plot losses above this (and diverged runs) here")
    runs: Path | None = setting(
        None,
        "folder of the stored runs (default experiments/.runs/umup_search, or "
        "<out>/umup_search_runs with --quick)",
    )
    quick: bool = setting(False, "a smoke run of seconds: " + str(QUICK))

    def __post_init__(self) -> None:
        if self.quick:
            for name, value in QUICK.items():
                object.__setattr__(self, name, value)
        widths = sorted({*self.widths, self.search_width})
        object.__setattr__(self, "widths", tuple(widths))
        if self.seeds < 1:
            raise ValueError(f"seeds must be a positive integer, got {self.seeds}")

    def sweep_config(self, parametrisation: str) -> SweepConfig:
        """What every run trains; SP has no multipliers to search."""
        umup = parametrisation == "u-μP"
        return SweepConfig(
            steps=self.steps,
            batch_size=self.batch_size,
            seq_len=self.seq_len,
            warmup=min(self.warmup, self.steps),
            eval_every=self.eval_every,
            val_batches=self.val_batches,
            log2_lrs=self.umup_lrs if umup else self.sp_lrs,
            log2_multipliers=self.multiplier_grid,
            multipliers=self.multipliers if umup else (),
            strategy=self.strategy,
        )

    @property
    def stem(self) -> str:
        """The file name of the page and plots, without extension."""
        suffix = "" if self.strategy == "independent" else f"_{self.strategy}"
        return f"umup_search{suffix}"


@dataclass(frozen=True)
class Results:
    config: Config
    search: SearchResult
    lr_sweeps: dict[str, dict[int, dict[float, Run]]]  # side -> width -> log2 lr
    seeds: dict[str, dict[int, list[Run]]]  # side -> width -> one run per seed
    points: dict[str, dict[int, Point]]  # side -> width -> the point (seed 0)
    seconds: float

    def losses(self, side: str) -> dict[int, dict[float, float]]:
        return {
            w: {x: run.loss for x, run in sweep.items()}
            for w, sweep in self.lr_sweeps[side].items()
        }

    def seed_losses(self, side: str, width: int) -> list[float]:
        return [run.loss for run in self.seeds[side][width]]

    def lr_moves(self) -> dict[int, float]:
        """Grid steps from the transferred lr to each width's own optimum."""
        found = self.search.best.point.log2_lr
        return {
            w: optimum(losses)[0] - found for w, losses in self.losses(SIDES[1]).items()
        }


def _sweeps(
    config: Config, runs: Path, jobs: int
) -> tuple[dict[int, Sweep], dict[int, Sweep]]:
    """The u-μP and SP sweeps of every width, each stored in its own folder."""

    def sweep(parametrisation: str, width: int) -> Sweep:
        return Sweep(
            model_factory(parametrisation, width, config.layers),
            runs / f"{'umup' if parametrisation == 'u-μP' else 'sp'}-{width}",
            config=config.sweep_config(parametrisation),
            optimizer=optimizer_factory(parametrisation),
            jobs=jobs,
        )

    return (
        {w: sweep("u-μP", w) for w in config.widths},
        {w: sweep("SP", w) for w in config.widths},
    )


Request = tuple[str, str, int, Point]  # (what: "lr" or "seed", side, width, point)


def _train(
    requests: list[Request], sweeps: dict[str, dict[int, Sweep]], jobs: int
) -> list[Run]:
    """The run of each request, the widest trained first (the longest runs)."""
    order = sorted(range(len(requests)), key=lambda i: -requests[i][2])
    runs = train_all(
        [(sweeps[requests[i][1]][requests[i][2]], requests[i][3]) for i in order], jobs
    )
    by_index = dict(zip(order, runs, strict=True))
    return [by_index[i] for i in range(len(requests))]


def run_experiment(config: Config, runs: Path, jobs: int) -> Results:
    start = time.perf_counter()
    umup, sp = _sweeps(config, runs, jobs)
    sweeps = {SIDES[0]: sp, SIDES[1]: umup, SIDES[2]: umup}
    print(f"(a) the search at width {config.search_width}", flush=True)
    found = umup[config.search_width].search()
    print(found.table(), flush=True)
    points = {
        SIDES[1]: dict.fromkeys(config.widths, found.best.point),
        SIDES[2]: dict.fromkeys(config.widths, Point(found.default.point.log2_lr)),
    }
    tuned = found.best.point.log2_multipliers
    requests: list[Request] = [
        ("lr", side, w, Point(x, multipliers))
        for side, grid, multipliers in (
            (SIDES[0], config.sp_lrs, ()),
            (SIDES[1], config.umup_lrs, tuned),
        )
        for w in config.widths
        for x in grid
    ]
    requests += _seeds(config, points)
    print("(b, c) lr sweeps at every width, and u-μP's seeds", flush=True)
    done = _train(requests, sweeps, jobs)
    lr_sweeps: dict[str, dict[int, dict[float, Run]]] = {s: {} for s in SIDES[:2]}
    seeds: dict[str, dict[int, list[Run]]] = {s: {} for s in SIDES}
    for (what, side, width, point), run in zip(requests, done, strict=True):
        if what == "lr":
            lr_sweeps[side].setdefault(width, {})[point.log2_lr] = run
        else:
            seeds[side].setdefault(width, []).append(run)
    points[SIDES[0]] = {
        w: Point(optimum({x: r.loss for x, r in sweep.items()})[0])
        for w, sweep in lr_sweeps[SIDES[0]].items()
    }
    print("(d) SP's seeds at its best lr of each width", flush=True)
    sp_requests = _seeds(config, {SIDES[0]: points[SIDES[0]]})
    for (_, side, width, _), run in zip(
        sp_requests, _train(sp_requests, sweeps, jobs), strict=True
    ):
        seeds[side].setdefault(width, []).append(run)
    seconds = time.perf_counter() - start
    return Results(config, found, lr_sweeps, seeds, points, seconds)


def _seeds(config: Config, points: dict[str, dict[int, Point]]) -> list[Request]:
    """A request per seed at each side's point of each width."""
    return [
        ("seed", side, w, Point(p.log2_lr, p.log2_multipliers, seed))
        for side, by_width in points.items()
        for w, p in by_width.items()
        for seed in range(config.seeds)
    ]


def _spread(losses: list[float]) -> str:
    """Mean ± standard deviation (min–max) of one side's seeds."""
    finite = [x for x in losses if math.isfinite(x)]
    if len(finite) < len(losses):
        return f"diverged ({len(losses) - len(finite)} of {len(losses)})"
    if len(losses) == 1:
        return f"{losses[0]:.3f}"
    return (
        f"{statistics.mean(losses):.3f} ± {statistics.stdev(losses):.3f} "
        f"({min(losses):.3f}–{max(losses):.3f})"
    )


def _mean(losses: list[float]) -> float:
    return statistics.mean(losses)  # inf if any seed diverged: the worst


def plot(results: Results, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    config = results.config
    fig, axes = plt.subplots(1, 3, figsize=(17, 5))
    found = results.search.best.point
    finite = [
        v
        for side in SIDES[:2]
        for row in results.losses(side).values()
        for v in row.values()
        if math.isfinite(v)
    ]
    moves = results.lr_moves()
    titles = (
        f"u-μP, multipliers found at width {config.search_width}\n"
        f"optimum within {max(map(abs, moves.values())):g} grid step(s) of the "
        f"found lr ($2^{{{found.log2_lr:g}}}$, dashed)",
        "SP (GPT-2 init, torch AdamW), lr swept at every width",
    )
    for ax, side, grid, title in zip(
        axes[:2], SIDES[1::-1], (config.umup_lrs, config.sp_lrs), titles, strict=True
    ):
        plot_lr_curves(ax, results.losses(side), config.cap)
        ax.set_title(title, fontsize=10)
        ax.set_xticks(list(grid), [f"$2^{{{x}}}$" for x in grid])
        ax.set_xlabel("learning rate")
        ax.set_ylim(min(finite) - 0.05, config.cap + 0.08)
        ax.grid(alpha=0.3)
    axes[0].axvline(found.log2_lr, color="k", ls="--", lw=1)
    axes[0].set_ylabel("validation loss (nats per byte)")
    axes[1].legend(
        title=f"★ optimum\n▲ loss above {config.cap:g}\n× diverged", fontsize=8
    )
    ax = axes[2]
    for side in SIDES:
        widths, means, low, high = [], [], [], []
        for width in config.widths:
            losses = results.seed_losses(side, width)
            if all(map(math.isfinite, losses)):
                widths.append(width)
                means.append(statistics.mean(losses))
                low.append(means[-1] - min(losses))
                high.append(max(losses) - means[-1])
        ax.errorbar(
            widths,
            means,
            yerr=[low, high],
            fmt="o-",
            color=COLOURS[side],
            capsize=4,
            label=side,
        )
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(config.widths), [str(w) for w in config.widths])
    ax.set_xlabel("width")
    ax.set_title(
        f"at each side's chosen point: mean of {config.seeds} seed(s), bars min–max",
        fontsize=10,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle(
        f"u-μP tuned on a width-{config.search_width} proxy vs SP tuned at every "
        f"width: {config.layers}-layer decoder, {config.steps} steps of "
        f"{config.batch_size}×{config.seq_len} tokens, validation loss"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _core_minutes(runs: set[Run]) -> float:
    return sum(run.seconds for run in runs) / 60


def report(results: Results, seconds: float, jobs: int) -> str:
    config = results.config
    search = results.search
    widest, proxy = config.widths[-1], config.search_width
    command = "python experiments/umup_search.py" + (
        "" if config.strategy == "independent" else f" --strategy {config.strategy}"
    )
    how, variant = "alone", ""
    if config.strategy == "sequential":
        how = "in turn, those before it at their chosen values,"
        variant = (
            " in its sequential variant (a coordinate descent: each multiplier "
            "swept with the ones before it at their chosen values, at the same "
            "cost; see also the [independent search](umup_search.md))"
        )
    umup = _mean(results.seed_losses(SIDES[1], widest))
    sp = _mean(results.seed_losses(SIDES[0], widest))
    untuned = _mean(results.seed_losses(SIDES[2], widest))
    moves = results.lr_moves()
    loss_met = umup <= sp
    lr_met = all(abs(m) <= 1 for m in moves.values())
    found = search.best.point
    found_text = (
        ", ".join(f"{name} = 2^{x:g}" for name, x in found.log2_multipliers)
        or "every multiplier at 1"
    )
    search_runs = {run for *_, run in search.stages()}
    all_runs = search_runs | {
        run
        for by_width in results.lr_sweeps.values()
        for sweep in by_width.values()
        for run in sweep.values()
    }
    all_runs |= {
        run
        for by_width in results.seeds.values()
        for runs in by_width.values()
        for run in runs
    }
    seed_rows = []
    for width in config.widths:
        cells = []
        for side in SIDES:
            point = results.points[side][width]
            cells.append(
                f"{_spread(results.seed_losses(side, width))} at lr 2^{point.log2_lr:g}"
            )
        difference = _mean(results.seed_losses(SIDES[1], width)) - _mean(
            results.seed_losses(SIDES[0], width)
        )
        seed_rows.append((width, *cells, f"{difference:+.3f}"))
    seed_table = markdown_table(("width", *SIDES, "tuned u-μP − SP"), seed_rows)
    move_text = ", ".join(f"{m:+g} at width {w}" for w, m in sorted(moves.items()))
    settings = "\n".join(f"- {k}: {v}" for k, v in asdict(config).items())
    misses = [
        *([] if loss_met else [f"u-μP's mean loss at width {widest} is above SP's"]),
        *([] if lr_met else ["the learning-rate optimum moves more than one step"]),
    ]
    verdict = "met" if not misses else f"not met ({'; '.join(misses)})"
    return reflow(f"""# u-μP tuned on a small proxy, against SP tuned at every width

With every multiplier at its default of 1, u-μP trails SP at width 512
([learning-rate transfer](lr_transfer.md)). The u-μP paper's answer is its cheap
independent search on a small proxy. `{command}` runs it{variant}
with `unit_scaling.app.sweep` (`unit-scaling sweep` on the command line) on a
width-{proxy} {config.layers}-layer byte-level decoder and carries the result,
unchanged, to widths {", ".join(map(str, config.widths))}:

- (a) **the search** at width {proxy}: the learning rate over a ×2 grid with
  every multiplier at 1; each of {", ".join(f"`{m}`" for m in config.multipliers)}
  {how} over 2^{config.multiplier_grid[0]}…2^{config.multiplier_grid[-1]} at
  that learning rate; the best value of each, combined; the learning rate again;
- (b) **transfer**: the found multipliers at every width, the learning rate
  swept at each to see where its optimum lands;
- (c) **SP** (`StandardTransformerDecoder`, GPT-2 init, `torch.optim.AdamW`) with
  its learning rate swept at every width: the strongest fair baseline;
- (d) **{config.seeds} seeds** at each side's chosen point at every width: u-μP
  at the point found at width {proxy}, unchanged; SP at its best learning rate
  of that width; and u-μP with every multiplier at 1 at the learning rate of the
  search's first stage, for reference.

Model, data, {config.steps} steps of {config.batch_size}×{config.seq_len} tokens,
schedule ({config.warmup} warmup steps, then cosine decay to 10%) and validation
set ({config.val_batches} batches) are those of `lr_transfer.py`. A seed sets
the weights and the order of the training batches.

**Target {verdict}**: at width {widest}, the mean validation loss of u-μP tuned
at width {proxy} is to be no worse than SP's ({config.seeds} seeds each), and the
tuned multipliers are to keep the learning-rate optimum within one grid step of
width {proxy}'s at every width. At width {widest}: tuned u-μP
{_spread(results.seed_losses(SIDES[1], widest))}, SP
{_spread(results.seed_losses(SIDES[0], widest))} (mean ± standard deviation,
min–max): u-μP is {"no worse than" if loss_met else "worse than"} SP by the
mean ({umup - sp:+.3f}); u-μP with every multiplier at 1 {untuned:.3f}. Measured
from the learning rate found at width {proxy}, the tuned u-μP's own optimum lies
{move_text} grid step(s) away ({"within" if lr_met else "not within"} one
step).

![u-μP tuned on a proxy against SP]({config.stem}.png)

## What the search found

At width {proxy}: {found_text}, learning rate 2^{found.log2_lr:g}; validation
loss {search.best.loss:.3f} against {search.default.loss:.3f} with every
multiplier at 1 (at its best learning rate, 2^{search.default.point.log2_lr:g}).
{len(search_runs)} runs, {_core_minutes(search_runs):.1f} core-minutes (one CPU
thread a run): {_core_minutes(search_runs) / max(1, jobs):.1f} min on {jobs}
core(s).

{search.table()}

![the search at width {proxy}]({config.stem}_proxy.png)

## Transfer: the learning rate at every width

Validation loss by width (rows) and learning rate (columns), optimum in bold;
*fitted* is the vertex of a parabola through the optimum and its neighbours.

### u-μP, multipliers found at width {proxy}

{lr_table(results.losses(SIDES[1]), config.umup_lrs)}

### SP

{lr_table(results.losses(SIDES[0]), config.sp_lrs)}

## Seeds at each side's chosen point

Validation loss, mean ± standard deviation (min–max) over {config.seeds}
seed(s).

{seed_table}

## Time

{len(all_runs)} runs, {_core_minutes(all_runs):.0f} core-minutes in all. This
invocation: {timing_note(seconds, jobs)}; runs an earlier invocation stored
(interrupted, or of the other search strategy: SP's runs and the shared points)
were read, not trained again.

## Settings

{settings}
""")


def main(argv: list[str] | None = None) -> Results:
    config, args = parse_config(Config, argv, parser=run_parser(__doc__.split("\n")[0]))
    runs = config.runs or (args.out / "umup_search_runs" if config.quick else RUNS)
    results = run_experiment(config, runs, args.jobs)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = config.stem
    plot(results, args.out / f"{stem}.png")
    results.search.plot(args.out / f"{stem}_proxy.png")
    text = report(results, results.seconds, args.jobs)
    (args.out / f"{stem}.md").write_text(text)
    print(text)
    print(f"wrote {stem}.md, {stem}.png, {stem}_proxy.png to {args.out}")
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
