"""The result of u-μP's independent search: its runs by stage, the choice,
tables, the summary, ``best.json`` and the plot (exported by
:mod:`unit_scaling.app.sweep`)."""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ._sweep_runs import Run, SweepConfig, best_value, finite_or_none, power, write_json


@dataclass(frozen=True)
class SearchResult:
    """The runs of :meth:`Sweep.search`, by stage, and the configuration chosen."""

    config: SweepConfig
    model: str
    optimizer: str
    lr_sweep: dict[float, Run]
    """Stage 1: every multiplier at 1, by log2 learning rate."""
    multiplier_sweeps: dict[str, dict[float, Run]]
    """Stage 2: each multiplier alone at the best learning rate, by log2 value."""
    combined: Run
    """Stage 3: each multiplier's best value, at the best learning rate."""
    lr_resweep: dict[float, Run]
    """Stage 4 (empty without ``resweep_lr``): the lr grid at the combined point."""

    @property
    def default(self) -> Run:
        """The best run with every multiplier at 1."""
        return self.lr_sweep[best_value(self.lr_sweep)]

    @property
    def best(self) -> Run:
        """The chosen run: the combined multipliers at the best learning rate
        of the last learning-rate sweep."""
        if self.lr_resweep:
            return self.lr_resweep[best_value(self.lr_resweep)]
        return self.combined

    def best_config(self) -> dict[str, Any]:
        """The chosen configuration, as written to ``best.json``: ``lr`` and
        ``multipliers`` (every searched one, as values) are what to give the
        large model and its optimizer."""
        log2 = {name: 0.0 for name in self.config.multipliers}
        log2.update(self.best.point.log2_multipliers)
        return {
            "lr": self.best.point.lr,
            "multipliers": {name: 2.0**x for name, x in log2.items()},
            "log2_lr": self.best.point.log2_lr,
            "log2_multipliers": log2,
            "validation_loss": finite_or_none([self.best.loss])[0],
            "default": {
                "lr": self.default.point.lr,
                "validation_loss": finite_or_none([self.default.loss])[0],
            },
            "model": self.model,
            "optimizer": self.optimizer,
            "settings": asdict(self.config),
        }

    def stages(self) -> list[tuple[str, str, float, Run]]:
        """Every run as ``(stage, hyperparameter, log2 value, run)``, in order."""
        rows = [("lr", "lr", x, r) for x, r in self.lr_sweep.items()]
        rows += [
            ("multiplier", name, x, r)
            for name, sweep in self.multiplier_sweeps.items()
            for x, r in sweep.items()
        ]
        rows.append(("combined", "", math.nan, self.combined))
        rows += [("lr at combined", "lr", x, r) for x, r in self.lr_resweep.items()]
        return rows

    def table(self) -> str:
        """The losses of every stage as markdown tables, chosen values in bold."""

        def cells(sweep: Mapping[float, Run], grid: Sequence[float]) -> list[str]:
            chosen = best_value(sweep)
            return [
                "—"
                if x not in sweep
                else "diverged"
                if sweep[x].diverged
                else f"**{sweep[x].loss:.3f}**"
                if x == chosen
                else f"{sweep[x].loss:.3f}"
                for x in grid
            ]

        lrs = self.config.log2_lrs
        lr_rows = [("multipliers at 1", *cells(self.lr_sweep, lrs))]
        if self.lr_resweep:
            lr_rows.append(("combined multipliers", *cells(self.lr_resweep, lrs)))
        lr_table = markdown(["learning rate", *map(power, lrs)], lr_rows)
        values = self.config.log2_multipliers
        best_lr = power(best_value(self.lr_sweep))
        lines = ["Validation loss against the learning rate:", "", lr_table, ""]
        if self.multiplier_sweeps:
            rows = [(n, *cells(s, values)) for n, s in self.multiplier_sweeps.items()]
            how = (
                "Each multiplier alone"
                if self.config.strategy == "independent"
                else "Each multiplier in turn, those above it at their chosen values"
            )
            lines += [
                f"{how}, at lr {best_lr}:",
                "",
                markdown([f"multiplier (lr {best_lr})", *map(power, values)], rows),
                "",
            ]
        lines += [
            f"Combined, at lr {best_lr}: {self.combined.point.label}: "
            f"{self.combined.loss:.3f}.",
            f"Chosen: {self.best.point.label}: validation loss {self.best.loss:.3f} "
            f"(every multiplier at 1: {self.default.loss:.3f}, "
            f"at lr {power(self.default.point.log2_lr)}).",
        ]
        if self.best.loss > self.default.loss:
            lines.append(
                "The combined multipliers do worse than every multiplier at 1: "
                "here the multipliers interact, so the independent search's "
                "premise does not hold (try a longer budget, or fewer multipliers)."
            )
        edges = [
            name
            for name, sweep, grid in (
                ("the learning rate", self.lr_resweep or self.lr_sweep, lrs),
                *((n, s, values) for n, s in self.multiplier_sweeps.items()),
            )
            if best_value(sweep) in (grid[0], grid[-1]) and len(grid) > 1
        ]
        if edges:
            lines.append(
                f"At the edge of its grid: {', '.join(edges)}; the optimum may lie "
                "beyond it (widen the grid)."
            )
        return "\n".join(lines)

    def save(self, run_dir: str | os.PathLike[str]) -> list[Path]:
        """Write ``summary.csv`` (one row per run), ``best.json`` and
        ``sweep.png`` to ``run_dir``; return their paths."""
        folder = Path(run_dir)
        folder.mkdir(parents=True, exist_ok=True)
        summary = folder / "summary.csv"
        with summary.open("w", newline="") as file:
            writer = csv.writer(file)
            names = list(self.config.multipliers)
            writer.writerow(
                [
                    "stage",
                    "hyperparameter",
                    "log2_value",
                    "log2_lr",
                    *(f"log2_{n}" for n in names),
                    "seed",
                    "validation_loss",
                    "diverged",
                    "seconds",
                ]
            )
            for stage, name, x, run in self.stages():
                log2 = dict(run.point.log2_multipliers)
                writer.writerow(
                    [
                        stage,
                        name,
                        "" if math.isnan(x) else f"{x:g}",
                        f"{run.point.log2_lr:g}",
                        *(f"{log2.get(n, 0.0):g}" for n in names),
                        run.point.seed,
                        f"{run.loss:.6f}" if not run.diverged else "",
                        run.diverged,
                        f"{run.seconds:.2f}",
                    ]
                )
        best = folder / "best.json"
        write_json(best, self.best_config())
        figure = folder / "sweep.png"
        self.plot(figure)
        return [summary, best, figure]

    def plot(self, path: str | os.PathLike[str]) -> None:
        """Save a PNG of the validation loss against each hyperparameter: one
        panel per hyperparameter, the chosen value starred."""
        plt = _pyplot()
        panels = 1 + len(self.multiplier_sweeps)
        columns = min(3, panels)
        rows = math.ceil(panels / columns)
        fig, axes = plt.subplots(
            rows, columns, figsize=(4.4 * columns, 3.5 * rows), squeeze=False
        )
        flat = list(axes.flat)
        best = self.best
        ax = flat[0]
        _plot_sweep(ax, self.lr_sweep, "C0", "multipliers at 1")
        if self.lr_resweep:
            _plot_sweep(ax, self.lr_resweep, "C1", "combined multipliers")
        _mark(ax, best.point.log2_lr, best.loss)
        _finish(ax, "learning rate", self.config.log2_lrs, best.point.log2_lr)
        ax.set_xlabel("learning rate")
        ax.legend(fontsize=8)
        chosen = dict(self.best.point.log2_multipliers)
        at_lr = power(best_value(self.lr_sweep))
        for ax, (name, sweep) in zip(
            flat[1:], self.multiplier_sweeps.items(), strict=False
        ):
            alone = "alone" if self.config.strategy == "independent" else "in turn"
            _plot_sweep(ax, sweep, "C0", f"{alone}, lr {at_lr}")
            x = chosen.get(name, 0.0)
            ax.axhline(self.default.loss, color="grey", ls=":", lw=1, label="all at 1")
            if math.isfinite(best.loss):
                ax.axhline(best.loss, color="C1", ls="--", lw=1, label="chosen")
            if x in sweep:
                _mark(ax, x, sweep[x].loss)
            _finish(ax, name, self.config.log2_multipliers, x)
            ax.set_xlabel(name)
            ax.legend(fontsize=8)
        for ax in flat[panels:]:
            ax.set_visible(False)
        for ax in axes[:, 0]:
            ax.set_ylabel("validation loss")
        c = self.config
        fig.suptitle(
            f"{c.strategy.capitalize()} search: {self.model}\n{c.steps} steps of "
            f"{c.batch_size}×{c.seq_len} tokens; chosen ({best.point.label}) "
            f"{best.loss:.3f}, all multipliers at 1 {self.default.loss:.3f}   "
            "★ chosen  × diverged",
            fontsize=9,
        )
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as error:
        raise ImportError(
            "the sweep plots with matplotlib, which is not installed: "
            'pip install "torch-unit-scaling[app]"'
        ) from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plot_sweep(ax: Any, sweep: Mapping[float, Run], colour: str, label: str) -> None:
    finite = [x for x in sweep if not sweep[x].diverged]
    ax.plot(
        finite, [sweep[x].loss for x in finite], "o-", color=colour, ms=4, label=label
    )
    diverged = [x for x in sweep if sweep[x].diverged]
    if diverged:  # at the top of the finite losses: the worst
        top = max((sweep[x].loss for x in finite), default=0.0)
        ax.plot(diverged, [top] * len(diverged), "x", color=colour, ms=9, mew=2)


def _mark(ax: Any, x: float, loss: float) -> None:
    if math.isfinite(loss):
        ax.plot(x, loss, "*", color="gold", ms=16, mec="k", zorder=5)


def _finish(ax: Any, name: str, grid: Sequence[float], chosen: float) -> None:
    ax.set_title(f"{name}: chosen {power(chosen)}", fontsize=10)
    ax.set_xticks(list(grid), [f"$2^{{{x:g}}}$" for x in grid])
    ax.grid(alpha=0.3)


def markdown(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |"]
    lines.append("| --- |" + " ---: |" * (len(header) - 1))
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
