"""What one run of a sweep is, how it trains and where it is stored (the
machinery under :mod:`unit_scaling.app.sweep`, which exports the public names)."""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import math
import multiprocessing
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..data import Corpus
from . import training
from .config import setting

UMUP_MULTIPLIERS = (
    "residual_mult",
    "residual_attn_ratio",
    "mhsa_mult",
    "mlp_mult",
    "loss_mult",
)
"""The multipliers of :class:`~unit_scaling.TransformerDecoder` that the search
sweeps by default: the u-μP paper's α_res, α_res-attn-ratio, α_attn-softmax,
α_ffn-act and α_loss-softmax (``embedding_mult`` and ``readout_mult`` largely
repeat ``residual_mult`` and ``loss_mult``, so tuning them independently would
count one effect twice)."""


def warmup_cosine(step: int, steps: int, warmup: int) -> float:
    """The learning-rate factor of every run: linear warmup over ``warmup``
    steps, then cosine decay to 10% at ``steps``.

    Example::

        >>> [round(warmup_cosine(s, steps=10, warmup=2), 2) for s in (1, 2, 10)]
        [0.5, 1.0, 0.1]
    """
    if step <= warmup:
        return step / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.1 + 0.45 * (1 + math.cos(math.pi * progress))


def validation_set(
    corpus: Corpus,
    batches: int,
    batch_size: int,
    seq_len: int,
    device: torch.device | str | None = None,
) -> list[Tensor]:
    """A fixed validation set: the same ``batches`` batches for every run."""
    return [
        corpus.get_batch("validation", batch_size, seq_len, generator=i, device=device)
        for i in range(batches)
    ]


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_grid(name: str, grid: tuple[float, ...]) -> tuple[float, ...]:
    """``grid`` as sorted floats, or a ``ValueError`` naming ``name``."""
    finite = all(is_number(x) and math.isfinite(x) for x in grid)
    if not grid or not finite or len(set(grid)) != len(grid):
        raise ValueError(
            f"{name} must be a non-empty tuple of distinct finite numbers (log2 of "
            f"the values: (-1, 0, 1) is 0.5, 1, 2), got {grid!r}"
        )
    return tuple(sorted(float(x) for x in grid))


STRATEGIES = ("independent", "sequential")


