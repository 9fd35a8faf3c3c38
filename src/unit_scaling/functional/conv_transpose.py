"""Unit-scaled transposed convolutions: ``conv_transpose1d``, ``2d`` and ``3d``.

A transposed convolution is the adjoint of a convolution: each input element is
multiplied by the whole kernel and added into the output at ``stride`` spacing.
With weight ``(C_in, C_out / G, *k)``, ``K = prod(k)`` and ``S = prod(stride)``:

* an output element sums ``(C_in / G) · K / S`` terms on average (each kernel tap
  lands on one output position in ``S``);
* an input element's gradient is a convolution of the output gradient, a sum of
  ``(C_out / G) · K`` terms;
* the weight gradient sums over the ``N · L_in`` input positions and the bias
  gradient over the ``N · L_out`` output positions.

Border positions receive fewer terms, as for :func:`~unit_scaling.functional.conv1d`;
the rule ignores them. The scales are folded into the weight and bias exactly as
for the convolutions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from ._checks import check_conv_shapes, expand_size, validate_constraint
from ._scaling import scaled_affine

__all__ = ["conv_transpose1d", "conv_transpose2d", "conv_transpose3d"]

_Size = int | Sequence[int]


_TORCH_CONV_TRANSPOSES = {
    1: torch.conv_transpose1d,
    2: torch.conv_transpose2d,
    3: torch.conv_transpose3d,
}


def _conv_transpose(
    n: int,
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    stride: _Size,
    padding: _Size,
    output_padding: _Size,
    groups: int,
    dilation: _Size,
    constraint: str | None,
    scale_power: tuple[float, float, float],
) -> Tensor:
    """The rule of :func:`conv_transpose1d` for ``n`` spatial dims: a sum of
    ``C_in / G · K / S`` terms forwards, a convolution of ``C_out / G · K`` back."""
    op = f"conv_transpose{n}d"
    validate_constraint(constraint)
    check_conv_shapes(op, n, input, weight, groups, transposed=True)
    strides = expand_size(op, "stride", stride, n)
    pads = expand_size(op, "padding", padding, n)
    output_pads = expand_size(op, "output_padding", output_padding, n)
    dilations = expand_size(op, "dilation", dilation, n)
    kernel = tuple(weight.shape[2:])
    spatial = tuple(input.shape[-n:])
    out_spatial = [
        (length - 1) * s - 2 * p + d * (k - 1) + q + 1
        for length, s, p, d, k, q in zip(
            spatial, strides, pads, dilations, kernel, output_pads, strict=True
        )
    ]
    fan_in = weight.shape[0] // groups
    fan_out = weight.shape[1]
    kernel_numel = math.prod(kernel)
    batch = input.shape[0] if input.dim() == n + 2 else 1
    return scaled_affine(
        lambda x, w, b: _TORCH_CONV_TRANSPOSES[n](
            x, w, b, stride, padding, output_padding, groups, dilation
        ),
        input,
        weight,
        bias,
        (max(fan_in * kernel_numel, 1) / math.prod(strides)) ** -scale_power[0],
        (
            max(fan_out * kernel_numel, 1) ** -scale_power[1],
            max(batch * math.prod(spatial), 1) ** -scale_power[2],
            max(batch * math.prod(out_spatial), 1) ** -scale_power[2],
        ),
        constraint,
    )


def conv_transpose1d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: _Size = 1,
    padding: _Size = 0,
    output_padding: _Size = 0,
    groups: int = 1,
    dilation: _Size = 1,
    constraint: str | None = "to_output_scale",
    scale_power: tuple[float, float, float] = (0.5, 0.5, 0.5),
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.conv_transpose1d`.

    The adjoint of :func:`~unit_scaling.functional.conv1d`, scaled by the number
    of terms in its own sums:

    .. math::
        y = \\alpha\\,(x \\star^T W + b),\\quad
        \\alpha = \\left(\\frac{\\text{fan\\_in}\\cdot K}{S}\\right)^{-p_0},\\quad
        \\beta_x = (\\text{fan\\_out}\\cdot K)^{-p_1},\\quad
        \\beta_W = (L_{in} \\cdot N)^{-p_2},\\quad
        \\beta_b = (L_{out} \\cdot N)^{-p_2}

    with ``fan_in = C_in / groups``, ``fan_out = C_out / groups`` (the weight's
    second dim), ``K`` the kernel size, ``S`` the stride, ``L_in``/``L_out`` the
    input/output lengths and ``N`` the batch size (1 if unbatched). An output
    element sums ``fan_in·K/S`` terms on average, an input element's gradient
    ``fan_out·K``; see the module docstring. The constraint ties ``alpha`` and
    ``beta_x``.

    Args:
        input: ``(N, C_in, L)`` or ``(C_in, L)``.
        weight: ``(C_in, C_out / groups, K)``.
        bias: ``(C_out,)`` or ``None``.
        stride, padding, output_padding, groups, dilation: as in torch.
        constraint: applied to ``(alpha, beta_x)``; see
            :mod:`unit_scaling.constraints`.
        scale_power: the powers ``(p0, p1, p2)``.

    Example::

        >>> x, w = torch.randn(8, 32, 100), torch.randn(32, 16, 4)
        >>> y = U.conv_transpose1d(x, w, stride=2, padding=1)
        >>> y.shape, round(y.std().item(), 1)
        (torch.Size([8, 16, 200]), 1.0)
    """
    return _conv_transpose(
        1,
        input,
        weight,
        bias,
        stride,
        padding,
        output_padding,
        groups,
        dilation,
        constraint,
        scale_power,
    )


