"""Command-line interface: ``python -m unit_scaling --help``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from . import demo

__all__ = ["main"]


def _demo(args: argparse.Namespace) -> int:
    config = demo.DemoConfig(
        steps=args.steps,
        width=args.width,
        layers=args.layers,
        lr=args.lr,
        seed=args.seed,
    )
    demo.run(config)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen subcommand; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="unit-scaling",
        description="Unit scaling and u-μP for PyTorch: demo and tools.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    demo_parser = commands.add_parser(
        "demo", help="train a small u-μP decoder on the built-in corpus"
    )
    demo.add_arguments(demo_parser)
    demo_parser.set_defaults(handler=_demo)
    args = parser.parse_args(argv)
    status: int = args.handler(args)
    return status
