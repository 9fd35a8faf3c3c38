"""Unit-scaled convolutions: ``conv1d``, ``conv2d`` and ``conv3d``.

A convolution is a linear layer applied at every output position, so the rule is
:func:`~unit_scaling.functional.linear`'s with the kernel folded into the fan-in and
fan-out and the output positions folded into the batch. All scales are applied to
the weight and bias (weight-sized tensors): the output scale multiplies the weight
in the forward pass, which also scales the input gradient by the same factor, so
under a constraint the op costs no activation-sized pass beyond the plain one.
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

__all__ = ["conv1d", "conv2d", "conv3d"]

_Size = int | Sequence[int]


def _output_size(
    op: str,
    spatial: tuple[int, ...],
    kernel: tuple[int, ...],
    strides: tuple[int, ...],
    padding: str | _Size,
    dilations: tuple[int, ...],
) -> int:
    """The number of output positions, as torch computes it."""
    n = len(spatial)
    if padding == "same":
        return math.prod(spatial)
    pads = (0,) * n if padding == "valid" else padding
    if isinstance(pads, str):
        raise ValueError(
            f"U.{op}: padding={padding!r} must be 'same', 'valid', or int(s)"
        )
    size = 1
    for length, k, s, p, d in zip(
        spatial,
        kernel,
        strides,
        expand_size(op, "padding", pads, n),
        dilations,
        strict=True,
    ):
        size *= max((length + 2 * p - d * (k - 1) - 1) // s + 1, 0)
    return size


_TORCH_CONVS = {1: torch.conv1d, 2: torch.conv2d, 3: torch.conv3d}


def _conv(
    n: int,
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: _Size = 1,
    padding: str | _Size = 0,
    dilation: _Size = 1,
    groups: int = 1,
    constraint: str | None = "to_output_scale",
    scale_power: tuple[float, float, float] = (0.5, 0.5, 0.5),
) -> Tensor:
    """``conv{n}d``: a linear layer's rule, with the kernel in its fan-in and
    fan-out and the output positions in its batch."""
    op = f"conv{n}d"
    validate_constraint(constraint)
    check_conv_shapes(op, n, input, weight, groups, transposed=False)
    fan_out, fan_in, *kernel = weight.shape
    kernel_numel = math.prod(kernel)
    batch = input.shape[0] if input.dim() == n + 2 else 1
    strides = expand_size(op, "stride", stride, n)
    dilations = expand_size(op, "dilation", dilation, n)
    positions = _output_size(
        op, tuple(input.shape[-n:]), tuple(kernel), strides, padding, dilations
    )
    grad_input_scale = (
        math.prod(strides) * groups / max(fan_out * kernel_numel, 1)
    ) ** scale_power[1]
    grad_weight_scale = max(positions * batch, 1) ** -scale_power[2]
    return scaled_affine(
        lambda x, w, b: _TORCH_CONVS[n](x, w, b, stride, padding, dilation, groups),
        input,
        weight,
        bias,
        max(fan_in * kernel_numel, 1) ** -scale_power[0],
        (grad_input_scale, grad_weight_scale, grad_weight_scale),
        constraint,
    )


_DOC = Template(
    """Unit-scaled :func:`torch.nn.functional.$name`.

    .. math::
        y = \\alpha\\,(x \\star W + b),\\quad
        \\alpha = (\\text{fan\\_in}\\cdot K)^{-p_0},\\quad
        \\beta_x = \\left(\\frac{S \\cdot G}{\\text{fan\\_out}\\cdot K}\\right)^{p_1},
        \\quad \\beta_W = \\beta_b = (L_{out} \\cdot N)^{-p_2}

    with ``fan_in = C_in / groups``, ``fan_out = C_out``, ``K = $kernel_numel`` the
    kernel size, ``S = $stride_numel`` the stride, ``G = groups``,
    ``L_out = $axes_out_numel`` the output positions and ``N`` the batch size (1 if
    unbatched). An output element sums ``fan_in·K`` terms; an input element
    receives gradient from ``fan_out·K / (S·G)`` of them on average; a weight
    element sums over every output position of every batch element. The
    constraint ties ``alpha`` and ``beta_x``.

    Args:
        input: ``(N, C_in, $axes)`` or ``(C_in, $axes)``.
        weight: ``(C_out, C_in / groups, $kernel)``.
        bias: ``(C_out,)`` or ``None``.
        stride, padding, dilation, groups: as in torch (``padding`` may be
            ``'same'`` or ``'valid'``).
        constraint: applied to ``(alpha, beta_x)``; see
            :mod:`unit_scaling.constraints`.
        scale_power: the powers ``(p0, p1, p2)``.

    Example::

        >>> y = U.$name(torch.randn($input), torch.randn($weight))
        >>> round(y.std().item(), 1)
        1.0
    """
)
conv1d = for_dims(_conv, 1, _DOC, input="8, 16, 100", weight="32, 16, 3")
conv2d = for_dims(_conv, 2, _DOC, input="8, 16, 20, 20", weight="32, 16, 3, 3")
conv3d = for_dims(_conv, 3, _DOC, input="2, 8, 8, 8, 8", weight="16, 8, 3, 3, 3")
