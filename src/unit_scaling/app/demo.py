"""The demo: standard parametrisation vs u-μP, each in FP32 and in simulated FP8.

``python -m unit_scaling demo`` (or ``make demo``) trains the same small decoder
four ways on the built-in corpus — same data, seeds and step count — and writes
a loss-curve plot, a scale plot of the u-μP model, the scales the monitor
recorded during each run (:class:`unit_scaling.monitor.Monitor`: heatmaps over
steps, tables and the alerts it raised) and a short report to ``out/demo/``.
The u-μP runs start where a user should: :data:`unit_scaling.RECOMMENDED`'s
learning rate and multipliers. FP8 means
:func:`unit_scaling.transforms.simulate_fp8`: every matrix product takes E4M3
inputs and produces E5M2 gradients, with no loss scaling.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
from torch import nn

from .. import optim
from ..data import VOCAB_SIZE, Corpus
from ..modules import TransformerDecoder
from ..monitor import Monitor
from ..recommended import RECOMMENDED
from ..transforms import simulate_fp8
from .baseline import StandardTransformerDecoder
from .config import add_options, config_from_options, setting
from .training import History, smooth, tail_mean, train

__all__ = ["VARIANTS", "DemoConfig", "add_arguments", "config_from_args", "run"]

VARIANTS = (("SP", "FP32"), ("SP", "FP8"), ("u-μP", "FP32"), ("u-μP", "FP8"))
"""(parametrisation, precision) of each run, in order."""


@dataclass(frozen=True)
class DemoConfig:
    """Settings of the demo run (each is a ``demo`` option: ``--lr-umup``...)."""

    steps: int = setting(300, "training steps per run")
    width: int = setting(128, "model width")
    layers: int = setting(2, "transformer layers")
    heads: int = setting(4, "attention heads")
    batch_size: int = setting(16, "sequences per step")
    seq_len: int = setting(64, "bytes per sequence")
    lr_umup: float = setting(
        RECOMMENDED.lr, "u-μP AdamW base learning rate (uu.RECOMMENDED.lr)"
    )
    lr_sp: float = setting(2**-8, "standard AdamW learning rate")
    seed: int = setting(0, "seed of the weights and the data order")
    eval_every: int = setting(25, "steps between validations")
    validation_batches: int = setting(8, "batches per validation")
    out: Path = setting(Path("out/demo"), "output folder")

    def __post_init__(self) -> None:
        for name in ("steps", "width", "layers", "heads", "batch_size", "seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer")
        if self.width % self.heads:
            raise ValueError(
                f"width must be a multiple of the number of heads ({self.heads})"
            )
        for name in ("lr_umup", "lr_sp"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add an option per :class:`DemoConfig` field to ``parser``."""
    add_options(parser, DemoConfig)


def config_from_args(args: argparse.Namespace) -> DemoConfig:
    """A :class:`DemoConfig` from parsed :func:`add_arguments` options."""
    return config_from_options(DemoConfig, args)


def _build(
    parametrisation: str, precision: str, config: DemoConfig
) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(config.seed)
    model: nn.Module
    if parametrisation == "u-μP":
        model = TransformerDecoder(
            config.width,
            VOCAB_SIZE,
            config.layers,
            config.heads,
            **RECOMMENDED.multipliers,
        )
    else:
        model = StandardTransformerDecoder(
            config.width, VOCAB_SIZE, config.layers, config.heads
        )
    if precision == "FP8":
        model = simulate_fp8(model)  # a copy: the optimizer must see its weights
    optimizer: torch.optim.Optimizer
    if parametrisation == "u-μP":
        optimizer = optim.AdamW(model.parameters(), lr=config.lr_umup)
    else:
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=config.lr_sp, weight_decay=0.0
        )
    return model, optimizer


