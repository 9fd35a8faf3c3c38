"""``unit_scaling.app.sweep``: u-μP's independent search, its stored runs and
``unit-scaling sweep``.

Most tests search a toy model whose loss is known in closed form: it learns one
number (so the learning rate matters), pays a penalty for each multiplier away
from its preferred value, and returns NaN when ``unstable`` is 2 or more.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import functools
import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import unit_scaling as uu
from unit_scaling.app.cli import main
from unit_scaling.app.sweep import (
    Point,
    SearchResult,
    Sweep,
    SweepConfig,
    search,
    train_all,
)
from unit_scaling.data import Corpus

CORPUS = Corpus(max_bytes=2**16)
TOY = SweepConfig(
    steps=4,
    batch_size=2,
    seq_len=8,
    warmup=0,
    eval_every=2,
    val_batches=1,
    log2_lrs=(-2, -1, 0, 1),
    log2_multipliers=(-1, 0, 1),
    multipliers=("a", "b", "unstable"),
)
# Each stage's runs, in the order the search trains them (the toy's best lr
# is 2^0, its best multipliers a = 2^1 and b = 2^-1).
LRS = [(x, {}) for x in (-2, -1, 0, 1)]
MULTIPLIERS = [
    (0, {name: x}) for name in ("a", "b", "unstable") for x in (-1, 1)
]  # (value 0 is the defaults at lr 2^0: already trained)
COMBINED = [(0, {"a": 1, "b": -1})]
RESWEEP = [(x, {"a": 1, "b": -1}) for x in (-2, -1, 1)]  # (2^0 is COMBINED)
ORDER = LRS + MULTIPLIERS + COMBINED + RESWEEP


class Toy(nn.Module):
    """``loss = (w - 1)² + (log2 a - 1)² + (log2 b + 1)²``, ``w`` from 0."""

    def __init__(self, *, a: float = 1.0, b: float = 1.0, unstable: float = 1.0):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(()))
        self.penalty = (math.log2(a) - 1) ** 2 + (math.log2(b) + 1) ** 2
        self.unstable = unstable >= 2

    def loss(self, batch: Tensor) -> Tensor:
        loss = (self.w - 1) ** 2 + self.penalty
        return loss * math.nan if self.unstable else loss


class Recorder:
    """A toy factory and optimizer that log what each run asked for (log2 lr
    and log2 multipliers), and fail after ``fail_after`` runs."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.calls: list[tuple[float, dict[str, float]]] = []
        self.fail_after = fail_after
        self._multipliers: dict[str, float] = {}

    def __call__(self, **multipliers: float) -> nn.Module:
        if self.fail_after is not None and len(self.calls) == self.fail_after:
            raise RuntimeError("interrupted")
        self._multipliers = {k: math.log2(v) for k, v in multipliers.items()}
        return Toy(**multipliers)

    def optimizer(self, params: Any, lr: float) -> torch.optim.Optimizer:
        self.calls.append((math.log2(lr), self._multipliers))
        return torch.optim.SGD(params, lr=lr)


def _search(run_dir: Path, recorder: Recorder) -> SearchResult:
    sweep = Sweep(
        recorder,
        run_dir,
        config=TOY,
        corpus=CORPUS,
        optimizer=recorder.optimizer,
        progress=False,
    )
    return sweep.search()


@pytest.fixture(scope="module")
def toy_search(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, Recorder, SearchResult]:
    run_dir = tmp_path_factory.mktemp("toy")
    recorder = Recorder()
    return run_dir, recorder, _search(run_dir, recorder)


def test_stages_run_in_order_and_each_trains_once(
    toy_search: tuple[Path, Recorder, SearchResult],
) -> None:
    _, recorder, result = toy_search
    assert recorder.calls == ORDER
    assert list(result.lr_sweep) == [-2, -1, 0, 1]
    assert list(result.multiplier_sweeps) == ["a", "b", "unstable"]
    for name, sweep in result.multiplier_sweeps.items():
        assert list(sweep) == [-1, 0, 1]
        for x, run in sweep.items():  # one multiplier at a time, at the best lr
            assert run.point.log2_lr == 0
            assert dict(run.point.log2_multipliers) == ({name: x} if x else {})
    assert result.combined.point == Point.at(0, a=1, b=-1)
    assert list(result.lr_resweep) == [-2, -1, 0, 1]
    assert result.lr_resweep[0] == result.combined  # one run, read back


