"""unit_scaling.app.config: run settings as dataclasses, options from their fields."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import pytest

from unit_scaling.app.config import (
    add_options,
    config_from_options,
    parse_config,
    setting,
)
from unit_scaling.app.demo import DemoConfig


@dataclass(frozen=True)
class Run:
    steps: int = setting(300, "training steps")
    lr: float = 1e-3
    widths: tuple[int, ...] = (64, 128)
    compile: bool = False
    name: str | None = None
    out: Path = Path("out")

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be a positive integer, got {self.steps}")


def test_defaults_without_options() -> None:
    assert parse_config(Run, [])[0] == Run()


def test_each_kind_of_field_parses() -> None:
    argv = ["--steps", "7", "--lr", "0.5", "--widths", "8", "16", "32"]
    argv += ["--compile", "--name", "x", "--out", "/tmp/o"]
    config, _ = parse_config(Run, argv)
    assert config == Run(7, 0.5, (8, 16, 32), True, "x", Path("/tmp/o"))
    assert isinstance(config.widths, tuple)
    assert parse_config(Run, ["--no-compile"])[0].compile is False


def test_help_text_and_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_config(Run, ["--help"])
    assert "training steps (default: 300)" in capsys.readouterr().out


def test_bad_values_rejected_by_the_dataclass() -> None:
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        parse_config(Run, ["--steps", "0"])
    with pytest.raises(SystemExit):  # argparse: not an int
        parse_config(Run, ["--steps", "many"])


def test_options_of_another_parser_are_kept() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1)
    config, args = parse_config(Run, ["--jobs", "3", "--lr", "2"], parser=parser)
    assert (args.jobs, config.lr) == (3, 2.0)


def test_excluded_fields_keep_their_default() -> None:
    parser = argparse.ArgumentParser()
    add_options(parser, Run, exclude=["lr"])
    args = parser.parse_args(["--steps", "5"])
    assert not hasattr(args, "lr")
    assert config_from_options(Run, args) == Run(steps=5)


def test_not_a_dataclass() -> None:
    with pytest.raises(TypeError, match="config must be a dataclass type"):
        add_options(argparse.ArgumentParser(), dict)


def test_demo_config_checks_its_values() -> None:
    with pytest.raises(ValueError, match="width must be a multiple"):
        DemoConfig(width=30)
    assert parse_config(DemoConfig, ["--lr-umup", "0.25"])[0].lr_umup == 0.25
