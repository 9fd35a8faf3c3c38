"""Unit-scaled additions: ``add`` and the residual connection ``residual_*`` ops.

A residual connection ``x + f(x)`` is split into two ops so that both passes stay
unit-scaled however deep the network is: :func:`residual_split` makes the
residual-branch and skip copies of ``x`` and weights their gradients, and
:func:`residual_add` recombines the two with the matching forward weights. Both run
twice per transformer layer, so each is at most one fused elementwise pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .._autograd import Function
from ..constraints import apply_constraint
from ..scale import scale_bwd, scale_fwd
from ._checks import validate_constraint

__all__ = ["add", "residual_add", "residual_apply", "residual_split"]


def _is_float_tensor(x: Any) -> bool:
    return isinstance(x, Tensor) and x.is_floating_point()


def add(
    input: Any,
    other: Any,
    *,
    alpha: float = 1,
    constraint: str | None = "to_output_scale",
) -> Any:
    """Unit-scaled :func:`torch.add`: ``input + alpha * other``.

    For tensor operands, with ``N`` the numel of the broadcast output:

    .. math::
        y = \\sigma\\,(a + \\alpha\\, b),\\quad
        \\sigma = 2^{-1/2}\\ (1 \\text{ if either operand has one element}),\\quad
        \\beta_a = (N / |a|)^{-1/2},\\quad \\beta_b = (N / |b|)^{-1/2}

    ``beta`` is the inverse square root of each operand's broadcast expansion: a
    broadcast operand's gradient sums ``N / |operand|`` unit terms. The constraint
    applies to ``(sigma, beta_a, beta_b)`` (so ``"to_left_grad_scale"`` picks
    ``beta_a`` and ``"to_right_grad_scale"`` ``beta_b``); with the default every
    scale equals ``sigma`` and the op is ``sigma * (a + alpha b)`` with its true
    gradient.
    ``alpha`` is part of the function being scaled, like in :func:`torch.add`: the
    scales depend on shapes only, so ``alpha != 1`` changes the output's scale to
    ``sqrt((1 + alpha²) / 2)``.

    Anything but two floating-point tensors is added plainly and unscaled: adding
    a Python constant does not change a tensor's scale, and integer tensors
    (positions, indices) and sizes are not activations.

    Args:
        input: a tensor or a Python number.
        other: a tensor or a Python number.
        alpha: multiplier of ``other``, as in :func:`torch.add` (keyword-only).
        constraint: applied to ``(sigma, beta_a, beta_b)``; see
            :mod:`unit_scaling.constraints`. ``None`` scales each independently.

    Example::

        >>> y = U.add(torch.randn(10_000), torch.randn(10_000))
        >>> round(y.std().item(), 1)
        1.0
    """
    validate_constraint(constraint)
    if not (_is_float_tensor(input) and _is_float_tensor(other)):
        return input + other if alpha == 1 else input + alpha * other
    shape = torch.broadcast_shapes(input.shape, other.shape)  # type: ignore[no-untyped-call]
    numel = math.prod(shape)
    one_element = input.numel() == 1 or other.numel() == 1
    output_scale, input_scale, other_scale = apply_constraint(
        constraint,
        1.0 if one_element else 2**-0.5,
        (max(numel, 1) / max(input.numel(), 1)) ** -0.5,
        (max(numel, 1) / max(other.numel(), 1)) ** -0.5,
    )
    if output_scale == input_scale == other_scale:
        out = torch.add(input, other, alpha=alpha)
        return out if output_scale == 1 else out * output_scale
    input = scale_bwd(input, input_scale)
    other = scale_bwd(other, other_scale)
    return scale_fwd(torch.add(input, other, alpha=alpha), output_scale)


def _skip_weight(tau: float) -> float:
    """Skip weight ``1/sqrt(1+tau²)``; the residual weight is ``tau`` times it."""
    if not tau >= 0:
        raise ValueError(
            f"tau={tau!r} must be a non-negative number: it is the weight of the "
            "residual branch relative to the skip connection"
        )
    return 1 / math.sqrt(1 + tau * tau)


class _ResidualSplitFn(Function):
    """``(r, s) = (x, x)``; ``∂x = b (tau ∂r + ∂s)`` in one elementwise pass."""

    @staticmethod
    def forward(input: Tensor, tau: float, skip_weight: float) -> Any:
        return input.view_as(input), input.view_as(input)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.set_materialize_grads(False)
        ctx.tau, ctx.skip_weight = inputs[1:]

    @staticmethod
    def backward(
        ctx: Any, grad_residual: Tensor | None, grad_skip: Tensor | None
    ) -> tuple[Tensor | None, None, None]:
        if grad_residual is None:
            grad = None if grad_skip is None else grad_skip * ctx.skip_weight
        elif grad_skip is None:
            grad = grad_residual * (ctx.tau * ctx.skip_weight)
        else:
            grad = torch.add(grad_skip, grad_residual, alpha=ctx.tau)
            grad = grad.mul_(ctx.skip_weight)
        return grad, None, None


def residual_split(input: Tensor, tau: float = 1.0) -> tuple[Tensor, Tensor]:
    """Split ``input`` into a residual-branch copy and a skip copy.

    Forward, both outputs are ``input`` (views: nothing is copied). Backward, the
    two incoming gradients are weighted and summed:

    .. math::
        \\partial L/\\partial x = \\frac{\\tau}{\\sqrt{1+\\tau^2}}\\,
        \\partial L/\\partial r + \\frac{1}{\\sqrt{1+\\tau^2}}\\,\\partial L/\\partial s

    so that two independent unit gradients sum to a unit gradient. Pair with
    :func:`residual_add` using the same ``tau`` (which weights the forward pass
    only): together they compute ``y = a f(x) + b x`` with its true gradient.

    Args:
        input: the residual stream.
        tau: weight of the residual branch relative to the skip (``>= 0``).

    Returns:
        ``(residual, skip)``: feed ``residual`` to the branch, ``skip`` to
        :func:`residual_add`.

    Example::

        >>> x = torch.randn(4, 8)
        >>> residual, skip = U.residual_split(x, tau=0.5)
        >>> torch.equal(residual, x) and torch.equal(skip, x)
        True
    """
    skip_weight = _skip_weight(tau)
    residual, skip = _ResidualSplitFn.apply(input, tau, skip_weight)
    return residual, skip


class _ResidualAddFn(Function):
    """``y = b (s + tau r)``; ``∂r = ∂s = ∂y`` (summed to each input's shape)."""

    @staticmethod
    def forward(residual: Tensor, skip: Tensor, tau: float, skip_weight: float) -> Any:
        return torch.add(skip, residual, alpha=tau).mul_(skip_weight)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        ctx.shapes = inputs[0].shape, inputs[1].shape

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None, None]:
        residual_shape, skip_shape = ctx.shapes
        # A residual add has equal shapes; summing covers a broadcast one.
        grad_residual = (
            grad if grad.shape == residual_shape else grad.sum_to_size(residual_shape)
        )
        grad_skip = grad if grad.shape == skip_shape else grad.sum_to_size(skip_shape)
        return grad_residual, grad_skip, None, None


