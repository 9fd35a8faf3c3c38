"""Finding the module that first produced an ``inf`` or NaN:
:func:`first_nonfinite_module` replays a call with a check on every module."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from .._torch_internals import pytree

__all__ = ["NonFiniteError", "first_nonfinite_module", "is_finite"]


class NonFiniteError(FloatingPointError):
    """A step's loss was ``inf`` or NaN; the message names where it started."""


def is_finite(value: Any) -> bool:
    """Whether every floating-point tensor in ``value`` is finite (synchronises)."""
    return all(
        bool(torch.isfinite(leaf).all())
        for leaf in pytree.tree_leaves(value)
        if isinstance(leaf, Tensor) and leaf.is_floating_point()
    )


def _nonfinite_parameters(model: nn.Module) -> list[str]:
    return [name for name, p in model.named_parameters() if not is_finite(p.detach())]


@contextlib.contextmanager
def _checks(model: nn.Module, found: list[str]) -> Iterator[None]:
    """Every module of ``model`` appends its name to ``found`` when its output
    holds an ``inf`` or NaN while all its inputs are finite: it made them."""
    handles = []
    for name, module in model.named_modules():

        def check(
            module: nn.Module, args: Any, kwargs: Any, output: Any, name: str = name
        ) -> None:
            if not is_finite(output) and is_finite((args, kwargs)):
                found.append(name or type(module).__name__)

        handles.append(module.register_forward_hook(check, with_kwargs=True))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def first_nonfinite_module(model: nn.Module, replay: Callable[[], Any]) -> str:
    """Where the first ``inf`` or NaN comes from, in words: a parameter that
    holds one, or the first module (in the order they run) whose output holds
    one while its inputs do not, found by running ``replay`` (a call of
    ``model``, without gradients) with a check on every module's output.

    Example::

        >>> model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
        >>> with torch.no_grad():
        ...     _ = model[1].bias.fill_(float("nan"))
        >>> first_nonfinite_module(model, lambda: model(torch.ones(1, 2)))
        "parameter '1.bias' holds inf or NaN"
    """
    bad = _nonfinite_parameters(model)
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        return f"parameter {bad[0]!r} holds inf or NaN{more}"
    found: list[str] = []
    with torch.no_grad(), _checks(model, found):
        output = replay()
    if found:
        return f"module {found[0]!r} produced the first inf or NaN"
    if not is_finite(output):
        return (
            "no module's hook saw it (the model's call ran as one captured "
            "graph, so module hooks do not fire)"
        )
    return (
        "the replayed call was finite: the inf or NaN came after the model (in "
        "the loss or the backward pass), or from randomness the replay drew "
        "differently"
    )