def conv_transpose2d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: _Size = 1,
    padding: _Size = 0,
    output_padding: _Size = 0,
    groups: int = 1,
    dilation: _Size = 1,
    constraint: str | None = "to_output_scale",
    scale_power: tuple[float, float, float] = (0.5, 0.5, 0.5),
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.conv_transpose2d`.

    As :func:`conv_transpose1d`, with ``K = kH·kW``, ``S = sH·sW``,
    ``L_in = H_in·W_in`` and ``L_out = H_out·W_out``:

    .. math::
        y = \\alpha\\,(x \\star^T W + b),\\quad
        \\alpha = \\left(\\frac{\\text{fan\\_in}\\cdot K}{S}\\right)^{-p_0},\\quad
        \\beta_x = (\\text{fan\\_out}\\cdot K)^{-p_1},\\quad
        \\beta_W = (L_{in} \\cdot N)^{-p_2},\\quad
        \\beta_b = (L_{out} \\cdot N)^{-p_2}

    Args:
        input: ``(N, C_in, H, W)`` or ``(C_in, H, W)``.
        weight: ``(C_in, C_out / groups, kH, kW)``.
        bias: ``(C_out,)`` or ``None``.
        stride, padding, output_padding, groups, dilation: as in torch.
        constraint: applied to ``(alpha, beta_x)``; see
            :mod:`unit_scaling.constraints`.
        scale_power: the powers ``(p0, p1, p2)``.

    Example::

        >>> x, w = torch.randn(4, 32, 16, 16), torch.randn(32, 16, 4, 4)
        >>> y = U.conv_transpose2d(x, w, stride=2, padding=1)
        >>> y.shape, round(y.std().item(), 1)
        (torch.Size([4, 16, 32, 32]), 1.0)
    """
    return _conv_transpose(
        2,
        input,
        weight,
        bias,
        stride,
        padding,
        output_padding,
        groups,
        dilation,
        constraint,
        scale_power,
    )


def conv_transpose3d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: _Size = 1,
    padding: _Size = 0,
    output_padding: _Size = 0,
    groups: int = 1,
    dilation: _Size = 1,
    constraint: str | None = "to_output_scale",
    scale_power: tuple[float, float, float] = (0.5, 0.5, 0.5),
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.conv_transpose3d`.

    As :func:`conv_transpose1d`, with ``K = kD·kH·kW``, ``S = sD·sH·sW`` and
    ``L`` the product of the three spatial sizes:

    .. math::
        y = \\alpha\\,(x \\star^T W + b),\\quad
        \\alpha = \\left(\\frac{\\text{fan\\_in}\\cdot K}{S}\\right)^{-p_0},\\quad
        \\beta_x = (\\text{fan\\_out}\\cdot K)^{-p_1},\\quad
        \\beta_W = (L_{in} \\cdot N)^{-p_2},\\quad
        \\beta_b = (L_{out} \\cdot N)^{-p_2}

    Args:
        input: ``(N, C_in, D, H, W)`` or ``(C_in, D, H, W)``.
        weight: ``(C_in, C_out / groups, kD, kH, kW)``.
        bias: ``(C_out,)`` or ``None``.
        stride, padding, output_padding, groups, dilation: as in torch.
        constraint: applied to ``(alpha, beta_x)``; see
            :mod:`unit_scaling.constraints`.
        scale_power: the powers ``(p0, p1, p2)``.

    Example::

        >>> x, w = torch.randn(2, 16, 8, 8, 8), torch.randn(16, 8, 2, 2, 2)
        >>> y = U.conv_transpose3d(x, w, stride=2)
        >>> y.shape, round(y.std().item(), 1)
        (torch.Size([2, 8, 16, 16, 16]), 1.0)
    """
    return _conv_transpose(
        3,
        input,
        weight,
        bias,
        stride,
        padding,
        output_padding,
        groups,
        dilation,
        constraint,
        scale_power,
    )
