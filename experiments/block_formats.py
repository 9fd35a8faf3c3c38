"""Block-scaled formats: u-μP and SP trained in simulated MXFP8, MXFP6, MXFP4 and
NVFP4, and NVFP4 with one static per-tensor scale.

Trains the demo's decoder (2 layers, head size 32, byte tokens of the built-in
corpus, batch 16 × 64, 400 AdamW steps, 30 warmup steps then cosine decay) in the
standard parametrisation (SP: GPT-2 init, ``torch.optim.AdamW``, each width's
optimal lr in ``lr_transfer.md``) and in u-μP (``uu.TransformerDecoder`` with
``uu.RECOMMENDED``'s multipliers and lr, ``uu.optim.AdamW``), in FP32, in
simulated per-tensor FP8 (:func:`~unit_scaling.transforms.simulate_fp8`) and
under each block-format recipe of :mod:`unit_scaling.formats` applied with
:func:`~unit_scaling.transforms.simulate_format`. The runs come in cells, in
priority order (``--cells`` chooses, comma-separated):

(a) width 256, u-μP and SP, each in FP32, FP8, MXFP8, MXFP4 and NVFP4;
(b) width 256, u-μP and SP in NVFP4 with a static per-tensor scale
    (``tensor_amax=448``: each E4M3 block scale is the block's amax) instead of
    each tensor's current amax;
(c) MXFP6 at width 256 for both; widths 128 and 512 (``--other-widths``) in FP32
    and NVFP4 for both, and in static NVFP4 for u-μP;
(d) a ``unit_scale``d Llama-style model (``transformers``, width 128, 2 layers)
    in FP32, MXFP8, NVFP4 and static NVFP4;
(e) seeds 1 and 2 of the runs named by ``--seeds-for "name;name"`` (the run-to-run
    spread; none by default).

Every finished run is saved as JSON in ``--runs`` (default
``out/block_formats/``); run again, the script trains only the runs whose JSON is
missing or was saved with other settings (``--fresh`` trains them all again), and
``--render-only`` writes the page from the saved runs alone (give it the options
the runs were trained with: a run saved with other settings counts as not run).
Writes ``block_formats.md`` and ``block_formats.png`` to ``--out`` (default
``docs/results/``)::

    .venv/bin/python experiments/block_formats.py --jobs 2
    .venv/bin/python experiments/block_formats.py --cells a,b
    .venv/bin/python experiments/block_formats.py --cells e \\
        --seeds-for "u-μP NVFP4 w256;u-μP NVFP4 static w256"
    .venv/bin/python experiments/block_formats.py --render-only
    .venv/bin/python experiments/block_formats.py --steps 4 --cells a,b \\
        --out /tmp/bf_out --runs /tmp/bf_out/runs
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import statistics
import sys
import textwrap
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from _common import (
    HEAD_SIZE,
    Curve,
    LanguageModel,
    make_model,
    make_optimizer,
    markdown_table,
    reflow,
    run_all,
    run_parser,
    timing_note,
    validation_set,
)
from torch import Tensor, nn

import unit_scaling as uu
from unit_scaling.app import training
from unit_scaling.app.config import parse_config, setting
from unit_scaling.app.sweep import warmup_cosine
from unit_scaling.data import VOCAB_SIZE, Corpus
from unit_scaling.formats import (
    MXFP4_RECIPE,
    MXFP6_RECIPE,
    MXFP8_RECIPE,
    NVFP4_RECIPE,
    Recipe,
    recipe_with_rule,
)
from unit_scaling.transforms import simulate_format, simulate_fp8, unit_scale
from unit_scaling.zoo import hf_model

ROOT = Path(__file__).resolve().parents[1]
CELLS = ("a", "b", "c", "d", "e")
CELL_TITLES = {
    "a": "(a) Formats at width {width}",
    "b": "(b) Static per-tensor NVFP4 scales at width {width}",
    "c": "(c) MXFP6, and NVFP4 at other widths",
    "d": "(d) A `unit_scale`d Llama-style model",
    "e": "(e) More seeds",
}
UMUP, SP, LLAMA = "u-μP", "SP", "Llama u-μP"
PARAMETRISATIONS = (UMUP, SP)
STATIC = "NVFP4 static"
# E4M3's largest value: with it as the tensor's amax, NVFP4's per-tensor scale
# is 448·6/448 = 6 and each E4M3 block scale equals its block's amax.
STATIC_AMAX = 448.0
RECIPES: dict[str, Recipe] = {
    "MXFP8": MXFP8_RECIPE,
    "MXFP6": MXFP6_RECIPE,
    "MXFP4": MXFP4_RECIPE,
    "NVFP4": NVFP4_RECIPE,
    STATIC: dataclasses.replace(NVFP4_RECIPE, tensor_amax=STATIC_AMAX),
    "MXFP8 floor": recipe_with_rule(MXFP8_RECIPE, "floor"),
    "MXFP4 round-up": recipe_with_rule(MXFP4_RECIPE, "rceil"),
}
# Each MX format with the OCP floor rule and with the round-up rule.
RULE_PAIRS = {"MXFP8": ("MXFP8 floor", "MXFP8"), "MXFP4": ("MXFP4", "MXFP4 round-up")}
PRECISIONS = (
    "FP32",
    "FP8",
    "MXFP8",
    "MXFP6",
    "MXFP4",
    "NVFP4",
    STATIC,
    "MXFP8 floor",
    "MXFP4 round-up",
)


@dataclass(frozen=True)
class Config:
    cells: str = setting(
        ",".join(CELLS),
        "cells to run, comma-separated: a (formats at width 256), b (static NVFP4 "
        "scales), c (MXFP6; other widths), d (unit_scale'd Llama), e (more seeds)",
    )
    seeds_for: str = setting(
        "", "';'-separated names of the runs that cell e repeats with --extra-seeds"
    )
    steps: int = 400
    width: int = setting(256, "the width of cells a and b")
    other_widths: tuple[int, ...] = setting((128, 512), "cell c's other widths")
    layers: int = 2
    batch_size: int = 16
    seq_len: int = 64
    warmup: int = 30
    eval_every: int = 25
    val_batches: int = 8
    seed: int = 0
    extra_seeds: tuple[int, ...] = setting((1, 2), "cell e's seeds")
    sp_log2_lrs: tuple[str, ...] = setting(
        ("64=-9", "128=-9", "256=-10", "512=-11"),
        "SP's log2 lr by width, WIDTH=LOG2 (each width's optimum in lr_transfer.md)",
    )
    llama_width: int = 128
    llama_intermediate: int = 344
    llama_heads: int = 4
    fresh: bool = setting(False, "train every chosen run again, saved or not")
    render_only: bool = setting(False, "write the page from the saved runs only")
    runs: Path = setting(ROOT / "out" / "block_formats", "where runs are saved")

    def __post_init__(self) -> None:
        unknown = set(self.chosen) - set(CELLS)
        if unknown:
            raise ValueError(f"unknown cells {sorted(unknown)}: choose from {CELLS}")
        lrs = self.sp_lrs  # (checks the format)
        for width in (self.width, *self.other_widths):
            if width not in lrs:
                raise ValueError(f"--sp-log2-lrs has no learning rate for {width}")
        if self.width % HEAD_SIZE or any(w % HEAD_SIZE for w in self.other_widths):
            raise ValueError(f"widths must be multiples of the head size {HEAD_SIZE}")

    @property
    def chosen(self) -> list[str]:
        return [c.strip() for c in self.cells.split(",") if c.strip()]

    @property
    def sp_lrs(self) -> dict[int, float]:
        out = {}
        for item in self.sp_log2_lrs:
            width, _, log2 = item.partition("=")
            try:
                out[int(width)] = 2.0 ** float(log2)
            except ValueError:
                raise ValueError(
                    f"--sp-log2-lrs takes WIDTH=LOG2 items, got {item!r}"
                ) from None
        return out

    @property
    def named_for_seeds(self) -> list[str]:
        return [n.strip() for n in self.seeds_for.split(";") if n.strip()]


@dataclass(frozen=True)
class Run:
    model: str  # UMUP, SP or LLAMA
    precision: str  # one of PRECISIONS
    width: int
    seed: int = 0

    @property
    def base(self) -> str:
        """The name without the seed: the same run at every seed."""
        return f"{self.model} {self.precision} w{self.width}"

    def name(self, config: Config) -> str:
        return (
            self.base if self.seed == config.seed else f"{self.base} seed {self.seed}"
        )

    @property
    def slug(self) -> str:
        text = f"{self.base} seed {self.seed}"
        return text.replace("μ", "mu").replace(" ", "_")

    @property
    def parametrisation(self) -> str:
        return SP if self.model == SP else UMUP

    def reference(self) -> Run:
        """The FP32 run of the same model, width and seed."""
        return dataclasses.replace(self, precision="FP32")


def plan(config: Config, saved: Iterable[Run] = ()) -> dict[str, list[Run]]:
    """Each cell's runs, in order. Cell e holds the ``--seeds-for`` runs at the
    extra seeds and any saved run at another seed."""
    w, seed = config.width, config.seed
    cells: dict[str, list[Run]] = {c: [] for c in CELLS}
    for p in PARAMETRISATIONS:
        for precision in ("FP32", "FP8", "MXFP8", "MXFP4", "NVFP4"):
            cells["a"].append(Run(p, precision, w, seed))
    for p in PARAMETRISATIONS:  # the OCP specification's scale rule
        for precision in ("MXFP8 floor", "MXFP4 round-up"):
            cells["a"].append(Run(p, precision, w, seed))
    cells["b"] = [Run(UMUP, STATIC, w, seed), Run(SP, STATIC, w, seed)]
    cells["c"] = [Run(p, "MXFP6", w, seed) for p in PARAMETRISATIONS]
    for width in config.other_widths:
        for p in PARAMETRISATIONS:
            cells["c"] += [Run(p, "FP32", width, seed), Run(p, "NVFP4", width, seed)]
        cells["c"].append(Run(UMUP, STATIC, width, seed))
    cells["d"] = [
        Run(LLAMA, precision, config.llama_width, seed)
        for precision in ("FP32", "MXFP8", "NVFP4", STATIC)
    ]
    by_name = {r.base: r for c in "abcd" for r in cells[c]}
    for name in config.named_for_seeds:
        if name not in by_name:
            raise SystemExit(
                f"--seeds-for: no run named {name!r}; the runs are: "
                + "; ".join(by_name)
            )
        cells["e"] += [
            dataclasses.replace(by_name[name], seed=s) for s in config.extra_seeds
        ]
    for run in saved:
        if run.seed != seed and run not in cells["e"]:
            cells["e"].append(run)
    return cells


# --- Training ---


def run_settings(config: Config, run: Run) -> dict[str, Any]:
    """What a run's result depends on besides its name: a saved run is reused
    only if these match."""
    settings: dict[str, Any] = {
        k: getattr(config, k)
        for k in (
            "steps",
            "layers",
            "batch_size",
            "seq_len",
            "warmup",
            "eval_every",
            "val_batches",
        )
    }
    settings["lr"] = learning_rate(config, run)
    if run.model == LLAMA:
        settings["llama"] = [config.llama_intermediate, config.llama_heads]
    return settings


def learning_rate(config: Config, run: Run) -> float:
    if run.model == LLAMA:
        return uu.RECOMMENDED.unit_scale_lr
    if run.model == UMUP:
        return uu.RECOMMENDED.lr
    return config.sp_lrs[run.width]


def recipe_for(config: Config, run: Run) -> Recipe:
    return RECIPES[run.precision]


def build(config: Config, run: Run) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The run's model (quantised as its precision says; it has ``loss(batch)``)
    and its optimizer, built on the quantised copy's parameters."""
    model: nn.Module
    if run.model == SP:
        model = make_model(SP, run.width, config.layers, run.seed)
    elif run.model == UMUP:
        torch.manual_seed(run.seed)
        model = uu.TransformerDecoder(
            run.width,
            VOCAB_SIZE,
            config.layers,
            run.width // HEAD_SIZE,
            **uu.RECOMMENDED.multipliers,
        )
    else:
        torch.manual_seed(run.seed)
        llama = hf_model(
            "llama",
            hidden_size=run.width,
            intermediate_size=config.llama_intermediate,
            num_hidden_layers=config.layers,
            num_attention_heads=config.llama_heads,
            num_key_value_heads=config.llama_heads,
            vocab_size=VOCAB_SIZE,
            # a batch row holds seq_len + 1 tokens (inputs and the last target)
            max_position_embeddings=config.seq_len + 1,
            use_cache=False,
        )
        model = unit_scale(llama, residual_scaling="u-μP")
    if run.precision == "FP8":
        model = simulate_fp8(model)
    elif run.precision != "FP32":
        model = simulate_format(model, recipe_for(config, run))
    optimizer = make_optimizer(run.parametrisation, model, learning_rate(config, run))
    if run.model == LLAMA:
        model = LanguageModel(model)
    return model, optimizer