def test_the_best_values_are_combined(
    toy_search: tuple[Path, Recorder, SearchResult],
) -> None:
    _, _, result = toy_search
    assert result.default.point == Point(0)
    assert result.best.point == Point.at(0, a=1, b=-1)
    assert result.best.loss < result.default.loss
    assert result.best.loss == pytest.approx(0.0, abs=1e-2)
    config = result.best_config()
    assert config["lr"] == 1.0
    assert config["multipliers"] == {"a": 2.0, "b": 0.5, "unstable": 1.0}
    assert config["log2_multipliers"] == {"a": 1.0, "b": -1.0, "unstable": 0.0}


def test_diverged_runs_count_as_the_worst(
    toy_search: tuple[Path, Recorder, SearchResult],
) -> None:
    run_dir, _, result = toy_search
    unstable = result.multiplier_sweeps["unstable"]
    assert unstable[1].diverged and unstable[1].loss == math.inf
    assert not unstable[-1].diverged
    assert "diverged" in result.table()
    (stored,) = (run_dir / "runs").glob("*unstable2^1*.json")
    data = json.loads(stored.read_text())  # strict JSON: no NaN
    assert data["diverged"] is True and data["loss"] is None
    assert data["train_loss"] == [None]  # training stops at the first NaN


def test_every_run_and_the_summary_are_stored(
    toy_search: tuple[Path, Recorder, SearchResult],
) -> None:
    run_dir, _, result = toy_search
    files = sorted((run_dir / "runs").glob("*.json"))
    assert len(files) == len(ORDER)
    data = json.loads((run_dir / "runs" / files[0].name).read_text())
    assert {"key", "lr", "multipliers", "seed", "train_loss"} <= set(data)
    assert data["key"]["training"]["steps"] == TOY.steps
    finite = [json.loads(f.read_text()) for f in files]
    curves = [d for d in finite if not d["diverged"]]
    assert all(len(d["train_loss"]) == TOY.steps for d in curves)
    assert all(d["eval_steps"] == [0, 2, 4] for d in curves)
    with (run_dir / "summary.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert len(rows) == len(result.stages())
    assert [r["stage"] for r in rows[:4]] == ["lr"] * 4
    assert rows[-1]["stage"] == "lr at combined"
    best = json.loads((run_dir / "best.json").read_text())
    assert best["multipliers"] == result.best_config()["multipliers"]
    assert best["default"]["lr"] == 1.0
    assert (run_dir / "sweep.png").stat().st_size > 10_000


def test_an_interrupted_search_resumes_where_it_stopped(
    tmp_path: Path, toy_search: tuple[Path, Recorder, SearchResult]
) -> None:
    interrupted = Recorder(fail_after=7)
    with pytest.raises(RuntimeError, match="interrupted"):
        _search(tmp_path, interrupted)
    assert len(list((tmp_path / "runs").glob("*.json"))) == 7
    assert not list((tmp_path / "runs").glob(".*"))  # no half-written file
    resumed = Recorder()
    result = _search(tmp_path, resumed)
    assert resumed.calls == ORDER[7:]  # the finished runs are not trained again
    assert result.best_config() == toy_search[2].best_config()
    again = Recorder()
    _search(tmp_path, again)
    assert again.calls == []


def test_a_run_of_other_settings_is_not_reused(tmp_path: Path) -> None:
    first, second = Recorder(), Recorder()
    Sweep(
        first,
        tmp_path,
        config=TOY,
        corpus=CORPUS,
        optimizer=first.optimizer,
        progress=False,
    ).run([Point(-1)])
    longer = SweepConfig(**{**_fields(TOY), "steps": 5})
    Sweep(
        second,
        tmp_path,
        config=longer,
        corpus=CORPUS,
        optimizer=second.optimizer,
        progress=False,
    ).run([Point(-1), Point(-1)])
    assert len(first.calls) == len(second.calls) == 1
    assert len(list((tmp_path / "runs").glob("*.json"))) == 2


def _fields(config: SweepConfig) -> dict[str, Any]:
    return {k: getattr(config, k) for k in config.__dataclass_fields__}


def test_points_name_one_configuration_one_way() -> None:
    assert Point.at(0, a=0, b=1) == Point(0.0, (("b", 1.0),))
    assert Point.at(-1, seed=2, b=1, a=-2).label == "lr 2^-1, a 2^-2, b 2^1, seed 2"
    assert Point.at(1, a=1).multipliers == {"a": 2.0} and Point(-2).lr == 0.25


def test_real_decoder_in_worker_processes(tmp_path: Path) -> None:
    factory = functools.partial(
        uu.TransformerDecoder, hidden_size=16, vocab_size=256, layers=1, heads=1
    )
    config = SweepConfig(
        steps=2,
        batch_size=2,
        seq_len=16,
        warmup=1,
        val_batches=1,
        multipliers=("mlp_mult",),
    )
    sweep = Sweep(
        factory, tmp_path, config=config, corpus=CORPUS, jobs=2, progress=False
    )
    points = [Point(0), Point.at(0, mlp_mult=1)]
    runs = sweep.run(points)
    assert [r.point for r in runs] == points
    assert all(math.isfinite(r.loss) and r.loss < 5.6 for r in runs)
    assert runs[0].loss != runs[1].loss  # the multiplier reached the model
    # Stored by the workers; read back the same in this process.
    assert train_all([(sweep, p) for p in points], progress=False) == runs


def test_cli_help_and_a_tiny_search(tmp_path: Path) -> None:
    with (
        pytest.raises(SystemExit) as exit_info,
        contextlib.redirect_stdout(io.StringIO()) as printed,
    ):
        main(["sweep", "--help"])
    assert exit_info.value.code == 0
    for option in ("--log2-lrs", "--log2-multipliers", "--multipliers", "--jobs"):
        assert option in printed.getvalue()
    argv = [
        "sweep", "--width", "16", "--layers", "1", "--heads", "1", "--steps", "2",
        "--batch-size", "2", "--seq-len", "16", "--warmup", "1", "--val-batches",
        "1", "--log2-lrs", "-1", "0", "--log2-multipliers", "0", "1",
        "--multipliers", "mhsa_mult", "loss_mult", "--no-resweep-lr", "--jobs",
        "1", "--no-progress", "--out", str(tmp_path),
    ]  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert main(argv) == 0
    text = printed.getvalue()
    assert "| mhsa_mult |" in text and "| loss_mult |" in text and "Chosen:" in text
    best = json.loads((tmp_path / "best.json").read_text())
    assert set(best["multipliers"]) == {"mhsa_mult", "loss_mult"}
    assert best["model"].startswith("partial(unit_scaling.modules.transformer.")
    assert (tmp_path / "sweep.png").stat().st_size > 10_000
    with (tmp_path / "summary.csv").open() as file:
        points = {tuple(row.values())[3:7] for row in csv.DictReader(file)}
    assert len(list((tmp_path / "runs").glob("*.json"))) == len(points)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--width", "30", "--heads", "4"], "width=30 must be a multiple of heads=4"),
        (["--log2-multipliers", "1", "2"], "must include 0"),
        (["--multipliers", "no_such_mult"], "not keyword arguments of the model"),
        (["--steps", "0"], "steps must be a positive integer"),
        (["--jobs", "0"], "jobs must be a positive integer"),
    ],
)
def test_cli_bad_options(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sweep", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"steps": 0}, "steps must be a positive integer"),
        ({"batch_size": 1.5}, "batch_size must be a positive integer"),
        ({"warmup": 300}, "warmup must be an integer from 0 to steps=200"),
        ({"eval_every": -1}, "eval_every must be a non-negative"),
        ({"log2_lrs": ()}, "log2_lrs must be a non-empty tuple"),
        ({"log2_lrs": (0, 0)}, "log2_lrs must be a non-empty tuple of distinct"),
        ({"log2_multipliers": (0, math.inf)}, "log2_multipliers must be"),
        ({"multipliers": ("a", "a")}, "multipliers must be distinct"),
        ({"multipliers": ("not a name",)}, "multipliers must be distinct"),
    ],
)
def test_bad_settings(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SweepConfig(**settings)


def _plain_model(**multipliers: float) -> nn.Module:
    return nn.Linear(2, 2)


def test_bad_arguments(tmp_path: Path) -> None:
    toy = SweepConfig(multipliers=("a",))
    with pytest.raises(TypeError, match="factory must be callable"):
        Sweep(3, tmp_path)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="optimizer must be callable"):
        Sweep(Toy, tmp_path, optimizer="adam")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="config must be a SweepConfig"):
        Sweep(Toy, tmp_path, config={"steps": 1})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="corpus must be a Corpus"):
        Sweep(Toy, tmp_path, config=toy, corpus="text")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="jobs must be a positive integer"):
        Sweep(Toy, tmp_path, config=toy, jobs=0)
    with pytest.raises(ValueError, match=r"\['residual_mult'.*not keyword argu"):
        Sweep(Toy, tmp_path)  # the default multipliers are the decoder's
    with pytest.raises(TypeError, match="must be picklable"):
        Sweep(lambda **m: Toy(**m), tmp_path, config=toy, jobs=2)
    with pytest.raises(TypeError, match="requests must be"):
        train_all([(Point(0), Point(0))])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="log2_lr must be a finite number"):
        Point(math.nan)
    sweep = Sweep(
        _plain_model,
        tmp_path,
        config=toy,
        corpus=CORPUS,
        optimizer=torch.optim.SGD,
        progress=False,
    )
    with pytest.raises(TypeError, match=r"expected an nn.Module with a loss\(batch"):
        sweep.run([Point(0)])


