"""Scales during training: what the monitor sees over 2,000 steps.

Trains the demo's decoder (2 layers, head size 32, byte tokens of the built-in
corpus, batch 16 × 64) at widths 128 and 512, in the standard parametrisation
(SP: GPT-2 init, ``torch.optim.AdamW``, lr 2^-8) and in u-μP
(``uu.TransformerDecoder`` with ``uu.RECOMMENDED``'s multipliers and learning
rate), each in FP32 and in simulated FP8 (``simulate_fp8``), with a
:class:`unit_scaling.monitor.Monitor` recording every 50 steps; and a
``unit_scale``d Llama-style model (width 128, 2 layers) under
``UnitScalingTrainer`` with ``MonitorCallback``. For each run it reports how far
each kind of tensor drifts from unit scale, which tensors would saturate or
flush to zero in E4M3 and E5M2 with static scales (scale 1) and from which step,
and what the monitor warned. Writes ``scales_during_training.md`` and its PNGs
to ``--out`` (default ``docs/results/``), and each run's table to
``out/scales_during_training/``::

    .venv/bin/python experiments/scales_during_training.py
    .venv/bin/python experiments/scales_during_training.py --steps 200 --widths 128
"""

from __future__ import annotations

import json
import logging
import math
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from _common import markdown_table, reflow, run_all, run_parser, timing_note, train

import unit_scaling as uu
from unit_scaling.app.baseline import StandardTransformerDecoder
from unit_scaling.data import VOCAB_SIZE, Corpus
from unit_scaling.monitor import Monitor
from unit_scaling.transforms import simulate_fp8

ROOT = Path(__file__).resolve().parents[1]
TABLES = ROOT / "out" / "scales_during_training"
LAYERS, HEAD_SIZE, BATCH, SEQ = 2, 32, 16, 64
SP_LR = 2**-8
EVERY = 50
KINDS = ("activation", "activation_grad", "weight", "weight_grad", "update")
SATURATED, FLUSHED = 1e-4, 0.05  # the monitor's default alert thresholds


def _run(task: tuple[int, str, str, int]) -> dict[str, Any]:
    width, parametrisation, precision, steps = task
    torch.manual_seed(0)
    heads = width // HEAD_SIZE
    model: torch.nn.Module
    if parametrisation == "u-μP":
        model = uu.TransformerDecoder(
            width, VOCAB_SIZE, LAYERS, heads, **uu.RECOMMENDED.multipliers
        )
    else:
        model = StandardTransformerDecoder(width, VOCAB_SIZE, LAYERS, heads)
    if precision == "FP8":
        model = simulate_fp8(model)  # a copy: the optimizer must see its weights
    optimizer: torch.optim.Optimizer
    if parametrisation == "u-μP":
        optimizer = uu.optim.AdamW(model.parameters(), lr=uu.RECOMMENDED.lr)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=SP_LR, weight_decay=0.0)
    alerts: list[str] = []
    handler = _Collect(alerts)
    logging.getLogger("unit_scaling.monitor").addHandler(handler)
    monitor = Monitor(model, every=EVERY, optimizer=optimizer)
    corpus = Corpus()
    validation = [
        corpus.get_batch("validation", BATCH, SEQ, generator=i) for i in range(4)
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        curve = train(
            model,
            optimizer,
            corpus.batches("train", BATCH, SEQ, seed=0),
            steps,
            validation,
        )
    logging.getLogger("unit_scaling.monitor").removeHandler(handler)
    table = monitor.table()
    _save(f"{parametrisation} {precision} w{width}", table, alerts, curve.final_val)
    return {
        "table": table,
        "alerts": alerts,
        "loss": curve.final_val,
        "seconds": curve.seconds,
    }


class _Collect(logging.Handler):
    def __init__(self, into: list[str]) -> None:
        super().__init__()
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record.getMessage())


TRAINER_RUN = "unit_scale Llama, UnitScalingTrainer w128"


def _slug(name: str) -> str:
    return name.replace("μ", "mu").replace(",", "").replace(" ", "_")


def _save(name: str, table: pd.DataFrame, alerts: list[str], loss: float) -> None:
    """A run's table and what the page needs besides, to render it again."""
    TABLES.mkdir(parents=True, exist_ok=True)
    table.to_csv(TABLES / f"{_slug(name)}.csv.gz", index=False)
    (TABLES / f"{_slug(name)}.json").write_text(
        json.dumps({"name": name, "alerts": alerts, "loss": loss})
    )


def _saved() -> dict[str, dict[str, Any]]:
    """Every saved run, by name (``--render-only``)."""
    results = {}
    for path in sorted(TABLES.glob("*.json")):
        run = json.loads(path.read_text())
        table = pd.read_csv(path.with_suffix(".csv.gz"))
        results[run["name"]] = {**run, "table": table}
    return results