def train_run(task: tuple[Config, Run]) -> dict[str, Any]:
    """Train one run, save it as JSON in ``config.runs``, and return what was
    saved."""
    config, run = task
    model, optimizer = build(config, run)
    corpus = Corpus()
    warmup = min(config.warmup, config.steps)
    # When each step began: the loop asks the schedule then, once per
    # parameter group (u-μP's optimizers have several).
    began: dict[int, float] = {}

    def schedule(step: int) -> float:
        began.setdefault(step, time.perf_counter())
        return warmup_cosine(step, config.steps, warmup)

    history = training.train(
        model,
        model.loss,  # type: ignore[arg-type]
        optimizer,
        iter(corpus.batches("train", config.batch_size, config.seq_len, seed=run.seed)),
        config.steps,
        validation_set(corpus, config.val_batches, config.batch_size, config.seq_len),
        config.eval_every,
        progress=False,
        schedule=schedule,
    )
    # Step s ran from began[s] to began[s + 1], plus a validation if it was an
    # evaluation step (left out); the first step also compiles the
    # quantisation kernels (reported apart). The last step is not timed.
    took = {s: began[s + 1] - began[s] for s in began if s + 1 in began}
    steady = [
        t
        for s, t in took.items()
        if s > 1 and not (config.eval_every and s % config.eval_every == 0)
    ]
    result = {
        "name": run.name(config),
        "run": asdict(run),
        "settings": run_settings(config, run),
        "curve": {
            "train_loss": history.train_loss,
            "eval_steps": history.eval_steps,
            "val_loss": history.validation_loss,
            "seconds": history.seconds,
        },
        "first_step_seconds": took.get(1, math.nan),
        "step_seconds": statistics.median(steady) if steady else math.nan,
    }
    config.runs.mkdir(parents=True, exist_ok=True)
    (config.runs / f"{run.slug}.json").write_text(json.dumps(result, indent=1))
    return result


