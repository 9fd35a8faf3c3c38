"""Unit-scaled matrix products: ``matmul``, ``linear``, ``linear_readout``.

The scales are folded into the ``alpha`` argument that the GEMM kernels
(``addmm``/``baddbmm``) already take, inside autograd functions that save exactly
what the plain op saves. A unit-scaled linear layer therefore costs the same as
``F.linear``: no extra elementwise pass in either direction.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..constraints import apply_constraint
from ..scale import scale_bwd, scale_fwd
from ._checks import autocast_inputs, validate_constraint

__all__ = ["linear", "linear_readout", "matmul"]


def _mm(a: Tensor, b: Tensor, alpha: float) -> Tensor:
    """``alpha * (a @ b)`` for 2-D operands in one GEMM."""
    if alpha == 1:
        return torch.mm(a, b)
    # With beta=0 addmm ignores its first argument (NaN/inf included), so a 1x1
    # view of `a` serves as the broadcastable placeholder without allocating.
    return torch.addmm(a[:1, :1], a, b, beta=0, alpha=alpha)


def _bmm(a: Tensor, b: Tensor, alpha: float) -> Tensor:
    """``alpha * (a @ b)`` for 3-D operands in one batched GEMM."""
    if alpha == 1:
        return torch.bmm(a, b)
    return torch.baddbmm(a[:1, :1, :1], a, b, beta=0, alpha=alpha)


class _ScaledLinearFn(torch.autograd.Function):
    """``y = a (x Wᵀ + b)``; ``∂x = c ∂y W``; ``∂W = d ∂yᵀ x``; ``∂b = d Σ ∂y``."""

    @staticmethod
    def forward(
        input: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        output_scale: float,
        grad_input_scale: float,
        grad_weight_scale: float,
    ) -> Tensor:
        x = input.reshape(-1, input.shape[-1])
        if bias is None:
            y = _mm(x, weight.t(), output_scale)
        else:
            y = torch.addmm(bias, x, weight.t(), beta=output_scale, alpha=output_scale)
        return y.view(*input.shape[:-1], weight.shape[0])

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        input, weight, bias, _, grad_input_scale, grad_weight_scale = inputs
        ctx.save_for_backward(input, weight)
        ctx.scales = (grad_input_scale, grad_weight_scale)
        ctx.has_bias = bias is not None

    @staticmethod
    def backward(
        ctx: Any, grad_output: Tensor
    ) -> tuple[Tensor | None, Tensor | None, Tensor | None, None, None, None]:
        input, weight = ctx.saved_tensors
        grad_input_scale, grad_weight_scale = ctx.scales
        g = grad_output.reshape(-1, grad_output.shape[-1])
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = _mm(g, weight, grad_input_scale).view(input.shape)
        if ctx.needs_input_grad[1]:
            x = input.reshape(-1, input.shape[-1])
            grad_weight = _mm(g.t(), x, grad_weight_scale)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = g.sum(0).mul_(grad_weight_scale)
        return grad_input, grad_weight, grad_bias, None, None, None


class _ScaledBmmFn(torch.autograd.Function):
    """``y = a (L @ R)``; ``∂L = b ∂y Rᵀ``; ``∂R = c Lᵀ ∂y`` for 3-D operands."""

    @staticmethod
    def forward(
        left: Tensor,
        right: Tensor,
        output_scale: float,
        left_scale: float,
        right_scale: float,
    ) -> Tensor:
        return _bmm(left, right, output_scale)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        left, right, _, left_scale, right_scale = inputs
        ctx.save_for_backward(left, right)
        ctx.scales = (left_scale, right_scale)

    @staticmethod
    def backward(
        ctx: Any, grad_output: Tensor
    ) -> tuple[Tensor | None, Tensor | None, None, None, None]:
        left, right = ctx.saved_tensors
        left_scale, right_scale = ctx.scales
        grad_left = grad_right = None
        if ctx.needs_input_grad[0]:
            grad_left = _bmm(grad_output, right.transpose(1, 2), left_scale)
        if ctx.needs_input_grad[1]:
            grad_right = _bmm(left.transpose(1, 2), grad_output, right_scale)
        return grad_left, grad_right, None, None, None


def _check_linear_args(
    op: str, input: Tensor, weight: Tensor, bias: Tensor | None
) -> None:
    if input.dim() == 0 or weight.dim() != 2 or input.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"U.{op}: expected input of shape (..., in_features) and weight of "
            f"shape (out_features, in_features), got input {tuple(input.shape)} "
            f"and weight {tuple(weight.shape)}"
        )
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(
            f"U.{op}: expected bias of shape ({weight.shape[0]},), got "
            f"{tuple(bias.shape)}"
        )


def linear(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    constraint: str | None = "to_output_scale",
    scale_power: tuple[float, float, float] = (0.5, 0.5, 0.5),
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.linear`.

    .. math::
        y = \\alpha (x W^T + b),\\quad
        \\alpha = \\text{fan\\_in}^{-p_0},\\quad
        \\beta_x = \\text{fan\\_out}^{-p_1},\\quad
        \\beta_W = \\beta_b = \\text{batch}^{-p_2}

    where ``batch = input.numel() / fan_in``. The constraint ties ``alpha`` and
    ``beta_x``; the weight and bias gradient scales are always independent.

    Args:
        input: ``(..., fan_in)``.
        weight: ``(fan_out, fan_in)``.
        bias: ``(fan_out,)`` or ``None``.
        constraint: applied to ``(alpha, beta_x)``; see :mod:`unit_scaling.constraints`.
        scale_power: the powers ``(p0, p1, p2)``.

    Example::

        >>> y = U.linear(torch.randn(64, 256), torch.randn(512, 256))
        >>> round(y.std().item(), 1)
        1.0
    """
    validate_constraint(constraint)
    _check_linear_args("linear", input, weight, bias)
    fan_out, fan_in = weight.shape
    batch = input.numel() // fan_in
    output_scale, grad_input_scale = apply_constraint(
        constraint, fan_in ** -scale_power[0], fan_out ** -scale_power[1]
    )
    grad_weight_scale = max(batch, 1) ** -scale_power[2]
    input, weight, bias = autocast_inputs(input, weight, bias)
    out: Tensor = _ScaledLinearFn.apply(
        input, weight, bias, output_scale, grad_input_scale, grad_weight_scale
    )
    return out


