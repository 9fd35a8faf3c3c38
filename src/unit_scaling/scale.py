"""Scale primitives: multiply a tensor in the forward or the backward pass only.

These are the two building blocks of unit scaling. Every unit-scaled op is
"the torch op, plus an output scale (:func:`scale_fwd`), plus one scale per input
gradient (:func:`scale_bwd`)". Both are single autograd functions that allocate
nothing beyond their product, never synchronise with the host, and trace under
``torch.compile(fullgraph=True)``.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ._autograd import Function

__all__ = ["scale_bwd", "scale_fwd"]

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


def _scale(x: Tensor, fwd: Scale, bwd: Scale) -> Tensor:
    """Scale ``x`` by ``fwd`` in the forward pass and its gradient by ``bwd``.

    Returns ``x`` itself when both scales are the Python number 1.
    """
    if _is_one(fwd) and _is_one(bwd):
        return x
    out: Tensor = _ScaleFwdBwd.apply(x, fwd, bwd)
    return out


def scale_fwd(input: Tensor, scale: Scale) -> Tensor:
    """Multiply by ``scale`` in the forward pass; the gradient passes unchanged.

    .. math:: y = s\\,x, \\qquad \\partial L/\\partial x = \\partial L/\\partial y

    Args:
        input: the tensor to scale.
        scale: a Python number or a tensor broadcastable to ``input``.

    Example::

        >>> x = torch.ones(3, requires_grad=True)
        >>> y = scale_fwd(x, 2.0)
        >>> y.sum().backward()
        >>> y.tolist(), x.grad.tolist()
        ([2.0, 2.0, 2.0], [1.0, 1.0, 1.0])
    """
    return _scale(input, scale, 1.0)


def scale_bwd(input: Tensor, scale: Scale) -> Tensor:
    """Identity in the forward pass; multiply the gradient by ``scale``.

    .. math:: y = x, \\qquad \\partial L/\\partial x = s\\,\\partial L/\\partial y

    Args:
        input: the tensor whose gradient is scaled.
        scale: a Python number or a tensor broadcastable to the gradient.

    Example::

        >>> x = torch.ones(3, requires_grad=True)
        >>> scale_bwd(x, 2.0).sum().backward()
        >>> x.grad.tolist()
        [2.0, 2.0, 2.0]
    """
    return _scale(input, 1.0, scale)
