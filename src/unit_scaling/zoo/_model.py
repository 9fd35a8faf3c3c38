"""The :class:`ZooModel` record: how to build, feed and read one architecture."""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable
from typing import Any, Literal, get_args

import torch
from torch import Tensor, nn

__all__ = ["FAMILIES", "VARIANTS", "Family", "Inputs", "ZooModel"]

Inputs = tuple[tuple[Any, ...], dict[str, Any]]
"""Positional and keyword arguments of a model's forward: ``(args, kwargs)``."""

Family = Literal[
    "decoder",
    "moe",
    "encoder",
    "encoder-decoder",
    "vision",
    "conv",
    "diffusion",
    "ssm",
    "torch",
]
"""The kind of architecture a :class:`ZooModel` stands for."""

FAMILIES: tuple[Family, ...] = get_args(Family)
VARIANTS = (0, 1)
_INSTALL = "pip install 'torch-unit-scaling[zoo]'"


@dataclasses.dataclass(frozen=True)
class ZooModel:
    """A small architecture with random weights, and the inputs that exercise it.

    Nothing is downloaded: :attr:`build` makes the model from a small config (or
    plain torch code) with random weights and dropout probabilities zero.
    :meth:`example` gives inputs at two shape sets: variant ``0`` (the shapes to
    trace) and variant ``1`` (another batch size and another sequence length or
    image size), both deterministic in the seed.

    Attributes:
        name: unique, lowercase with dashes, e.g. ``"gpt-neox"``.
        family: the kind of architecture (:data:`Family`).
        build: makes the model; :meth:`make` seeds the global RNG first.
        inputs: ``(seed, variant) -> (args, kwargs)``; draws from its own
            ``torch.Generator``, never the global RNG.
        output: picks the main float output (logits, last hidden state, sample)
            from what ``forward`` returns.
        features: what the architecture exercises, e.g. ``("alibi", "gqa")``.
        requires: optional packages it needs, e.g. ``("transformers",)``.
        slow: whether tracing or running it is slow (tests run it only with
            ``-m slow``).
        description: one line on what architecture this stands for.

    Example::

        >>> from unit_scaling import zoo
        >>> mlp = zoo.get("mlp")
        >>> mlp.run(mlp.make(seed=0), seed=0).shape
        torch.Size([2, 16, 64])
    """

    name: str
    family: Family
    build: Callable[[], nn.Module]
    inputs: Callable[[int, int], Inputs]
    output: Callable[[Any], Tensor]
    features: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    slow: bool = False
    description: str = ""

    def available(self) -> bool:
        """Whether every package in :attr:`requires` can be imported."""
        return not self._missing()

    def make(self, seed: int = 0) -> nn.Module:
        """The model, built after ``torch.manual_seed(seed)``, in train mode.

        Raises:
            ImportError: if a package in :attr:`requires` is not installed.
        """
        missing = self._missing()
        if missing:
            raise ImportError(
                f"zoo model {self.name!r} needs {', '.join(missing)}, which is not "
                f"installed: {_INSTALL}"
            )
        torch.manual_seed(seed)
        return self.build().train()

    def example(self, seed: int = 0, variant: int = 0) -> Inputs:
        """The inputs ``(args, kwargs)`` for ``seed`` at shape set ``variant``.

        Raises:
            ValueError: if ``variant`` is not ``0`` or ``1``.
        """
        if variant not in VARIANTS:
            raise ValueError(
                f"variant {variant!r} of zoo model {self.name!r} does not exist: "
                f"use 0 (the traced shapes) or 1 (a second shape set)"
            )
        return self.inputs(seed, variant)

    def run(self, model: nn.Module, seed: int = 0, variant: int = 0) -> Tensor:
        """``model`` called on :meth:`example` inputs; its main output."""
        args, kwargs = self.example(seed, variant)
        return self.output(model(*args, **kwargs))

    def __str__(self) -> str:
        return self.name

    def _missing(self) -> list[str]:
        return [p for p in self.requires if importlib.util.find_spec(p) is None]