def load(config: Config, run: Run) -> dict[str, Any] | None:
    """The saved run, if saved with this config's settings."""
    path = config.runs / f"{run.slug}.json"
    if not path.exists():
        return None
    result: dict[str, Any] = json.loads(path.read_text())
    if result["settings"] != json.loads(json.dumps(run_settings(config, run))):
        return None
    return result


def saved_runs(config: Config) -> list[Run]:
    if not config.runs.exists():
        return []
    runs = []
    for path in sorted(config.runs.glob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and "run" in data:
            runs.append(Run(**data["run"]))
    return runs


SESSIONS = "sessions.json"


def common_settings(config: Config) -> dict[str, Any]:
    return {
        k: getattr(config, k)
        for k in ("steps", "batch_size", "seq_len", "warmup", "eval_every")
    }


def record_session(
    config: Config, trained: list[str], seconds: float, jobs: int
) -> None:
    path = config.runs / SESSIONS
    sessions = json.loads(path.read_text()) if path.exists() else []
    sessions.append(
        {
            "settings": common_settings(config),
            "trained": trained,
            "note": timing_note(seconds, jobs),
        }
    )
    config.runs.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(sessions, indent=1))


def sessions(config: Config) -> list[dict[str, Any]]:
    path = config.runs / SESSIONS
    if not path.exists():
        return []
    wanted = json.loads(json.dumps(common_settings(config)))
    return [s for s in json.loads(path.read_text()) if s["settings"] == wanted]


# --- Numbers for the page ---


class Results:
    """The saved runs of the plan, by run, with the comparisons the page makes."""

    def __init__(self, config: Config, cells: dict[str, list[Run]]) -> None:
        self.config = config
        self.cells = cells
        self.runs: dict[Run, dict[str, Any]] = {}
        for runs in cells.values():
            for run in runs:
                for r in (run, run.reference()):
                    found = load(config, r)
                    if found is not None:
                        self.runs[r] = found

    def curve(self, run: Run) -> Curve | None:
        found = self.runs.get(run)
        if found is None:
            return None
        c = found["curve"]
        return Curve(c["train_loss"], c["eval_steps"], c["val_loss"], c["seconds"])

    def loss(self, run: Run) -> float | None:
        """The final validation loss; NaN if diverged; None if not run."""
        curve = self.curve(run)
        return None if curve is None else curve.final_val

    def gap(self, run: Run, to: Run | None = None) -> float | None:
        """Relative difference of the final loss to ``to``'s (default: the FP32
        run of the same model, width and seed)."""
        loss, ref = self.loss(run), self.loss(to or run.reference())
        if loss is None or ref is None:
            return None
        return (loss - ref) / ref

    def seeds(self, run: Run) -> dict[int, float]:
        """Final loss by seed of ``run`` at every seed run."""
        seeds = {self.config.seed, *self.config.extra_seeds}
        seeds |= {r.seed for r in self.runs if r.base == run.base}
        out = {}
        for s in sorted(seeds):
            loss = self.loss(dataclasses.replace(run, seed=s))
            if loss is not None and math.isfinite(loss):
                out[s] = loss
        return out

    def spread(self, run: Run) -> float | None:
        """The run-to-run spread: (max - min) / mean of the final loss over
        seeds, if at least two seeds were run."""
        losses = list(self.seeds(run).values())
        if len(losses) < 2:
            return None
        return (max(losses) - min(losses)) / statistics.mean(losses)

    def seeded(self) -> list[Run]:
        """Seed-0 runs with at least one more seed run."""
        bases = {r.base: r for r in self.runs if r.seed != self.config.seed}
        return [
            dataclasses.replace(r, seed=self.config.seed)
            for r in bases.values()
            if self.spread(r) is not None
        ]


def pct(x: float | None, digits: int = 2) -> str:
    if x is None:
        return "not run"
    if not math.isfinite(x):
        return "diverged"
    return f"{100 * x:+.{digits}f}%"


def loss_text(x: float | None) -> str:
    if x is None:
        return "not run"
    return f"{x:.3f}" if math.isfinite(x) else "diverged"


def seconds(x: float, digits: int) -> str:
    return f"{x:.{digits}f}" if math.isfinite(x) else "-"


