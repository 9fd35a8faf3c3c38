"""u-μP's independent hyperparameter search, on a small proxy model.

u-μP's multipliers interact little with each other and with the learning rate,
so the u-μP paper (Blake et al., 2024) tunes them one at a time, cheaply:

1. the learning rate over a ×2 grid, every multiplier at its default of 1;
2. each multiplier alone over a ×2 grid around 1, at that best learning rate;
3. the best value of each multiplier, all together ("combined");
4. optionally the learning rate again, over its grid, at the combined multipliers.

Where the multipliers do interact (a short budget, a small proxy), the best
values found alone can do worse together than some of them alone. The
``sequential`` strategy (``SweepConfig(strategy="sequential")``) is a coordinate
descent at the same cost: each multiplier's grid is swept with the multipliers
before it at their chosen values, so the chosen point is never worse than any
point the search trained at the best learning rate.

The chosen configuration transfers unchanged to wider models.
:class:`Sweep` runs it for any model whose multipliers are keyword arguments of
its factory (``factory(**multipliers)``, as :class:`~unit_scaling.TransformerDecoder`
takes them) and that has a ``loss(batch)`` method, on the built-in corpus
(:class:`~unit_scaling.data.Corpus`); ``unit-scaling sweep`` runs it for
:class:`~unit_scaling.TransformerDecoder`.

**Stored runs.** Every finished run is a JSON file in ``run_dir/runs/`` (its
loss curves, its time, and the settings it ran with), named by its point and a
hash of everything that determines it: the model factory's and optimizer's
qualified names (with a ``functools.partial``'s arguments), the corpus, the
training settings, the seed, the learning rate and the multipliers. The process
that trained a run writes its file atomically (a temporary file, then
``os.replace``), so an interrupted search loses only the runs in flight; run
again, it reads the files it finds and trains only the missing runs. A point
that two stages share (the defaults at the best learning rate) is trained
once, and so is a run that another search or sweep in the same folder asked for.

Why files and not Optuna's ``JournalStorage`` with a ``GridSampler``: the
search is a chain of small fixed grids, each placed by the previous one's
optimum, so a sampler decides nothing; a file named by its run's settings is
the cache, the record and the resume logic at once, needs no dependency
(Optuna brings SQLAlchemy and Alembic), and leaves nothing behind when a
process is killed (an interrupted journal trial stays ``RUNNING`` until it is
failed by hand). The process pool, the stages, the curves and the plots would
have been ours to write either way.

This module holds the search and the command; ``_sweep_runs.py`` what a run
is, how it trains and is stored, and the process pool; ``_sweep_results.py``
the result's tables, summary and plot.

Example::

    >>> from functools import partial
    >>> config = SweepConfig(steps=2, batch_size=2, seq_len=8, warmup=1,
    ...                      val_batches=1, log2_lrs=(-1, 0),
    ...                      log2_multipliers=(-1, 0, 1), multipliers=("mlp_mult",))
    >>> factory = partial(uu.TransformerDecoder, hidden_size=16, vocab_size=256,
    ...                   layers=1, heads=1)
    >>> result = search(factory, "sweep", config=config, progress=False)
    >>> sorted(result.best_config()["multipliers"])
    ['mlp_mult']
    >>> sorted(p.name for p in Path("sweep").iterdir())
    ['best.json', 'runs', 'summary.csv', 'sweep.png']
"""

from __future__ import annotations

import argparse
import functools
import os
import pickle
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .. import optim
from ..data import VOCAB_SIZE, Corpus
from ..modules import TransformerDecoder
from ._sweep_results import SearchResult
from ._sweep_runs import (
    UMUP_MULTIPLIERS,
    Job,
    Point,
    Run,
    SweepConfig,
    best_value,
    check_grid,
    check_keywords,
    describe,
    is_int,
    train_jobs,
    validation_set,
    warmup_cosine,
)
from .config import add_options, config_from_options, setting

__all__ = [
    "UMUP_MULTIPLIERS",
    "CommandOptions",
    "Point",
    "Run",
    "SearchResult",
    "Sweep",
    "SweepConfig",
    "add_arguments",
    "run_command",
    "search",
    "train_all",
    "validation_set",
    "warmup_cosine",
]


