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
from string import Template

import torch
from torch import Tensor

from ._checks import check_conv_shapes, expand_size, validate_constraint
from ._dims import for_dims
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
    bias: Tensor | None = None,
    stride: _Size = 1,
    padding: _Size = 0,
    output_padding: _Size = 0,
    groups: int = 1,
    dilation: _Size = 1,
    constraint: str | None = "to_output_scale",
    scale_power: tuple[float, float, float] = (0.5, 0.5, 0.5),
) -> Tensor:
    """``conv_transpose{n}d``: a sum of ``C_in / G · K / S`` terms forwards, a
    convolution of ``C_out / G · K`` back."""
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


_DOC = Template(
    """Unit-scaled :func:`torch.nn.functional.$name`.

    The adjoint of :func:`~unit_scaling.functional.conv${n}d`, scaled by the
    number of terms in its own sums:

    .. math::
        y = \\alpha\\,(x \\star^T W + b),\\quad
        \\alpha = \\left(\\frac{\\text{fan\\_in}\\cdot K}{S}\\right)^{-p_0},\\quad
        \\beta_x = (\\text{fan\\_out}\\cdot K)^{-p_1},\\quad
        \\beta_W = (L_{in} \\cdot N)^{-p_2},\\quad
        \\beta_b = (L_{out} \\cdot N)^{-p_2}

    with ``fan_in = C_in / groups``, ``fan_out = C_out / groups`` (the weight's
    second dim), ``K = $kernel_numel`` the kernel size, ``S = $stride_numel`` the
    stride, ``L_in = $axes_in_numel`` and ``L_out = $axes_out_numel`` the input
    and output positions and ``N`` the batch size (1 if unbatched). An output
    element sums ``fan_in·K/S`` terms on average, an input element's gradient
    ``fan_out·K``; see the module docstring. The constraint ties ``alpha`` and
    ``beta_x``.

    Args:
        input: ``(N, C_in, $axes)`` or ``(C_in, $axes)``.
        weight: ``(C_in, C_out / groups, $kernel)``.
        bias: ``(C_out,)`` or ``None``.
        stride, padding, output_padding, groups, dilation: as in torch.
        constraint: applied to ``(alpha, beta_x)``; see
            :mod:`unit_scaling.constraints`.
        scale_power: the powers ``(p0, p1, p2)``.

    Example::

        >>> x, w = torch.randn($input), torch.randn($weight)
        >>> y = U.$name(x, w, $options)
        >>> y.shape, round(y.std().item(), 1)
        (torch.Size([$output]), 1.0)
    """
)
conv_transpose1d = for_dims(
    _conv_transpose,
    1,
    _DOC,
    input="8, 32, 100",
    weight="32, 16, 4",
    options="stride=2, padding=1",
    output="8, 16, 200",
)
conv_transpose2d = for_dims(
    _conv_transpose,
    2,
    _DOC,
    input="4, 32, 16, 16",
    weight="32, 16, 4, 4",
    options="stride=2, padding=1",
    output="4, 16, 32, 32",
)
conv_transpose3d = for_dims(
    _conv_transpose,
    3,
    _DOC,
    input="2, 16, 8, 8, 8",
    weight="16, 8, 2, 2, 2",
    options="stride=2",
    output="2, 8, 16, 16, 16",
)
