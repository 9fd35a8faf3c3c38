"""The one autograd function under every scale: ``fwd * x`` forward,
``bwd * grad`` backward (:mod:`unit_scaling.scale` and the ops build on it)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ._autograd import Function

__all__ = ["Scale", "scale_twoway"]

Scale = float | Tensor


def _is_one(scale: Scale) -> bool:
    # Only Python numbers are inspected: looking inside a tensor would sync.
    return not isinstance(scale, Tensor) and scale == 1


class _ScaleFwdBwd(Function):
    """``y = fwd * x`` whose gradient is ``bwd * grad_y`` (independent scales)."""

    @staticmethod
    def forward(x: Tensor, fwd: Scale, bwd: Scale) -> Tensor:
        return x.view_as(x) if _is_one(fwd) else x * fwd

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        ctx.bwd = inputs[2]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        return (grad if _is_one(ctx.bwd) else grad * ctx.bwd), None, None


def scale_twoway(x: Tensor, fwd: Scale, bwd: Scale) -> Tensor:
    """Scale ``x`` by ``fwd`` in the forward pass and its gradient by ``bwd``.

    Returns ``x`` itself when both scales are the Python number 1.
    """
    if _is_one(fwd) and _is_one(bwd):
        return x
    out: Tensor = _ScaleFwdBwd.apply(x, fwd, bwd)
    return out