def _drift(table: pd.DataFrame) -> dict[str, str]:
    """Per kind: the median |log2 RMS| at the last record, and the median and
    largest change of log2 RMS from the first record to the last, over the
    tensors whose RMS is not 0 at either (those are counted apart)."""
    rows = table[table.statistic == "log2_rms"]
    first, last = rows.step.min(), rows.step.max()
    out = {}
    for kind in KINDS:
        k = rows[rows.kind == kind].pivot_table(
            index="tensor", columns="step", values="value"
        )
        if k.empty:
            continue
        ends = k[sorted({first, last})].replace(-math.inf, math.nan)
        zero = int(ends.isna().any(axis=1).sum())
        ends = ends.dropna()
        change = (ends[last] - ends[first]).abs()
        text = (
            f"{ends[last].abs().median():.2f} / {change.median():.2f} / "
            f"{change.max():.2f}"
            if len(ends)
            else "-"
        )
        out[kind] = text + (f" ({zero} at 0)" if zero else "")
    return out


# The usual FP8 recipe: values forward in E4M3, gradients in E5M2.
CASTS = {"e4m3": ("activation", "weight"), "e5m2": ("activation_grad", "weight_grad")}


def _worst(table: pd.DataFrame, statistic: str, limit: float) -> str:
    """The largest value of ``statistic`` (``<format>_<what>``) over the tensors
    the recipe casts to that format, and the first step and tensor where it
    crossed ``limit``."""
    kinds = CASTS[statistic.split("_")[0]]
    rows = table[(table.statistic == statistic) & table.kind.isin(kinds)]
    if rows.empty:
        return "-"
    top = rows.loc[rows.value.idxmax()]
    text = f"{top.value:.2%} ({top.tensor}, {top.kind}, step {top.step})"
    over = rows[rows.value > limit].sort_values("step")
    if over.empty:
        return text + "; never above " + f"{limit:g}"
    first = over.iloc[0]
    count = over[["tensor", "kind"]].drop_duplicates().shape[0]
    where = f"{first.tensor}, {first.kind}; {count} tensors"
    return f"{text}; above {limit:g} from step {first.step} ({where})"