def cell_table(results: Results, runs: Sequence[Run]) -> str:
    config = results.config
    rows = []
    for run in runs:
        found = results.runs.get(run)
        if found is None:
            saved = (config.runs / f"{run.slug}.json").exists()
            status = "saved with other settings" if saved else "not run"
            rows.append((run.name(config), status, "", "", "", ""))
            continue
        rows.append(
            (
                run.name(config),
                loss_text(results.loss(run)),
                ""
                if run.precision == "FP32"
                else pct(results.gap(run))
                if results.loss(run.reference()) is not None
                else f"no FP32 run at seed {run.seed}",
                f"{found['curve']['seconds']:.0f}",
                seconds(found["step_seconds"], 2),
                seconds(found["first_step_seconds"], 1),
            )
        )
    return markdown_table(
        (
            "run",
            "final validation loss",
            "vs FP32 (same model, width, seed)",
            "seconds",
            "s/step (median)",
            "first step (s)",
        ),
        rows,
    )


def listing(items: Sequence[str]) -> str:
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def format_gaps(
    results: Results, model: str, width: int, precisions: Sequence[str]
) -> str:
    seed = results.config.seed
    return listing(
        [f"{p} {pct(results.gap(Run(model, p, width, seed)))}" for p in precisions]
    )


def gradient_errors(config: Config) -> dict[str, float]:
    """The relative change of u-μP's weight gradients at initialisation (one
    training batch, width ``config.width``) under each MXFP8 rule and FP8: the
    median over its weight tensors of ``|g_q - g| / |g|``."""
    torch.manual_seed(config.seed)
    run = Run(UMUP, "FP32", config.width, config.seed)
    model, _ = build(config, run)
    batch = next(
        iter(Corpus().batches("train", config.batch_size, config.seq_len, seed=0))
    )

    def grads(m: nn.Module) -> dict[str, Tensor]:
        m.zero_grad()
        m.loss(batch).backward()  # type: ignore[operator]
        return {
            k: p.grad.clone() for k, p in m.named_parameters() if p.grad is not None
        }

    exact = grads(model)
    variants = {
        "MXFP8": lambda m: simulate_format(m, MXFP8_RECIPE),
        "MXFP8 floor": lambda m: simulate_format(m, RECIPES["MXFP8 floor"]),
        "FP8": simulate_fp8,
    }
    out = {}
    for name, make in variants.items():
        found = grads(make(model))
        out[name] = statistics.median(
            ((found[k] - g).norm() / g.norm()).item() for k, g in exact.items()
        )
    return out


def floor_text(results: Results) -> str:
    """The OCP floor rule against the round-up rule, from the numbers."""
    config = results.config
    w, seed = config.width, config.seed
    rows, worse, better = [], [], []
    for p in PARAMETRISATIONS:
        for f, (floor_name, up_name) in RULE_PAIRS.items():
            floor, up = Run(p, floor_name, w, seed), Run(p, up_name, w, seed)
            gf, gu = results.gap(floor), results.gap(up)
            if gf is None or gu is None:
                continue
            rows.append(f"{p} {f}: floor {pct(gf)}, round-up {pct(gu)}")
            (worse if gf > gu else better).append(f"{p} {f}")
    if not rows:
        return "The floor-rule runs have not been run."
    verdicts = []
    for f in ("MXFP8", "MXFP4"):
        f_worse = [r for r in worse if r.endswith(f)]
        f_better = [r for r in better if r.endswith(f)]
        if f_worse and not f_better:
            verdicts.append(f"in {f} the round-up rule beats the floor rule")
        elif f_better and not f_worse:
            verdicts.append(f"in {f} the floor rule beats the round-up rule")
        elif f_worse or f_better:
            verdicts.append(f"in {f} neither rule wins in both parametrisations")
    text = (
        f"**At width {w}, {listing(verdicts)}.** Gap to FP32 with the OCP floor "
        "rule and with the round-up rule: " + "; ".join(rows) + "."
    )
    errors = gradient_errors(config)
    text += (
        " The floor rule picks the scale 2^(⌊log2 amax⌋ − e_max), so a block whose "
        "largest magnitude has a mantissa above the element's largest (1.75 for "
        "E4M3, 1.5 for E2M1) has that element clipped, by up to 12.5% in E4M3 and "
        "25% in E2M1; the round-up rule never clips but can leave the top of the "
        "element's range unused, which costs E2M1 (one mantissa bit) up to a "
        "binade of resolution. In training the clipping is systematic, not noise: "
        "the gradient of the cross-entropy loss has, in each row, its largest "
        "element at the target, p − 1, just below 1 in magnitude, with a mantissa "
        "above 1.75, so the floor rule shrinks it in every row. At initialisation "
        f"(u-μP, width {w}, one batch) the weight gradients change by "
        f"{errors['MXFP8 floor']:.1%} (median over the weights) in MXFP8 with "
        f"the floor rule, {errors['MXFP8']:.1%} with the round-up rule and "
        f"{errors['FP8']:.1%} in per-tensor FP8."
    )
    return text


def result_text(results: Results) -> str:
    """The result of cell (a): each format's gap, and u-μP against SP."""
    config = results.config
    w, seed = config.width, config.seed
    formats = ("FP8", "MXFP8", "MXFP4", "NVFP4")
    lines = []
    for p in PARAMETRISATIONS:
        ref = results.loss(Run(p, "FP32", w, seed))
        lines.append(
            f"{p} (FP32 {loss_text(ref)}): {format_gaps(results, p, w, formats)}"
        )
    head = (
        f"**Result at width {w}: final validation loss against FP32 of the same "
        f"parametrisation: {'; '.join(lines)}.**"
    )
    both = {
        f: (results.gap(Run(UMUP, f, w, seed)), results.gap(Run(SP, f, w, seed)))
        for f in formats
    }
    both = {f: g for f, g in both.items() if None not in g}
    if not both:
        ran = any(results.loss(r) is not None for r in results.cells["a"])
        return head if ran else "**Result: cell (a) has not been run.**"

    def worse(u: float | None, s: float | None) -> bool:
        assert u is not None and s is not None
        return not math.isfinite(u) or (math.isfinite(s) and u > s)

    umup_better = [f for f, (u, s) in both.items() if not worse(u, s)]
    sp_better = [f for f in both if f not in umup_better]
    text = (
        f" u-μP loses less to its FP32 run than SP does in {len(umup_better)} of "
        f"the {len(both)} formats run"
    )
    if umup_better and sp_better:
        text += f" ({listing(umup_better)}; SP loses less in {listing(sp_better)})"
    elif umup_better:
        text += f" ({listing(umup_better)})"
    else:
        text += f" (SP loses less in {listing(sp_better)})"
    text += "."
    spreads = {r: results.spread(r) for r in results.seeded()}
    spreads = {r: x for r, x in spreads.items() if x is not None}
    if spreads:
        widest = max(spreads, key=lambda r: spreads[r])
        text += (
            " Gaps that differ by less than the run-to-run spread are noise: "
            f"{pct(spreads[widest]).lstrip('+')} of the final loss at the widest "
            f"of the {len(spreads)} run(s) repeated with other seeds "
            f"({widest.base}; cell e)."
        )
    else:
        text += (
            " No run has been repeated with other seeds (cell e), so the "
            "run-to-run spread against which to read these differences is not "
            "measured here."
        )
    mx = [f for f in ("MXFP8", "MXFP4") if f in both]
    if mx:
        text += (
            " MX scales are powers of two, so u-μP against SP in MX formats compares "
            "parametrisations, not scaling: multiplying a tensor by any power of two "
            "changes only its blocks' E8M0 scales, never the elements they quantise "
            "(within E8M0's range of 2^±127). There the gaps are "
            + listing(
                [
                    f"{pct(both[f][0])} (u-μP) and {pct(both[f][1])} (SP) in {f}"
                    for f in mx
                ]
            )
            + "."
        )
    if "NVFP4" in both:
        text += (
            " NVFP4 with each tensor's current amax is scale-invariant too (its "
            "per-tensor scale maps the tensor's amax to 448·6 whatever the amax is), "
            f"and there u-μP's gap is {pct(both['NVFP4'][0])} and SP's "
            f"{pct(both['NVFP4'][1])}; per-tensor FP8 without scaling is not "
            f"(u-μP {pct(both['FP8'][0]) if 'FP8' in both else 'not run'}, SP "
            f"{pct(both['FP8'][1]) if 'FP8' in both else 'not run'})."
        )
    return head + text