@dataclass(frozen=True)
class SweepConfig:
    """What each run of a sweep trains and the grids the search walks (each
    field is also a ``unit-scaling sweep`` option: ``--log2-lrs -3 -2 -1``).

    Grids are log2 of the values, so ``(-1, 0, 1)`` is 0.5, 1, 2.

    Raises:
        ValueError: a size that is not a positive integer, ``warmup`` outside
            ``[0, steps]``, an empty or repeating grid, a multiplier grid
            without 0 (the default 1), or repeated multiplier names.
    """

    steps: int = setting(200, "optimizer steps per run")
    batch_size: int = setting(16, "sequences per step")
    seq_len: int = setting(64, "tokens per sequence")
    warmup: int = setting(20, "linear warmup steps, then cosine decay to a tenth")
    eval_every: int = setting(50, "steps between validations (0: start and end)")
    val_batches: int = setting(8, "batches in the fixed validation set")
    seed: int = setting(0, "seed of the weights and of the data order")
    log2_lrs: tuple[float, ...] = setting(
        (-3, -2, -1, 0, 1, 2, 3), "log2 of the learning rates to sweep"
    )
    log2_multipliers: tuple[float, ...] = setting(
        (-2, -1, 0, 1, 2), "log2 of each multiplier's values (must include 0)"
    )
    multipliers: tuple[str, ...] = setting(
        UMUP_MULTIPLIERS, "the model factory's multiplier keywords to search"
    )
    resweep_lr: bool = setting(
        True, "sweep the learning rate again at the combined multipliers"
    )
    strategy: str = setting(
        "independent",
        "independent: each multiplier alone at the defaults (the u-μP paper's); "
        "sequential: each in turn, the ones before it at their chosen values",
    )

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "seq_len", "val_batches"):
            value = getattr(self, name)
            if not (is_int(value) and value >= 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not (is_int(self.warmup) and 0 <= self.warmup <= self.steps):
            raise ValueError(
                f"warmup must be an integer from 0 to steps={self.steps}, "
                f"got {self.warmup!r}"
            )
        if not (is_int(self.eval_every) and self.eval_every >= 0):
            raise ValueError(
                f"eval_every must be a non-negative integer, got {self.eval_every!r}"
            )
        if not is_int(self.seed):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if self.strategy not in STRATEGIES:
            raise ValueError(
                f"strategy must be one of {STRATEGIES}, got {self.strategy!r}"
            )
        for name in ("log2_lrs", "log2_multipliers"):
            object.__setattr__(self, name, check_grid(name, getattr(self, name)))
        if 0 not in self.log2_multipliers:
            raise ValueError(
                "log2_multipliers must include 0 (the default multiplier, 1), so "
                f"that each sweep measures the default too; got {self.log2_multipliers}"
            )
        names = tuple(self.multipliers)
        if not all(isinstance(n, str) and n.isidentifier() for n in names) or len(
            set(names)
        ) != len(names):
            raise ValueError(
                "multipliers must be distinct keyword-argument names of the model "
                f"factory, got {self.multipliers!r}"
            )
        object.__setattr__(self, "multipliers", names)

    def training(self) -> dict[str, int]:
        """The settings that decide a run's training (a seed aside)."""
        names = ("steps", "batch_size", "seq_len", "warmup", "eval_every")
        return {name: getattr(self, name) for name in (*names, "val_batches")}


def power(x: float) -> str:
    return f"2^{x:g}"


@dataclass(frozen=True)
class Point:
    """One configuration to train: log2 of the learning rate, log2 of each
    multiplier that is not at its default of 1, and the seed.

    Use :meth:`at` to build one; multipliers at 0 (the value 1) are dropped, so
    two spellings of one configuration are one point.
    """

    log2_lr: float
    log2_multipliers: tuple[tuple[str, float], ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        pairs = dict(self.log2_multipliers).items()
        for name, value in (("log2_lr", self.log2_lr), *pairs):
            if not (is_number(value) and math.isfinite(value)):
                raise ValueError(
                    f"Point: {name} must be a finite number (log2 of the value), "
                    f"got {value!r}"
                )
        if not all(isinstance(name, str) for name, _ in pairs):
            raise TypeError("Point: multiplier names must be strings")
        if not is_int(self.seed):
            raise TypeError(f"Point: seed must be an integer, got {self.seed!r}")
        object.__setattr__(self, "log2_lr", float(self.log2_lr))
        kept = sorted((name, float(x)) for name, x in pairs if x != 0)
        object.__setattr__(self, "log2_multipliers", tuple(kept))

    @classmethod
    def at(cls, log2_lr: float, seed: int = 0, **log2_multipliers: float) -> Point:
        """The point with these log2 values.

        Example::

            >>> Point.at(-1, mhsa_mult=1, loss_mult=0).label
            'lr 2^-1, mhsa_mult 2^1, seed 0'
        """
        return cls(log2_lr, tuple(log2_multipliers.items()), seed)

    @property
    def lr(self) -> float:
        return float(2.0**self.log2_lr)

    @property
    def multipliers(self) -> dict[str, float]:
        """The multipliers away from 1, as values (the factory's keywords)."""
        return {name: float(2.0**x) for name, x in self.log2_multipliers}

    @property
    def label(self) -> str:
        parts = [f"lr {power(self.log2_lr)}"]
        parts += [f"{name} {power(x)}" for name, x in self.log2_multipliers]
        return ", ".join([*parts, f"seed {self.seed}"])


def finite_or_none(values: Iterable[float]) -> list[float | None]:
    return [x if math.isfinite(x) else None for x in values]


def _floats(values: Iterable[float | None]) -> tuple[float, ...]:
    return tuple(math.nan if x is None else float(x) for x in values)


@dataclass(frozen=True)
class Run:
    """A finished run: its point, loss curves and wall time."""

    point: Point
    train_loss: tuple[float, ...]
    eval_steps: tuple[int, ...]
    validation_loss: tuple[float, ...]
    seconds: float

    @property
    def diverged(self) -> bool:
        """True if any recorded loss is NaN or infinite."""
        return not all(map(math.isfinite, self.train_loss + self.validation_loss))

    @property
    def loss(self) -> float:
        """The final validation loss; ``inf`` (the worst) for a diverged run."""
        return math.inf if self.diverged else self.validation_loss[-1]

    def to_json(self) -> dict[str, Any]:
        """The run as JSON-ready values (non-finite losses as ``None``)."""
        return {
            "lr": self.point.lr,
            "multipliers": self.point.multipliers,
            "seed": self.point.seed,
            "loss": self.loss if math.isfinite(self.loss) else None,
            "diverged": self.diverged,
            "seconds": self.seconds,
            "train_loss": finite_or_none(self.train_loss),
            "eval_steps": list(self.eval_steps),
            "validation_loss": finite_or_none(self.validation_loss),
        }


def describe(obj: Any) -> str:
    """A name for ``obj`` that is the same in every process: qualified name,
    and for a ``functools.partial`` its arguments too."""
    if isinstance(obj, functools.partial):
        args = [describe(obj.func), *map(repr, obj.args)]
        args += [f"{k}={v!r}" for k, v in sorted(obj.keywords.items())]
        return f"partial({', '.join(args)})"
    name = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    return f"{getattr(obj, '__module__', None) or type(obj).__module__}.{name}"


def check_keywords(factory: Callable[..., Any], names: Sequence[str]) -> None:
    """Raise if ``factory`` visibly takes no keyword argument ``names``."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # no signature to read: the first run tells
        return
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return
    kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    accepted = [p.name for p in parameters if p.kind in kinds]
    unknown = [n for n in names if n not in accepted]
    if unknown:
        raise ValueError(
            f"multipliers {unknown} are not keyword arguments of the model factory "
            f"{describe(factory)}, which takes {accepted}: name the factory's own "
            "multiplier keywords (for uu.TransformerDecoder, see UMUP_MULTIPLIERS)"
        )


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` to ``path`` atomically: whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(data, indent=1, allow_nan=False) + "\n")
    os.replace(temporary, path)


@dataclass(frozen=True)
class Job:
    """Everything one run needs, sent to the process that trains it; ``key``
    (what decides the run) names its file in ``run_dir/runs/``."""

    factory: Callable[..., nn.Module]
    optimizer: Callable[..., torch.optim.Optimizer]
    corpus: Corpus
    config: SweepConfig
    point: Point
    run_dir: Path
    device: str

    @functools.cached_property
    def key(self) -> dict[str, Any]:
        return {
            "model": describe(self.factory),
            "optimizer": describe(self.optimizer),
            "corpus": repr(self.corpus),
            "training": self.config.training(),
            "seed": self.point.seed,
            "log2_lr": self.point.log2_lr,
            "log2_multipliers": dict(self.point.log2_multipliers),
        }

    @functools.cached_property
    def path(self) -> Path:
        digest = hashlib.sha256(json.dumps(self.key, sort_keys=True).encode())
        name = self.point.label.replace(", ", "_").replace(" ", "")
        return self.run_dir / "runs" / f"{name}-{digest.hexdigest()[:12]}.json"


def _train(job: Job) -> Run:
    """Train ``job``'s run on one CPU thread, store it and return it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # so a run's numbers do not depend on ``jobs``
    try:
        run = _train_one(job)
    finally:  # (an in-process run must leave the caller's setting alone)
        torch.set_num_threads(threads)
    write_json(job.path, {"key": job.key, **run.to_json()})
    return run


def _train_one(job: Job) -> Run:
    config, point = job.config, job.point
    torch.manual_seed(point.seed)
    model = job.factory(**point.multipliers)
    loss_fn = getattr(model, "loss", None)
    if not isinstance(model, nn.Module) or not callable(loss_fn):
        raise TypeError(
            f"the model factory {describe(job.factory)} returned "
            f"{type(model).__name__}; expected an nn.Module with a loss(batch) "
            "method (the mean next-token loss of a (batch, seq + 1) tensor of "
            "token ids), as uu.TransformerDecoder has"
        )
    model.to(job.device)
    history = training.train(
        model,
        loss_fn,
        job.optimizer(model.parameters(), lr=point.lr),
        job.corpus.batches(
            "train", config.batch_size, config.seq_len, point.seed, device=job.device
        ),
        config.steps,
        validation_set(
            job.corpus,
            config.val_batches,
            config.batch_size,
            config.seq_len,
            job.device,
        ),
        config.eval_every,
        progress=False,
        schedule=functools.partial(
            warmup_cosine, steps=config.steps, warmup=config.warmup
        ),
    )
    return Run(
        point,
        tuple(history.train_loss),
        tuple(history.eval_steps),
        tuple(history.validation_loss),
        history.seconds,
    )


def _load(job: Job) -> Run | None:
    """The stored run of ``job``, if its file is there and is its own."""
    try:
        data = json.loads(job.path.read_text())
    except (OSError, ValueError):
        return None
    if data.get("key") != job.key:
        return None
    return Run(
        job.point,
        _floats(data["train_loss"]),
        tuple(data["eval_steps"]),
        _floats(data["validation_loss"]),
        data["seconds"],
    )


def _progress_bar(total: int, description: str, progress: bool) -> Any:
    try:
        from tqdm import tqdm
    except ImportError as error:
        raise ImportError(
            "the sweep draws progress bars with tqdm, which is not installed: "
            'pip install "torch-unit-scaling[app]"'
        ) from error
    return tqdm(total=total, desc=description, disable=not progress)


def train_jobs(
    jobs: Sequence[Job], workers: int, progress: bool, description: str
) -> list[Run]:
    """The run of each job, in order: stored ones read, the others trained
    ``workers`` at a time (in new processes if more than one), each stored as
    it finishes. An error in a run stops the rest and is raised."""
    unique = {job.path: job for job in jobs}
    done: dict[Path, Run] = {}
    for path, job in unique.items():
        stored = _load(job)
        if stored is not None:
            done[path] = stored
    missing = [job for path, job in unique.items() if path not in done]
    bar = _progress_bar(len(unique), description, progress)
    bar.update(len(done))

    def finished(job: Job, run: Run) -> None:
        done[job.path] = run
        bar.set_postfix_str(f"{job.point.label}: {run.loss:.3f}", refresh=False)
        bar.update()

    try:
        if workers == 1 or len(missing) <= 1:
            for job in missing:
                finished(job, _train(job))
        else:
            _train_in_pool(missing, min(workers, len(missing)), finished)
    finally:
        bar.close()
    return [done[job.path] for job in jobs]


def _train_in_pool(
    jobs: list[Job], workers: int, finished: Callable[[Job, Run], None]
) -> None:
    # "spawn": forking a process whose OpenMP thread pool is running can hang.
    pool = ProcessPoolExecutor(workers, multiprocessing.get_context("spawn"))
    try:
        futures: dict[Future[Run], Job] = {pool.submit(_train, j): j for j in jobs}
        for future in as_completed(futures):
            finished(futures[future], future.result())
    finally:  # on an error or an interrupt, start nothing more
        pool.shutdown(wait=True, cancel_futures=True)


def best_value(runs: Mapping[float, Run]) -> float:
    """The grid value of the lowest loss; a tie goes to the value nearer 0
    (the default), so a flat sweep keeps the default."""
    return min(runs, key=lambda x: (runs[x].loss, abs(x), x))