def run(config: DemoConfig, progress: bool = True) -> dict[str, History]:
    """Train every variant, print a results table, write plots and a report."""
    corpus = Corpus()
    validation = [
        corpus.get_batch("validation", config.batch_size, config.seq_len, generator=i)
        for i in range(config.validation_batches)
    ]
    histories: dict[str, History] = {}
    models: dict[str, nn.Module] = {}
    monitors: dict[str, Monitor] = {}
    for parametrisation, precision in VARIANTS:
        name = f"{parametrisation} {precision}"
        model, optimizer = _build(parametrisation, precision, config)
        loss_fn = cast(Callable[[torch.Tensor], torch.Tensor], model.loss)
        monitors[name] = monitor = Monitor(
            model, every=max(config.steps // 30, 1), optimizer=optimizer
        )
        with _alerts_kept_quiet():
            histories[name] = train(
                model,
                loss_fn,
                optimizer,
                corpus.batches(
                    "train", config.batch_size, config.seq_len, seed=config.seed
                ),
                config.steps,
                validation,
                eval_every=config.eval_every,
                description=f"{name:10s}",
                progress=progress,
            )
        monitor.remove()
        models[name] = model
    table = _results_table(histories)
    print(_header(config))
    print(table)
    config.out.mkdir(parents=True, exist_ok=True)
    written = _write_outputs(
        config, histories, models["u-μP FP32"], validation[0], table, monitors
    )
    for path in written:
        print(f"wrote {path}")
    return histories


@contextlib.contextmanager
def _alerts_kept_quiet() -> Iterator[None]:
    """The monitor's alerts go to the report, not the console, during a run."""
    log = logging.getLogger("unit_scaling.monitor")
    propagate = log.propagate
    quiet = logging.NullHandler()
    log.addHandler(quiet)
    log.propagate = False
    try:
        yield
    finally:
        log.removeHandler(quiet)
        log.propagate = propagate


def _header(config: DemoConfig) -> str:
    multipliers = ", ".join(f"{k} {v:g}" for k, v in RECOMMENDED.multipliers.items())
    return (
        f"Decoder: width {config.width}, {config.layers} layers, {config.heads} "
        f"heads; {config.steps} steps of {config.batch_size}x{config.seq_len} "
        f"byte tokens; AdamW lr {config.lr_sp:g} (SP), {config.lr_umup:g} (u-μP, "
        f"with {multipliers})"
    )


def _results_table(histories: dict[str, History]) -> str:
    rows = [
        "| run | final train loss | final validation loss | tokens/s |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, h in histories.items():
        train_loss = tail_mean(h.train_loss)
        rows.append(
            f"| {name} | {train_loss:.3f} | {h.validation_loss[-1]:.3f} | "
            f"{h.tokens_per_second:,.0f} |"
        )
    return "\n".join(rows)


def _write_outputs(
    config: DemoConfig,
    histories: dict[str, History],
    umup_model: nn.Module,
    batch: torch.Tensor,
    table: str,
    monitors: dict[str, Monitor],
) -> list[Path]:
    alerts = _alerts_table(monitors)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from ..analysis import visualiser
    except ImportError:
        report = config.out / "report.md"
        report.write_text(_report(config, table, alerts, images=[]))
        print('plots skipped: pip install "torch-unit-scaling[plot]" to get them')
        return [report]

    curves = config.out / "loss_curves.png"
    fig, ax = plt.subplots(figsize=(8, 5))
    styles = {"FP32": "-", "FP8": "--"}
    colours = {"SP": "tab:red", "u-μP": "tab:blue"}
    for name, h in histories.items():
        parametrisation, precision = name.split()
        colour, style = colours[parametrisation], styles[precision]
        ax.plot(
            h.steps,
            smooth(h.train_loss),
            style,
            color=colour,
            alpha=0.8,
            linewidth=1.5,
            label=f"{name} (train, smoothed)",
        )
        ax.plot(
            h.eval_steps,
            h.validation_loss,
            "o",
            color=colour,
            markerfacecolor="white" if precision == "FP8" else colour,
            markersize=5,
        )
    ax.plot([], [], "o", color="grey", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per byte)")
    ax.set_title("Standard parametrisation vs u-μP, FP32 vs simulated FP8")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(curves, dpi=120)
    plt.close(fig)

    scales = config.out / "umup_scales.png"
    axes = visualiser(
        umup_model,
        batch,
        title="u-μP decoder after training: tensor scales (forward and backward)",
    )
    figure = axes.get_figure(root=True)
    assert figure is not None
    figure.savefig(scales, dpi=110, bbox_inches="tight")
    plt.close(figure)

    written = [curves, scales, *_write_monitor_outputs(config.out, monitors)]
    report = config.out / "report.md"
    images = [p.name for p in written if p.suffix == ".png"]
    report.write_text(_report(config, table, alerts, images))
    return [*written, report]


# The monitor's plots in the demo: what each run's tensors did over training.
_MONITOR_PLOTS = {
    "u-μP FP32": "scales over training",
    "SP FP32": "scales over training",
    "u-μP FP8": "FP8 fractions",
    "SP FP8": "FP8 fractions",
}


def _slug(name: str) -> str:
    return name.replace("μ", "mu").replace(" ", "_").replace("-", "").lower()


def _write_monitor_outputs(out: Path, monitors: dict[str, Monitor]) -> list[Path]:
    """Each run's recorded scales as a CSV table, and the plots of
    :data:`_MONITOR_PLOTS`."""
    import matplotlib.pyplot as plt

    from ..analysis import plot_fp8_fractions_over_training, plot_scales_over_training

    written = []
    for name, monitor in monitors.items():
        table = monitor.table()
        path = out / f"scales_{_slug(name)}.csv"
        table.to_csv(path, index=False)
        written.append(path)
        plot = _MONITOR_PLOTS.get(name)
        if plot is None or table.empty:
            continue
        if plot == "FP8 fractions":
            path = out / f"fp8_fractions_{_slug(name)}.png"
            figure = plot_fp8_fractions_over_training(table, path=path)
        else:
            path = out / f"scales_{_slug(name)}.png"
            figure = plot_scales_over_training(table, kind="all", path=path)
        plt.close(figure)
        written.append(path)
    return written


def _alerts_table(monitors: dict[str, Monitor]) -> str:
    rows = ["| run | alerts | first alerts |", "| --- | ---: | --- |"]
    for name, monitor in monitors.items():
        fired = monitor.alerts.fired if monitor.alerts is not None else []
        first = "; ".join(fired[:2]) + (" …" if len(fired) > 2 else "")
        rows.append(f"| {name} | {len(fired)} | {first} |")
    return "\n".join(rows)


def _alt_text(image: str) -> str:
    """What a plot of the demo shows, from its file name."""
    fixed = {
        "loss_curves.png": "validation loss",
        "umup_scales.png": "u-μP tensor scales",
    }
    if image in fixed:
        return fixed[image]
    run = image.removesuffix(".png").split("_")[-2:]
    what = "FP8 fractions" if image.startswith("fp8_") else "log2 RMS over training"
    return f"{' '.join(run)}: {what}"


def _report(config: DemoConfig, table: str, alerts: str, images: list[str]) -> str:
    settings = "\n".join(
        f"- {f.name}: {getattr(config, f.name)}" for f in dataclasses.fields(config)
    )
    parts = [
        "# unit_scaling demo\n",
        _header(config) + ".\n",
        "FP8 runs use `simulate_fp8`: E4M3 inputs and E5M2 gradients for every "
        "matrix product, no loss scaling.\n",
        table + "\n",
    ]
    parts += [f"![{_alt_text(image)}]({image})\n" for image in images]
    parts += [
        "## What the scale monitor saw\n",
        "Every run was recorded by `unit_scaling.monitor.Monitor` (tables: "
        "`scales_<run>.csv`); the alerts it raised (once per tensor and "
        "condition):\n",
        alerts + "\n",
    ]
    parts += ["## Settings\n", settings + "\n"]
    return "\n".join(parts)