@dataclass(frozen=True)
class Comparison:
    """Static minus amax scales: the relative difference of the final losses,
    how it compares with the run-to-run spread (``verdict``: "within",
    "beyond", "unmeasured", "diverged" or "not run") and a clause saying so."""

    diff: float | None
    verdict: str
    clause: str


def compare_to_spread(results: Results, static: Run, amax: Run) -> Comparison:
    """``static`` against ``amax`` (means over common seeds if both have
    several), against the run-to-run spread: that of these two runs if measured,
    else the widest measured on any run."""
    config = results.config
    a, b = results.seeds(static), results.seeds(amax)
    common = sorted(set(a) & set(b))
    if len(common) >= 2:
        mean_a = statistics.mean(a[s] for s in common)
        mean_b = statistics.mean(b[s] for s in common)
        diff = (mean_a - mean_b) / mean_b
        measured = f"mean over seeds {', '.join(map(str, common))}"
    else:
        loss_a, loss_b = results.loss(static), results.loss(amax)
        if loss_a is None or loss_b is None:
            return Comparison(None, "not run", "not run")
        if not math.isfinite(loss_a * loss_b):
            return Comparison(math.nan, "diverged", "not comparable: a run diverged")
        diff = (loss_a - loss_b) / loss_b
        measured = f"seed {config.seed}"
    spreads = {r: results.spread(r) for r in (static, amax)}
    spreads = {r: s for r, s in spreads.items() if s is not None}
    if spreads:
        spread = max(spreads.values())
        where = "of " + listing([r.base for r in spreads])
    else:
        others = {r: results.spread(r) for r in results.seeded()}
        others = {r: s for r, s in others.items() if s is not None}
        if not others:
            return Comparison(
                diff, "unmeasured", f"{pct(diff)} ({measured}; spread not measured)"
            )
        widest = max(others, key=lambda r: others[r])
        spread = others[widest]
        where = (
            f"of {widest.base}, the widest of the {len(others)} runs repeated "
            "with other seeds"
            if len(others) > 1
            else f"of {widest.base}, the only run repeated with other seeds"
        )
    verdict = "within" if abs(diff) <= spread else "beyond"
    return Comparison(
        diff,
        verdict,
        f"{pct(diff)} ({measured}), {verdict} the run-to-run spread of "
        f"{pct(spread).lstrip('+')} ((max − min)/mean over seeds {where})",
    )


def static_text(results: Results) -> str:
    """Section (b): can u-μP's NVFP4 use one static per-tensor scale?"""
    config = results.config
    w, seed = config.width, config.seed

    def runs(model: str, width: int) -> tuple[Run, Run]:
        return Run(model, STATIC, width, seed), Run(model, "NVFP4", width, seed)

    def describe(model: str, width: int) -> str:
        static, amax = runs(model, width)
        return (
            f"{loss_text(results.loss(static))} ({pct(results.gap(static))} from "
            f"FP32) against {loss_text(results.loss(amax))} "
            f"({pct(results.gap(amax))}) with each tensor's current amax"
        )

    parts = []
    umup = compare_to_spread(results, *runs(UMUP, w))
    if umup.diff is not None:
        parts.append(
            f"At width {w}, u-μP in NVFP4 with the static per-tensor scale ends "
            f"{describe(UMUP, w)}: static minus amax scales is {umup.clause}."
        )
    sp = compare_to_spread(results, *runs(SP, w))
    if sp.diff is not None:
        parts.append(
            f"SP with the same static scale ends {describe(SP, w)}: {sp.clause}."
        )
        if umup.diff is None:
            pass
        elif sp.verdict == "diverged" and umup.verdict != "diverged":
            parts.append("With the static scale SP diverged and u-μP did not.")
        elif math.isfinite(sp.diff) and math.isfinite(umup.diff):
            if sp.diff > umup.diff:
                parts.append(
                    f"The static scale costs SP {100 * (sp.diff - umup.diff):.2f} "
                    "percentage points more than it costs u-μP."
                )
            else:
                parts.append(
                    "The static scale costs SP no more than it costs u-μP "
                    f"({pct(sp.diff)} against {pct(umup.diff)})."
                )
    measured = [(w, umup)] if umup.diff is not None else []
    others = []
    for width in config.other_widths:
        other = compare_to_spread(results, *runs(UMUP, width))
        if other.diff is not None:
            others.append((width, other))
    if others:
        parts.append(
            "At the other widths (cell c), u-μP's static minus amax scales is "
            + "; ".join(f"at width {x}: {c.clause}" for x, c in others)
            + "."
        )
    measured = sorted(measured + others, key=lambda item: item[0])
    llama = compare_to_spread(results, *runs(LLAMA, config.llama_width))
    if llama.diff is not None:
        parts.append(
            "The `unit_scale`d Llama (cell d) ends "
            f"{describe(LLAMA, config.llama_width)}: static minus amax scales is "
            f"{llama.clause}."
        )
    compared = [(w, umup), (w, sp), *others]
    unmeasured = [(x, c) for x, c in compared if c.verdict == "unmeasured"]
    if unmeasured:
        x = unmeasured[0][0]
        parts.append(
            "No run has been repeated with other seeds, so the run-to-run spread "
            "is not measured; cell e measures it, e.g. `--cells e --seeds-for "
            f'"{UMUP} {STATIC} w{x};{UMUP} NVFP4 w{x}"`.'
        )
    return (
        "**Can u-μP drop NVFP4's per-tensor amax?** "
        + static_answer(measured)
        + ("\n\n" + " ".join(parts) if parts else "")
    )