class Sweep:
    """Runs of one model, optimizer, corpus and :class:`SweepConfig`, stored in
    ``run_dir`` (see the module docstring): :meth:`search` runs u-μP's
    independent search, :meth:`lr_sweep` a learning-rate sweep, :meth:`run`
    any points.

    Args:
        factory: ``factory(**multipliers)`` builds the model (an ``nn.Module``
            with a ``loss(batch)`` method); a multiplier at 1 is not passed.
            With ``jobs > 1`` it must be picklable: a module-level function or
            class, or a ``functools.partial`` of one.
        run_dir: folder of the stored runs and the search's outputs.
        config: what each run trains and the grids.
        corpus: the data; default :class:`~unit_scaling.data.Corpus()`.
        optimizer: ``optimizer(params, lr=lr)`` builds the optimizer; default
            :class:`unit_scaling.optim.AdamW` (u-μP's learning-rate rules).
        jobs: runs trained at once, each in its own process on one CPU thread.
        progress: show progress bars.
        device: where each run trains.

    Raises:
        TypeError: a factory, optimizer, config or corpus of the wrong kind, or
            not picklable with ``jobs > 1``.
        ValueError: ``jobs`` below 1, or multipliers the factory does not take.
    """

    def __init__(
        self,
        factory: Callable[..., nn.Module],
        run_dir: str | os.PathLike[str],
        *,
        config: SweepConfig | None = None,
        corpus: Corpus | None = None,
        optimizer: Callable[..., torch.optim.Optimizer] = optim.AdamW,
        jobs: int = 1,
        progress: bool = True,
        device: str = "cpu",
    ) -> None:
        config = SweepConfig() if config is None else config
        corpus = Corpus() if corpus is None else corpus
        for name, value in (("factory", factory), ("optimizer", optimizer)):
            if not callable(value):
                raise TypeError(
                    f"{name} must be callable (a class or function building the "
                    f"{'model' if name == 'factory' else name}), "
                    f"got {type(value).__name__}"
                )
        if not isinstance(config, SweepConfig):
            raise TypeError(
                f"config must be a SweepConfig, got {type(config).__name__}"
            )
        if not isinstance(corpus, Corpus):
            raise TypeError(f"corpus must be a Corpus, got {type(corpus).__name__}")
        if not (is_int(jobs) and jobs >= 1):
            raise ValueError(f"jobs must be a positive integer, got {jobs!r}")
        check_keywords(factory, config.multipliers)
        if jobs > 1:
            try:
                pickle.dumps((factory, optimizer, corpus))
            except (pickle.PicklingError, AttributeError, TypeError) as error:
                raise TypeError(
                    "with jobs > 1 each run trains in a new process, so factory "
                    "and optimizer must be picklable: a module-level function or "
                    f"class, or a functools.partial of one ({error})"
                ) from error
        self.factory = factory
        self.run_dir = Path(run_dir)
        self.config = config
        self.corpus = corpus
        self.optimizer = optimizer
        self.jobs = jobs
        self.progress = progress
        self.device = device

    def __repr__(self) -> str:
        return (
            f"Sweep({describe(self.factory)}, run_dir={str(self.run_dir)!r}, "
            f"optimizer={describe(self.optimizer)}, jobs={self.jobs})"
        )

    def _job(self, point: Point) -> Job:
        return Job(
            self.factory,
            self.optimizer,
            self.corpus,
            self.config,
            point,
            self.run_dir,
            self.device,
        )

    def run(self, points: Iterable[Point], description: str = "runs") -> list[Run]:
        """The runs of ``points``, in order: stored ones read, the others trained
        (``jobs`` at a time) and stored."""
        return train_all(
            [(self, p) for p in points], self.jobs, self.progress, description
        )

    def lr_sweep(
        self,
        log2_multipliers: Mapping[str, float] | None = None,
        log2_lrs: Sequence[float] | None = None,
        seed: int | None = None,
    ) -> dict[float, Run]:
        """Runs over the learning-rate grid (default ``config.log2_lrs``) at the
        given multipliers (log2; default all 1), by log2 learning rate."""
        grid = self.config.log2_lrs
        if log2_lrs is not None:
            grid = check_grid("log2_lrs", tuple(log2_lrs))
        seed = self.config.seed if seed is None else seed
        multipliers = tuple((log2_multipliers or {}).items())
        runs = self.run([Point(x, multipliers, seed) for x in grid], "lr")
        return {run.point.log2_lr: run for run in runs}

    def search(self) -> SearchResult:
        """u-μP's independent search (see the module docstring), or the
        sequential one (``config.strategy``); writes ``summary.csv``,
        ``best.json`` and ``sweep.png`` to ``run_dir``."""
        config = self.config
        lr_sweep = self.lr_sweep()
        best_lr = best_value(lr_sweep)
        multiplier_sweeps: dict[str, dict[float, Run]] = {
            name: {} for name in config.multipliers
        }
        if config.strategy == "independent":
            grid = [
                (name, x)
                for name in config.multipliers
                for x in config.log2_multipliers
            ]
            runs = self.run(
                [Point(best_lr, ((name, x),), config.seed) for name, x in grid],
                "multipliers",
            )
            for (name, x), run in zip(grid, runs, strict=True):
                multiplier_sweeps[name][x] = run
            chosen = {name: best_value(s) for name, s in multiplier_sweeps.items()}
        else:  # sequential: each at the values chosen before it
            chosen = {}
            for name in config.multipliers:
                runs = self.run(
                    [
                        Point(best_lr, (*chosen.items(), (name, x)), config.seed)
                        for x in config.log2_multipliers
                    ],
                    name,
                )
                multiplier_sweeps[name] = dict(
                    zip(config.log2_multipliers, runs, strict=True)
                )
                chosen[name] = best_value(multiplier_sweeps[name])
        combined = self.run(
            [Point(best_lr, tuple(chosen.items()), config.seed)], "combined"
        )[0]
        lr_resweep = self.lr_sweep(chosen) if config.resweep_lr else {}
        result = SearchResult(
            config=config,
            model=describe(self.factory),
            optimizer=describe(self.optimizer),
            lr_sweep=lr_sweep,
            multiplier_sweeps=multiplier_sweeps,
            combined=combined,
            lr_resweep=lr_resweep,
        )
        result.save(self.run_dir)
        return result


