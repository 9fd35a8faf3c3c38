"""Command-line interface: ``python -m unit_scaling --help`` (or ``unit-scaling``).

Subcommands:

- ``demo``: standard parametrisation vs u-μP, FP32 vs simulated FP8, on the
  built-in corpus; writes plots and a report (see :mod:`unit_scaling.app.demo`).
- ``report MODEL``: the tensor scales of a model before and after ``unit_scale``
  (see :mod:`unit_scaling.app.report`).
- ``monitor-plots SOURCE``: heatmaps of tensor scales over a training run and
  the FP8 fractions, from what ``unit_scaling.monitor`` recorded (see
  :mod:`unit_scaling.app.monitor_plots`).
- ``sweep``: u-μP's independent hyperparameter search on a small proxy decoder,
  resumable (see :mod:`unit_scaling.app.sweep`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from . import demo, monitor_plots, report, sweep

__all__ = ["main"]


def _demo(args: argparse.Namespace) -> None:
    demo.run(demo.config_from_args(args))


def _report(args: argparse.Namespace) -> None:
    for path in report.run(args):
        print(f"wrote {path}")


def _monitor_plots(args: argparse.Namespace) -> None:
    for path in monitor_plots.run(args):
        print(f"wrote {path}")


def _sweep(args: argparse.Namespace) -> None:
    sweep.run_command(args)


# Each subcommand: its name, what declares its options, what runs it, and its
# line in ``unit-scaling --help``.
_COMMANDS: tuple[
    tuple[
        str,
        Callable[[argparse.ArgumentParser], None],
        Callable[[argparse.Namespace], None],
        str,
    ],
    ...,
] = (
    (
        "demo",
        demo.add_arguments,
        _demo,
        "train SP and u-μP decoders in FP32 and simulated FP8 on the built-in "
        "corpus; write plots and a report",
    ),
    (
        "report",
        report.add_arguments,
        _report,
        "scale plots and a table of a model's tensors before and after unit_scale",
    ),
    (
        "monitor-plots",
        monitor_plots.add_arguments,
        _monitor_plots,
        "heatmaps of tensor scales over training and the FP8 fractions, from a "
        "table or TensorBoard log saved by unit_scaling.monitor",
    ),
    (
        "sweep",
        sweep.add_arguments,
        _sweep,
        "u-μP's independent search: the learning rate, then each multiplier "
        "of a small uu.TransformerDecoder; resumable; writes best.json and a plot",
    ),
)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen subcommand; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="unit-scaling",
        description="Unit scaling and u-μP for PyTorch: demo, scale reports, "
        "plots of a training run's scales and u-μP's hyperparameter search.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name, add_arguments, handler, summary in _COMMANDS:
        command = commands.add_parser(name, help=summary)
        add_arguments(command)
        command.set_defaults(handler=handler)
    args = parser.parse_args(argv)
    try:
        args.handler(args)
    except ValueError as error:
        print(f"unit-scaling {args.command}: error: {error}", file=sys.stderr)
        return 2
    return 0