def static_answer(measured: Sequence[tuple[int, Comparison]]) -> str:
    """The answer to cell (b)'s question, from u-μP's comparisons by width."""
    if not measured:
        return (
            "Not answered: no u-μP run with the static scale has been run beside "
            "its NVFP4 run with amax scales (cells a, b, c)."
        )
    diffs = {x: c.diff for x, c in measured if c.diff is not None}
    if any(c.verdict == "diverged" for _, c in measured):
        return "No: with the static scale a u-μP run diverged (or its amax run did)."
    widths = ("widths " if len(diffs) > 1 else "width ") + listing(
        [str(x) for x in diffs]
    )
    worst = max(diffs, key=lambda x: diffs[x])
    largest = f"{pct(diffs[worst])}" + (f" at width {worst}" if len(diffs) > 1 else "")
    worse = [str(x) for x, c in measured if c.verdict == "beyond" and diffs[x] > 0]
    if worse:
        return (
            f"Not for free: at width {listing(worse)}, u-μP with one static "
            "per-tensor scale ends worse than with amax scales by more than the "
            f"run-to-run spread (static minus amax up to {largest})."
        )
    if any(c.verdict == "unmeasured" for _, c in measured):
        return (
            f"Possibly: at {widths}, static minus amax scales is at most "
            f"{largest}"
            + (", no worse than amax scales" if diffs[worst] <= 0 else "")
            + ", but no run has been repeated with other seeds, so this page "
            "cannot say whether the difference is more than noise."
        )
    better = [str(x) for x, c in measured if c.verdict == "beyond"]
    return (
        f"Yes, on this evidence: at {widths}, u-μP with one static per-tensor "
        "scale ends within the run-to-run spread of NVFP4 with amax scales"
        + (
            f" (at width {listing(better)} lower than it by more than the spread)"
            if better
            else ""
        )
        + f": static minus amax is at most {largest}."
    )


def cell_c_text(results: Results) -> str:
    config = results.config
    seed = config.seed
    parts = []
    mx6 = [
        (p, results.gap(Run(p, "MXFP6", config.width, seed))) for p in PARAMETRISATIONS
    ]
    if all(g is not None for _, g in mx6):
        mx4 = {
            p: results.gap(Run(p, "MXFP4", config.width, seed))
            for p in PARAMETRISATIONS
        }
        mx8 = {
            p: results.gap(Run(p, "MXFP8", config.width, seed))
            for p in PARAMETRISATIONS
        }
        parts.append(
            f"MXFP6 at width {config.width}: "
            + "; ".join(
                f"{p} {pct(g)} (MXFP8 {pct(mx8[p])}, MXFP4 {pct(mx4[p])})"
                for p, g in mx6
            )
            + "."
        )
    widths = sorted({*config.other_widths, config.width})
    for p in PARAMETRISATIONS:
        found = [(x, results.gap(Run(p, "NVFP4", x, seed))) for x in widths]
        gaps = [(x, g) for x, g in found if g is not None]
        if len(gaps) < 2:
            continue
        values = [g for _, g in gaps]
        steps = [b - a for a, b in itertools.pairwise(values)]
        if not all(math.isfinite(g) for g in values):
            trend = ""
        elif all(d >= 0 for d in steps):
            trend = " (higher at each wider width)"
        elif all(d <= 0 for d in steps):
            trend = " (lower at each wider width)"
        else:
            trend = " (not monotonic in width)"
        parts.append(
            f"{p} in NVFP4 against FP32 by width: "
            + ", ".join(f"{x}: {pct(g)}" for x, g in gaps)
            + trend
            + "."
        )
    return " ".join(parts) or "Cell (c) has not been run."


def cell_d_text(results: Results) -> str:
    config = results.config
    runs = [
        Run(LLAMA, p, config.llama_width, config.seed)
        for p in ("MXFP8", "NVFP4", STATIC)
    ]
    ref = results.loss(runs[0].reference())
    if ref is None or all(results.loss(r) is None for r in runs):
        return "Cell (d) has not been run."
    return (
        f"The `unit_scale`d Llama ends at {loss_text(ref)} in FP32; against it, "
        + listing([f"{r.precision} {pct(results.gap(r))}" for r in runs])
        + "."
    )


def seeds_table(results: Results, runs: Sequence[Run]) -> str:
    config = results.config
    bases = list(dict.fromkeys(dataclasses.replace(r, seed=config.seed) for r in runs))
    all_seeds = sorted({config.seed, *config.extra_seeds, *(r.seed for r in runs)})
    rows = []
    for base in bases:
        losses = results.seeds(base)
        cells = [
            loss_text(results.loss(dataclasses.replace(base, seed=s)))
            for s in all_seeds
        ]
        spread = results.spread(base)
        rows.append(
            (
                base.base,
                *cells,
                f"{statistics.mean(losses.values()):.3f}" if losses else "",
                pct(spread).lstrip("+") if spread is not None else "",
            )
        )
    return markdown_table(
        ("run", *(f"seed {s}" for s in all_seeds), "mean", "spread (max − min)/mean"),
        rows,
    )


def bullets(items: Iterable[str], width: int = 88) -> str:
    """A markdown list, each item wrapped (``reflow`` leaves lists alone)."""
    return "\n".join(
        textwrap.fill(
            " ".join(item.split()),
            width,
            initial_indent="- ",
            subsequent_indent="  ",
            break_long_words=False,
            break_on_hyphens=False,
        )
        for item in items
    )