def residual_add(residual: Tensor, skip: Tensor, tau: float = 1.0) -> Tensor:
    """Add a residual branch to the skip connection, keeping unit scale.

    .. math::
        y = \\frac{\\tau}{\\sqrt{1+\\tau^2}}\\, r + \\frac{1}{\\sqrt{1+\\tau^2}}\\, s,
        \\qquad \\partial L/\\partial r = \\partial L/\\partial s
        = \\partial L/\\partial y

    The weights apply in the forward pass only: for independent unit ``r`` and
    ``s`` the output is unit, and both inputs receive the unit output gradient.
    :func:`residual_split` applies the same weights in the backward pass, so the
    pair computes ``y = a f(x) + b x`` with its true gradient.

    Args:
        residual: the output of the residual branch.
        skip: the skip output of :func:`residual_split`.
        tau: weight of the residual branch relative to the skip (``>= 0``).

    Example::

        >>> y = U.residual_add(torch.randn(10_000), torch.randn(10_000), tau=0.5)
        >>> round(y.std().item(), 1)
        1.0
    """
    skip_weight = _skip_weight(tau)
    out: Tensor = _ResidualAddFn.apply(residual, skip, tau, skip_weight)
    return out


def residual_apply(
    fn: Callable[[Tensor], Tensor], input: Tensor, tau: float = 1.0
) -> Tensor:
    """Apply a residual branch: ``residual_add(fn(residual), skip, tau)``.

    The unit-scaled ``x + fn(x)``; see :func:`residual_split` and
    :func:`residual_add` for the scales.

    Args:
        fn: the residual branch, a callable from tensor to tensor.
        input: the residual stream.
        tau: weight of the residual branch relative to the skip (``>= 0``).

    Example::

        >>> y = U.residual_apply(torch.tanh, torch.randn(4, 8), tau=0.5)
        >>> y.shape
        torch.Size([4, 8])
    """
    skip_weight = _skip_weight(tau)
    residual, skip = _ResidualSplitFn.apply(input, tau, skip_weight)
    out: Tensor = _ResidualAddFn.apply(fn(residual), skip, tau, skip_weight)
    return out