def _trainer_run(steps: int) -> dict[str, Any]:
    """A unit_scale'd Llama-style model under UnitScalingTrainer + MonitorCallback."""
    import transformers
    from torch.utils.data import Dataset

    from unit_scaling.integrations.hf import MonitorCallback, UnitScalingTrainer
    from unit_scaling.transforms import unit_scale

    corpus = Corpus()

    class Rows(Dataset[dict[str, torch.Tensor]]):
        def __init__(self) -> None:
            self.rows = torch.cat(
                [corpus.get_batch("train", BATCH, SEQ, generator=i) for i in range(64)]
            )

        def __len__(self) -> int:
            return len(self.rows)

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"input_ids": self.rows[i], "labels": self.rows[i]}

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=SEQ + 1,
    )
    model = unit_scale(transformers.LlamaForCausalLM(config), residual_scaling="u-μP")
    alerts: list[str] = []
    handler = _Collect(alerts)
    logging.getLogger("unit_scaling.monitor").addHandler(handler)
    callback = MonitorCallback(every=EVERY)
    with tempfile.TemporaryDirectory() as out, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = transformers.TrainingArguments(
            out,
            per_device_train_batch_size=BATCH,
            max_steps=steps,
            learning_rate=uu.RECOMMENDED.lr,
            report_to=[],
            use_cpu=True,
            save_strategy="no",
            logging_steps=steps,
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        trainer = UnitScalingTrainer(
            model=model, args=args, train_dataset=Rows(), callbacks=[callback]
        )
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
    logging.getLogger("unit_scaling.monitor").removeHandler(handler)
    assert callback.monitor is not None
    table = callback.monitor.table()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    _save(TRAINER_RUN, table, alerts, losses[-1] if losses else math.nan)
    return {
        "table": table,
        "alerts": alerts,
        "loss": losses[-1] if losses else math.nan,
        "seconds": seconds,
    }


def _plots(results: dict[str, dict[str, Any]], out: Path, width: int) -> list[str]:
    from unit_scaling.analysis import (
        plot_fp8_fractions_over_training,
        plot_scales_over_training,
    )

    images = []
    for name in (f"u-μP FP32 w{width}", f"SP FP32 w{width}"):
        if name not in results:
            continue
        slug = name.replace(" ", "_").replace("μ", "mu")
        path = out / f"scales_during_training_{slug}.png"
        plot_scales_over_training(results[name]["table"], kind="all", path=path)
        images.append(f"![{name}: log2 RMS over training]({path.name})")
        path = out / f"scales_during_training_{slug}_fp8.png"
        plot_fp8_fractions_over_training(results[name]["table"], path=path)
        images.append(f"![{name}: FP8 fractions over training]({path.name})")
    return images


def main() -> None:
    parser = run_parser(__doc__)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--widths", type=int, nargs="+", default=[128, 512])
    parser.add_argument(
        "--wide-steps",
        type=int,
        default=None,
        help="steps at widths above 128 (default: --steps)",
    )
    parser.add_argument("--trainer-steps", type=int, default=1000)
    parser.add_argument(
        "--render-only",
        type=float,
        default=None,
        metavar="SECONDS",
        help="write the page from the saved runs (and the time they took)",
    )
    args = parser.parse_args()
    if args.render_only is not None:
        results = _saved()
        order = [
            f"{p} {q} w{w}"
            for w in args.widths
            for p in ("u-μP", "SP")
            for q in ("FP32", "FP8")
        ]
        results = {k: results[k] for k in [*order, TRAINER_RUN] if k in results}
        _write(results, args, args.render_only)
        return
    start = time.perf_counter()
    wide = args.wide_steps or args.steps
    tasks = [
        (width, p, precision, args.steps if width <= 128 else wide)
        for width in args.widths
        for p in ("u-μP", "SP")
        for precision in ("FP32", "FP8")
    ]
    outcomes = run_all(
        _run,
        tasks,
        args.jobs,
        lambda t, r: f"{t[1]} {t[2]} w{t[0]}: loss {r['loss']:.3f}",
    )
    results = {
        f"{t[1]} {t[2]} w{t[0]}": r for t, r in zip(tasks, outcomes, strict=True)
    }
    if args.trainer_steps:
        results[TRAINER_RUN] = _trainer_run(args.trainer_steps)
    _write(results, args, time.perf_counter() - start)


def _write(results: dict[str, dict[str, Any]], args: Any, seconds: float) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    page = _page(results, args, seconds, _plots(results, args.out, max(args.widths)))
    (args.out / "scales_during_training.md").write_text(page)
    print(page)


def _intro(args: Any, seconds: float) -> str:
    widths = ", ".join(map(str, args.widths))
    return (
        "What `unit_scaling.monitor` records over training. The demo's decoder "
        f"({LAYERS} layers, head size {HEAD_SIZE}, batch {BATCH} × {SEQ} byte "
        f"tokens) at widths {widths}, {args.steps} steps (at widths above 128: "
        f"{args.wide_steps or args.steps}), SP (lr {SP_LR:g}) and "
        "u-μP (`uu.RECOMMENDED`), FP32 and simulated FP8; and a `unit_scale`d "
        "Llama-style model (width 128) under `UnitScalingTrainer` with "
        f"`MonitorCallback`, {args.trainer_steps} steps. A record every {EVERY} "
        "steps. Made by `experiments/scales_during_training.py` in "
        f"{timing_note(seconds, args.jobs)}."
    )


def _page(
    results: dict[str, dict[str, Any]], args: Any, seconds: float, images: list[str]
) -> str:
    drift_rows, fp8_rows, alert_rows = [], [], []
    for name, r in results.items():
        table = r["table"]
        drift = _drift(table)
        drift_rows.append(
            [name, f"{r['loss']:.3f}"] + [drift.get(k, "-") for k in KINDS]
        )
        fp8_rows.append(
            [name]
            + [
                _worst(
                    table,
                    f"{fmt}_{what}",
                    SATURATED if what == "saturated" else FLUSHED,
                )
                for fmt in ("e4m3", "e5m2")
                for what in ("saturated", "flushed")
            ]
        )
        alerts = r["alerts"]
        shown = "; ".join(a.removeprefix("unit_scaling.monitor: ") for a in alerts[:3])
        alert_rows.append(
            [name, str(len(alerts)), shown + (" …" if len(alerts) > 3 else "")]
        )
    return (
        "\n\n".join(
            [
                "# Scales during training",
                reflow(_intro(args, seconds)),
                "## Drift from unit scale",
                reflow(
                    "Per kind of tensor: the median |log₂ RMS| over tensors at the "
                    "last record (0 is unit scale), then the median and the largest "
                    "change of log₂ RMS from the first record to the last, in "
                    "binades; tensors whose RMS is 0 (every value flushed) are "
                    "counted apart."
                ),
                markdown_table(["run", "final val loss", *KINDS], drift_rows),
                "## What E4M3 and E5M2 would lose with static scales",
                reflow(
                    "With the usual FP8 recipe (activations and weights in E4M3, "
                    "gradients in E5M2) at scale 1 (u-μP's and "
                    "`convert_to_float8_training`'s static scale): the largest "
                    "fraction of a tensor that would saturate or flush to zero, and "
                    "from which step a tensor first crossed the monitor's alert "
                    f"thresholds ({SATURATED:g} saturated, {FLUSHED:.0%} flushed). "
                    "The tables of every statistic and format are in "
                    "`out/scales_during_training/`."
                ),
                markdown_table(
                    [
                        "run",
                        "E4M3 saturated (forward)",
                        "E4M3 flushed (forward)",
                        "E5M2 saturated (gradients)",
                        "E5M2 flushed (gradients)",
                    ],
                    fp8_rows,
                ),
                "## What the monitor warned",
                markdown_table(["run", "alerts", "first alerts"], alert_rows),
                *images,
            ]
        )
        + "\n"
    )


if __name__ == "__main__":
    sys.exit(main())