def train_all(
    requests: Sequence[tuple[Sweep, Point]],
    jobs: int = 1,
    progress: bool = True,
    description: str = "runs",
) -> list[Run]:
    """The run of each ``(sweep, point)``, in order: stored ones read, the
    others trained ``jobs`` at a time (in new processes when ``jobs > 1``,
    in the order given: put the longest first) and each stored as it finishes.

    One pool for the runs of several sweeps (several models) keeps every
    process busy to the end, where a pool per sweep would idle at each tail.
    An error in a run stops the rest (finished runs stay stored) and is raised.
    """
    if not (is_int(jobs) and jobs >= 1):
        raise ValueError(f"jobs must be a positive integer, got {jobs!r}")
    for sweep, point in requests:
        if not isinstance(sweep, Sweep) or not isinstance(point, Point):
            raise TypeError(
                "requests must be (Sweep, Point) pairs, got "
                f"({type(sweep).__name__}, {type(point).__name__})"
            )
    return train_jobs(
        [sweep._job(point) for sweep, point in requests], jobs, progress, description
    )


def search(
    factory: Callable[..., nn.Module],
    run_dir: str | os.PathLike[str],
    **options: Any,
) -> SearchResult:
    """``Sweep(factory, run_dir, **options).search()``: u-μP's independent
    search, resumable in ``run_dir`` (see :class:`Sweep` for the options)."""
    return Sweep(factory, run_dir, **options).search()


@dataclass(frozen=True)
class CommandOptions:
    """The model and how to run, for ``unit-scaling sweep`` (what each run
    trains is a :class:`SweepConfig`)."""

    width: int = setting(64, "width of the proxy uu.TransformerDecoder")
    layers: int = setting(2, "transformer layers")
    heads: int = setting(2, "attention heads")
    jobs: int = setting(os.cpu_count() or 1, "runs at once, one CPU thread each")
    out: Path = setting(
        Path("out/sweep"),
        "folder of the stored runs (a rerun resumes), summary.csv, best.json, "
        "sweep.png",
    )
    progress: bool = setting(True, "show progress bars")

    def __post_init__(self) -> None:
        for name in ("width", "layers", "heads", "jobs"):
            value = getattr(self, name)
            if not (is_int(value) and value >= 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.width % self.heads:
            raise ValueError(
                f"width={self.width} must be a multiple of heads={self.heads}"
            )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``unit-scaling sweep``'s options to ``parser``."""
    add_options(parser, SweepConfig)
    add_options(parser, CommandOptions)


def run_command(args: argparse.Namespace) -> SearchResult:
    """``unit-scaling sweep``: search the built-in decoder's multipliers on the
    built-in corpus, print the tables and where the outputs are."""
    config = config_from_options(SweepConfig, args)
    options = config_from_options(CommandOptions, args)
    factory = functools.partial(
        TransformerDecoder,
        hidden_size=options.width,
        vocab_size=VOCAB_SIZE,
        layers=options.layers,
        heads=options.heads,
    )
    result = search(
        factory,
        options.out,
        config=config,
        jobs=options.jobs,
        progress=options.progress,
    )
    print(result.table())
    for name in ("summary.csv", "best.json", "sweep.png"):
        print(f"wrote {options.out / name}")
    return result