def precision_list(config: Config) -> str:
    """What each precision quantises, from the recipes' docstrings."""
    nvfp4 = NVFP4_RECIPE
    blocks = math.ceil(nvfp4.high_precision_last * config.layers)
    return bullets(
        [
            "**FP8**: `simulate_fp8`, one format per tensor and no scaling: the "
            "inputs of every matrix product (linear layers, the readout, attention) "
            "rounded to E4M3 (max 448) and their gradients to E5M2.",
            "**MXFP8** (`MXFP8_RECIPE`): E4M3 elements for every operand of every "
            "product's three GEMMs, gradients included, in blocks of 32 along each "
            "GEMM's contraction, each block with a power-of-two (E8M0) scale "
            "(Transformer Engine's MXFP8 default).",
            "**MXFP6** (`MXFP6_RECIPE`): E2M3 weights and activations, E3M2 "
            "incoming gradients (more range for their heavier tails), blocks of 32, "
            "E8M0 scales, every product.",
            "**MXFP4** (`MXFP4_RECIPE`): E2M1 for every operand of every product, "
            "blocks of 32, E8M0 scales.",
            "Scale rules: the MXFP8 and MXFP6 recipes take NVIDIA's round-up rule "
            "(`rceil`: the scale is the power of two at or above amax / max, so no "
            "element saturates), the MXFP4 recipe the OCP specification's floor "
            "rule (floor(log2 amax) minus the element's largest exponent, which "
            "clips a block's largest element when its mantissa exceeds the "
            "element's largest: 1.75 for E4M3, 1.5 for E2M1). **MXFP8 floor** and "
            "**MXFP4 round-up** swap the rule "
            "(`recipe_with_rule(recipe, rule)`).",
            "**NVFP4** (`NVFP4_RECIPE`, NVIDIA's pre-training recipe): E2M1 in "
            "blocks of 16 with E4M3 block scales under an FP32 per-tensor scale "
            "from each tensor's current amax, for linear layers only; weights in "
            "16×16 tiles, activations and gradients in 1×16 blocks; stochastic "
            "rounding for gradients; a random 16×16 Hadamard transform on the "
            "weight-gradient GEMM's inputs. Attention, the output head "
            "(`high_precision_head`: SP's `projection`, the Llama's `lm_head`; "
            "u-μP's readout is not a linear product), and the linear layers "
            f"of the last {nvfp4.high_precision_last:.0%} of the blocks, rounded "
            f"up ({blocks} of {config.layers} here), stay in high precision.",
            f"**NVFP4 static**: the same with `tensor_amax={STATIC_AMAX:g}`: the "
            "per-tensor scale is fixed once instead of following each tensor's "
            "amax, so each E4M3 block scale is the block's amax itself: blocks "
            "whose amax lies between E4M3's smallest subnormal 2^-9 and 448 are "
            "represented, smaller ones lose precision and flush to zero (below "
            "about 2^-10), larger ones saturate. u-μP aims to keep every tensor "
            "near unit scale; SP's gradients are far smaller (`fp8_training.md`).",
        ]
    )


def recipe_table(config: Config) -> str:
    def pair(formats: tuple[Any, Any]) -> str:
        return " × ".join(str(f) if f is not None else "high" for f in formats)

    rows = []
    for name, recipe in RECIPES.items():
        kept = [f"`{k}`" for k in recipe.high_precision]
        if recipe.high_precision_head:
            kept.append("the output head")
        if recipe.high_precision_last:
            blocks = math.ceil(recipe.high_precision_last * config.layers)
            kept.append(
                f"last {recipe.high_precision_last:.0%} of blocks ({blocks} of "
                f"{config.layers})"
            )
        rows.append(
            (
                name,
                pair(recipe.forward),
                pair(recipe.grad_input),
                pair(recipe.grad_weight),
                ", ".join(sorted(recipe.products)),
                "yes" if recipe.hadamard else "no",
                "current amax"
                if recipe.tensor_amax is None
                else f"static (amax {recipe.tensor_amax:g})",
                ", ".join(kept) or "-",
            )
        )
    return markdown_table(
        (
            "recipe",
            "forward x × W",
            "input grad ∂y × W",
            "weight grad ∂y × x",
            "products",
            "Hadamard",
            "NVFP4 tensor scale",
            "kept in high precision",
        ),
        rows,
    )


# --- Outputs ---

COLOURS = {
    "FP32": "black",
    "FP8": "tab:grey",
    "MXFP8": "tab:blue",
    "MXFP6": "tab:cyan",
    "MXFP4": "tab:orange",
    "NVFP4": "tab:green",
    STATIC: "tab:green",
    "MXFP8 floor": "tab:blue",
    "MXFP4 round-up": "tab:orange",
}


