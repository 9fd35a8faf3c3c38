"""Inputs that require grad, so that ``track_scales`` tracks their gradients,
and the fallback for models that cannot take such inputs."""

from __future__ import annotations

import contextvars
import copy
import inspect
import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .._capture.engine import RunState

__all__ = ["InputGradFallback", "make_inputs_require_grad"]

logger = logging.getLogger("unit_scaling.transforms.track_scales")

# Set while a call runs with its inputs as given (see InputGradFallback).
_INPUTS_AS_GIVEN: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "track_scales_inputs_as_given", default=False
)


def _inputs_to_track(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Tensor]:
    """The floating-point leaf inputs that do not require grad yet."""
    return [
        value
        for value in (*args, *kwargs.values())
        if isinstance(value, Tensor)
        and value.is_floating_point()
        and value.is_leaf
        and not value.requires_grad
    ]


def make_inputs_require_grad(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    if not _INPUTS_AS_GIVEN.get():
        for value in _inputs_to_track(args, kwargs):
            value.requires_grad_()


def _rejects_input_grad(error: RuntimeError) -> bool:
    # torch's message when code sets ``.requires_grad`` on a non-leaf tensor.
    return "requires_grad flags of leaf variables" in str(error)


class InputGradFallback:
    """The forward of a tracked module: reruns a call with its inputs as given
    when the model cannot take inputs that require grad.

    Some models set ``t.requires_grad = True`` on a tensor computed from their
    input alone (Hugging Face's audio feature encoders do, in training mode, for
    gradient checkpointing). That is only allowed on a leaf, and ``t`` stops
    being one once the input requires grad, so such a model fails with any input
    that requires grad, ours included. Their input gradients cannot be tracked:
    we undo ``requires_grad_()`` on the inputs, rerun the call from the start
    (the failed attempt stopped at the model's assignment), and leave inputs as
    given from then on.
    """

    def __init__(self, forward: Callable[..., Any], state: RunState) -> None:
        self._forward = forward
        self._state = state
        self.inputs_as_given = False
        # The wrapped forward's parameters, as inspect.signature reports them.
        self.__signature__ = inspect.signature(forward)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            return self._forward(*args, **kwargs)
        if self.inputs_as_given:
            return self._call_with_inputs_as_given(args, kwargs)
        tracked_inputs = _inputs_to_track(args, kwargs)
        try:
            return self._forward(*args, **kwargs)
        except RuntimeError as error:
            if not (tracked_inputs and _rejects_input_grad(error)):
                raise
            logger.warning(
                "track_scales: the model sets requires_grad on a tensor computed "
                "from its inputs, which fails when an input requires grad (%s). "
                "Rerunning with inputs as given: their gradients are not tracked.",
                str(error).splitlines()[0],
            )
        for value in tracked_inputs:
            value.requires_grad_(False)
        self.inputs_as_given = True
        self._state.calls -= 1  # the failed attempt does not count as a call
        return self._call_with_inputs_as_given(args, kwargs)

    def _call_with_inputs_as_given(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        token = _INPUTS_AS_GIVEN.set(True)
        try:
            return self._forward(*args, **kwargs)
        finally:
            _INPUTS_AS_GIVEN.reset(token)

    def __deepcopy__(self, memo: dict[int, Any]) -> InputGradFallback:
        # copy.deepcopy(module) copies the module, and its state, first.
        copied = InputGradFallback(
            copy.deepcopy(self._forward, memo), copy.deepcopy(self._state, memo)
        )
        copied.inputs_as_given = self.inputs_as_given
        return copied

    def __reduce__(self) -> Any:
        return self._state.__reduce__()