def linear_readout(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    constraint: str | None = None,
) -> Tensor:
    """Unit-scaled readout (final) linear layer, the μP output rule.

    :func:`linear` with ``scale_power=(1, 1/2, 1/2)``: the output is scaled by
    ``1 / fan_in`` rather than ``1 / sqrt(fan_in)``, so the logits shrink as the
    model widens, and the layer is unconstrained by default.

    Example::

        >>> logits = U.linear_readout(torch.randn(8, 64), torch.randn(10, 64))
        >>> logits.std().item() < 0.5
        True
    """
    return linear(input, weight, bias, constraint, scale_power=(1.0, 0.5, 0.5))


def matmul(
    left: Tensor, right: Tensor, constraint: str | None = "to_output_scale"
) -> Tensor:
    """Unit-scaled :func:`torch.matmul`.

    For ``[m, k] @ [k, n]``:

    .. math::
        \\alpha = k^{-1/2}, \\quad \\beta_{left} = n^{-1/2}, \\quad
        \\beta_{right} = m^{-1/2}

    With batch dimensions, ``m`` counts every row that contributes to one element
    of the right operand's gradient (all broadcast rows of ``left``).

    Args:
        left: at least 1-D.
        right: at least 1-D; inner dimensions must match.
        constraint: applied to ``(alpha, beta_left, beta_right)``.

    Example::

        >>> y = U.matmul(torch.randn(32, 128), torch.randn(128, 16))
        >>> round(y.std().item(), 1)
        1.0
    """
    validate_constraint(constraint)
    k = left.shape[-1]
    k_right = right.shape[-2] if right.dim() >= 2 else right.shape[0]
    if left.dim() == 0 or right.dim() == 0 or k != k_right:
        raise ValueError(
            "U.matmul: expected operands of shape (..., m, k) and (..., k, n), got "
            f"{tuple(left.shape)} and {tuple(right.shape)}"
        )
    n = right.shape[-1] if right.dim() >= 2 else 1
    right_copies = right.numel() // max(k * n, 1)
    m = left.numel() // max(k * right_copies, 1)
    output_scale, left_scale, right_scale = apply_constraint(
        constraint, k**-0.5, n**-0.5, max(m, 1) ** -0.5
    )
    left, right = autocast_inputs(left, right)
    assert left is not None and right is not None
    if left.dim() >= 2 and right.dim() == 2:
        out: Tensor = _ScaledLinearFn.apply(
            left, right.t(), None, output_scale, left_scale, right_scale
        )
        return out
    if left.dim() >= 3 and left.shape[:-2] == right.shape[:-2]:
        batch_shape = left.shape[:-2]
        out = _ScaledBmmFn.apply(
            left.reshape(-1, *left.shape[-2:]),
            right.reshape(-1, *right.shape[-2:]),
            output_scale,
            left_scale,
            right_scale,
        )
        return out.view(*batch_shape, *out.shape[-2:])
    # General broadcasting: separate scale ops around torch.matmul.
    left = scale_bwd(left, left_scale)
    right = scale_bwd(right, right_scale)
    return scale_fwd(torch.matmul(left, right), output_scale)
