"""Run settings in one style: a frozen dataclass per kind of run (nanoGPT's
``GPTConfig`` is the model), and its command-line options made from its fields.

A field ``batch_size: int = 16`` becomes ``--batch-size`` (an ``int``, default
16); a ``tuple[int, ...]`` field takes several values, a ``bool`` field becomes
``--name``/``--no-name``. Help comes from the field's ``metadata["help"]``, which
:func:`setting` sets. The dataclass checks its values in ``__post_init__``, so a
bad option and a bad argument in code get the same error.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Sequence
from typing import Any, TypeVar

__all__ = ["add_options", "config_from_options", "parse_config", "setting"]

C = TypeVar("C")


def setting(default: Any, help: str) -> Any:
    """A dataclass field with a default and the help text of its option.

    Example::

        >>> from dataclasses import dataclass
        >>> @dataclass(frozen=True)
        ... class Run:
        ...     steps: int = setting(300, "training steps")
        >>> parse_config(Run, ["--steps", "10"])[0]
        Run(steps=10)
    """
    return dataclasses.field(default=default, metadata={"help": help})


def _option_type(hint: Any) -> tuple[Any, bool]:
    """The type an option parses, and whether it takes several values."""
    if isinstance(hint, types.UnionType):  # ``X | None``: parse X
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if typing.get_origin(hint) is tuple:
        return typing.get_args(hint)[0], True
    return hint, False


def add_options(
    parser: argparse.ArgumentParser,
    config: type[Any],
    exclude: Sequence[str] = (),
) -> None:
    """Add an option to ``parser`` for each field of the dataclass ``config``
    (but those in ``exclude``), defaulting to the field's default."""
    if not dataclasses.is_dataclass(config):
        raise TypeError(f"config must be a dataclass type, got {config!r}")
    hints = typing.get_type_hints(config)
    for field in dataclasses.fields(config):
        if field.name in exclude or not field.init:
            continue
        flag = "--" + field.name.replace("_", "-")
        default: Any = field.default
        if field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        text = field.metadata.get("help", "") + " (default: %(default)s)"
        kind, several = _option_type(hints[field.name])
        if kind is bool:
            parser.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=default, help=text
            )
        elif several:
            parser.add_argument(
                flag, type=kind, nargs="+", default=list(default), help=text
            )
        else:
            parser.add_argument(flag, type=kind, default=default, help=text)


def config_from_options(config: type[C], args: argparse.Namespace) -> C:
    """The ``config`` dataclass from options that :func:`add_options` added (a
    field with no option keeps its default)."""
    hints = typing.get_type_hints(config)
    values = {}
    for field in dataclasses.fields(config):  # type: ignore[arg-type]
        if hasattr(args, field.name):
            value = getattr(args, field.name)
            several = _option_type(hints[field.name])[1]
            values[field.name] = tuple(value) if several else value
    return config(**values)


def parse_config(
    config: type[C],
    argv: Sequence[str] | None = None,
    description: str | None = None,
    parser: argparse.ArgumentParser | None = None,
) -> tuple[C, argparse.Namespace]:
    """Parse ``argv`` into a ``config`` dataclass, and return it with the parsed
    options (which also hold any that ``parser`` added beforehand)."""
    parser = parser or argparse.ArgumentParser(description=description)
    add_options(parser, config)
    args = parser.parse_args(argv)
    return config_from_options(config, args), args