def test_search_function_is_a_sweep(tmp_path: Path) -> None:
    recorder = Recorder()
    config = SweepConfig(**{**_fields(TOY), "resweep_lr": False})
    result = search(
        recorder,
        tmp_path,
        config=config,
        corpus=CORPUS,
        optimizer=recorder.optimizer,
        progress=False,
    )
    assert result.lr_resweep == {} and result.best == result.combined
    assert recorder.calls == LRS + MULTIPLIERS + COMBINED


class Coupled(nn.Module):
    """``loss = (w - 1)² + (log2 a + log2 b - 1)² + 0.1 (log2 a)²``: each
    multiplier alone prefers 2, together they overshoot."""

    def __init__(self, *, a: float = 1.0, b: float = 1.0) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(()))
        x, y = math.log2(a), math.log2(b)
        self.penalty = (x + y - 1) ** 2 + 0.1 * x**2

    def loss(self, batch: Tensor) -> Tensor:
        return (self.w - 1) ** 2 + self.penalty


def _coupled(run_dir: Path, strategy: str) -> SearchResult:
    config = dataclasses.replace(
        TOY, multipliers=("a", "b"), strategy=strategy, resweep_lr=False
    )
    return Sweep(
        Coupled,
        run_dir,
        config=config,
        corpus=CORPUS,
        optimizer=torch.optim.SGD,
        progress=False,
    ).search()


def test_the_sequential_strategy_sweeps_each_at_the_values_before_it(
    tmp_path: Path,
) -> None:
    independent = _coupled(tmp_path / "independent", "independent")
    assert independent.combined.point == Point.at(0, a=1, b=1)  # overshoots
    sequential = _coupled(tmp_path / "sequential", "sequential")
    for x, run in sequential.multiplier_sweeps["b"].items():
        assert dict(run.point.log2_multipliers) == ({"a": 1, "b": x} if x else {"a": 1})
    assert sequential.best.point == Point.at(0, a=1)
    assert sequential.best.loss < independent.best.loss
    assert "in turn" in sequential.table()
    with pytest.raises(ValueError, match="strategy"):
        dataclasses.replace(TOY, strategy="random")