def plot(results: Results, path: Path) -> None:
    """Validation loss of cells (a) and (b): one column per parametrisation, the
    second row zoomed on the second half of training."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    config = results.config
    w, seed = config.width, config.seed
    fig, axes = plt.subplots(2, 2, figsize=(13, 9.5))
    for column, p in enumerate(PARAMETRISATIONS):
        ax, zoom = axes[0, column], axes[1, column]
        drawn = []
        for precision in (
            "FP32",
            "FP8",
            "MXFP8",
            "MXFP4",
            "NVFP4",
            STATIC,
            "MXFP8 floor",
            "MXFP4 round-up",
        ):
            run = Run(p, precision, w, seed)
            curve = results.curve(run)
            if curve is None:
                continue
            steps = curve.eval_steps[: len(curve.val_loss)]
            gap = "" if precision == "FP32" else f" ({pct(results.gap(run), 1)})"
            style = dict(
                color=COLOURS[precision],
                linestyle=(
                    "--"
                    if precision == STATIC
                    else ":"
                    if precision in ("MXFP8 floor", "MXFP4 round-up")
                    else "-"
                ),
                linewidth=2.2 if precision == "FP32" else 1.6,
            )
            ax.plot(
                steps,
                curve.val_loss,
                label=f"{precision}: {loss_text(curve.final_val)}{gap}",
                **style,
            )
            zoom.plot(steps, curve.val_loss, **style)
            drawn.append(curve)
        ax.set_title(f"{p}, width {w}")
        zoom.set_title(f"{p}, width {w}: second half")
        if not drawn:
            for a in (ax, zoom):
                a.text(
                    0.5, 0.5, "not run", ha="center", va="center", transform=a.transAxes
                )
            continue
        finite = [v for c in drawn for v in c.val_loss if math.isfinite(v)]
        best = min(finite)
        # the top: the first evaluation after step 0 (step 0's loss, ln 256, is
        # off the chart), or step 0's in a run too short to have one
        early = [c.val_loss[1 if len(c.val_loss) > 2 else 0] for c in drawn]
        top = min(max([v for v in early if math.isfinite(v)] or [best + 1]), 6.0)
        ax.set_ylim(best - 0.1, max(top, best + 0.2))
        half = config.steps / 2
        late = [
            v
            for c in drawn
            for s, v in zip(c.eval_steps, c.val_loss, strict=False)
            if s >= half and math.isfinite(v)
        ]
        if late:
            lo, hi = min(late), min(max(late), 1.15 * min(late))
            margin = 0.05 * (hi - lo) + 0.005
            zoom.set_ylim(lo - margin, hi + margin)
        zoom.set_xlim(half, config.steps * 1.02)
        ax.legend(
            title="final validation loss (vs FP32)",
            loc="upper right",
            fontsize=9,
            title_fontsize=9,
        )
        for a in (ax, zoom):
            a.set_xlabel("optimizer step")
            a.set_ylabel("validation loss (nats per byte)")
            a.grid(alpha=0.3)
    fig.suptitle(
        f"Block-scaled formats: validation loss, {config.steps} steps of "
        f"{config.batch_size}×{config.seq_len} tokens (dashed: NVFP4 with a static "
        "per-tensor scale; dotted: MX with the other scale rule)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def page(results: Results, command: str) -> str:
    config = results.config
    w = config.width
    lr_sp = ", ".join(
        f"2^{math.log2(config.sp_lrs[x]):g} at width {x}"
        for x in sorted({w, *config.other_widths})
    )
    notes = sessions(config)
    if notes:
        timing = (
            f"Trained in {len(notes)} session(s) of this script: "
            + "; ".join(f"{len(s['trained'])} run(s) in {s['note']}" for s in notes)
            + "."
        )
    else:
        timing = "No training session with these settings is recorded."
    sections = []
    for cell in "abcd":
        title = CELL_TITLES[cell].format(width=w)
        body = [f"## {title}", cell_table(results, results.cells[cell])]
        if cell == "a":
            body.append("![validation loss of cells (a) and (b)](block_formats.png)")
            body.append("### The OCP floor scale rule")
            body.append(floor_text(results))
        if cell == "b":
            body[0] = "## Static per-tensor NVFP4 scales"
            body.insert(
                1,
                f"Cell (b): u-μP and SP at width {w} in NVFP4 with "
                f"`tensor_amax={STATIC_AMAX:g}` (one static per-tensor scale), "
                "against the same models in NVFP4 with each tensor's current amax "
                "(cell a).",
            )
            body.append(static_text(results))
        if cell == "c":
            body.append(cell_c_text(results))
        if cell == "d":
            body.append(cell_d_text(results))
        sections.append("\n\n".join(body))
    e_runs = results.cells["e"]
    if e_runs:
        sections.append(
            "\n\n".join(
                [
                    f"## {CELL_TITLES['e']}",
                    cell_table(results, e_runs),
                    "Final validation loss by seed (each seed changes the "
                    "initialisation and the order of the training batches; the "
                    "validation set is fixed):",
                    seeds_table(results, e_runs),
                ]
            )
        )
    else:
        sections.append(
            f"## {CELL_TITLES['e']}\n\nNot run: no run named by `--seeds-for`."
        )
    settings = "\n".join(
        f"- {k}: {v if v != '' else '(none)'}"
        for k, v in asdict(config).items()
        if k not in ("fresh", "render_only", "runs", "cells")
    )
    text = f"""# Block-scaled formats

`{command}` trains the demo's decoder ({config.layers} layers, head size
{HEAD_SIZE}, byte tokens of the built-in corpus) for {config.steps} AdamW steps of
{config.batch_size}×{config.seq_len} tokens ({config.warmup} warmup steps, then
cosine decay to 10%), in the standard parametrisation (SP: GPT-2 init,
`torch.optim.AdamW` without weight decay, lr {lr_sp}: each width's optimum in
`lr_transfer.md`, found there over 200 steps) and in u-μP (`uu.TransformerDecoder`
with `uu.RECOMMENDED.multipliers`, `uu.optim.AdamW` at `uu.RECOMMENDED.lr` =
{uu.RECOMMENDED.lr:g}), in FP32, in per-tensor FP8 and under the block-format
recipes of `unit_scaling.formats`. Cell (d) trains a Llama-style model
(`transformers.LlamaForCausalLM`, width {config.llama_width}, {config.layers}
layers, {config.llama_heads} heads, MLP {config.llama_intermediate}) made u-μP by
`unit_scale(model, residual_scaling="u-μP")`, with `uu.optim.AdamW` at
`uu.RECOMMENDED.unit_scale_lr` = {uu.RECOMMENDED.unit_scale_lr:g}. Every run starts
from seed {config.seed} (cell e: other seeds) and reads the same batches; the
validation loss is the mean over a fixed set of {config.val_batches} batches,
measured every {config.eval_every} steps with the model's own quantisation.

What each precision quantises (`simulate_format(model, recipe)` applies a recipe
to a copy of the model, and the optimizer is built on the copy's FP32 weights):

{precision_list(config)}

{recipe_table(config)}

{timing}

{result_text(results)}

{chr(10).join(chr(10) + s + chr(10) for s in sections)}

## Settings

{settings}
"""
    return reflow(text)


def main(argv: list[str] | None = None) -> None:
    parser = run_parser(__doc__.split("\n")[0])
    for action in parser._actions:  # two runs at a time unless told otherwise
        if action.dest == "jobs":
            action.default = 2
            action.help = "runs in parallel, one thread each (default: 2)"
    config, args = parse_config(Config, argv, parser=parser)
    torch.set_num_threads(1)
    cells = plan(config, saved_runs(config))
    if not config.render_only:
        todo = list(
            dict.fromkeys(
                run
                for cell in config.chosen
                for run in cells[cell]
                if config.fresh or load(config, run) is None
            )
        )
        if todo:
            start = time.perf_counter()
            run_all(
                train_run,
                [(config, run) for run in todo],
                args.jobs,
                lambda task, r: (
                    f"{r['name']}: validation loss {r['curve']['val_loss'][-1]:.3f} "
                    f"({r['curve']['seconds']:.0f} s, {r['step_seconds']:.2f} s/step)"
                ),
            )
            record_session(
                config,
                [run.name(config) for run in todo],
                time.perf_counter() - start,
                args.jobs,
            )
        else:
            print("every chosen run is saved already (--fresh trains them again)")
    results = Results(config, plan(config, saved_runs(config)))
    args.out.mkdir(parents=True, exist_ok=True)
    plot(results, args.out / "block_formats.png")
    text = page(results, "python experiments/block_formats.py")
    (args.out / "block_formats.md").write_text(text)
    print(text)
    print(f"wrote {args.out}/block_formats.md and block_formats.png")


if __name__ == "__main__":
    main(sys.argv[1:])
