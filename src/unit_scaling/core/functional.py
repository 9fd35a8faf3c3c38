"""The public helpers of unit scaling's arithmetic (SPEC names).

:func:`scale_elementwise` wraps any one-input torch function as "the torch
function, plus an output scale, plus an input-gradient scale, plus a
constraint", for users writing their own ops (the package's own ops use the
fused :mod:`unit_scaling.functional._scaling` instead);
:func:`logarithmic_interpolation` and :func:`transformer_residual_scaling_rule`
are the scale rules of the u-μP models; :func:`rms` measures scales.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..constraints import apply_constraint
from ..scale import scale_bwd, scale_fwd

__all__ = [
    "logarithmic_interpolation",
    "rms",
    "scale_elementwise",
    "transformer_residual_scaling_rule",
]


def scale_elementwise(
    f: Callable[..., Tensor],
    output_scale: float,
    grad_input_scale: float,
    constraint: str | None = "to_output_scale",
) -> Callable[..., Tensor]:
    """Wrap a unary function ``f`` with an output scale and an input-gradient scale.

    .. math:: y = \\alpha\\, f(x), \\qquad
              \\partial L/\\partial x = \\beta\\, f'(x)\\, \\partial L/\\partial y

    where ``(alpha, beta)`` are ``(output_scale, grad_input_scale)`` after the
    constraint. Extra positional and keyword arguments are passed through to ``f``.

    Args:
        f: the function to scale; its first argument is the scaled input.
        output_scale: the forward multiplier ``alpha``.
        grad_input_scale: the backward multiplier ``beta``.
        constraint: see :mod:`unit_scaling.constraints`.

    Example::

        >>> scaled_relu = scale_elementwise(torch.relu, 2.0, 2.0)
        >>> scaled_relu(torch.tensor([-1.0, 1.0])).tolist()
        [0.0, 2.0]
    """
    output_scale, grad_input_scale = apply_constraint(
        constraint, output_scale, grad_input_scale
    )

    def scaled_f(input: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        input = scale_bwd(input, grad_input_scale)
        return scale_fwd(f(input, *args, **kwargs), output_scale)

    return scaled_f


def logarithmic_interpolation(alpha: float, lower: float, upper: float) -> float:
    """Interpolate between ``lower`` and ``upper`` linearly in log space.

    .. math:: \\exp(\\alpha \\ln u + (1 - \\alpha) \\ln l)

    ``alpha = 0`` gives ``lower``, ``alpha = 1`` gives ``upper``.

    Example::

        >>> logarithmic_interpolation(0.5, 1.0, 4.0)
        2.0
    """
    if not (lower > 0 and upper > 0):
        raise ValueError(
            "logarithmic_interpolation: lower and upper must be positive (it "
            f"interpolates their logarithms), got lower={lower!r}, upper={upper!r}"
        )
    return math.exp(alpha * math.log(upper) + (1 - alpha) * math.log(lower))


def rms(
    x: Tensor,
    dims: tuple[int, ...] | None = None,
    keepdim: bool = False,
    eps: float = 0.0,
) -> Tensor:
    """Root-mean-square ``sqrt(mean(x**2) + eps)``, accumulated in float32.

    Args:
        x: the input tensor.
        dims: dimensions to reduce over (``None``: all).
        keepdim: keep reduced dimensions with size 1.
        eps: added to the mean square before the square root.

    Returns:
        A tensor of ``x``'s dtype.

    Example::

        >>> round(rms(torch.tensor([3.0, -4.0])).item() ** 2, 4)
        12.5
    """
    mean_sq = x.float().square().mean(dim=dims, keepdim=keepdim)
    return torch.sqrt(mean_sq + eps).to(x.dtype)


def transformer_residual_scaling_rule(
    residual_mult: float = 1.0, residual_attn_ratio: float = 1.0
) -> Callable[[int, int], float]:
    """The u-μP residual rule for a stack of alternating attention and MLP branches.

    Returns ``tau(index, layers)`` where ``index`` counts residual branches
    (even: attention, odd: MLP) and ``layers`` is the total number of branches.
    With ``r = residual_attn_ratio``:

    .. math::
        a_{mlp} = m \\sqrt{2 / (1 + r^2)}, \\quad a_{attn} = r\\, a_{mlp}, \\quad
        \\tau = a / \\sqrt{L/2 + n_{attn} a_{attn}^2 + n_{mlp} a_{mlp}^2}

    where ``a`` is the branch's own alpha and ``n_attn = (index + 1) // 2``,
    ``n_mlp = index // 2`` count the branches before it.

    Args:
        residual_mult: overall weight of residual branches relative to the skip.
        residual_attn_ratio: weight of attention branches relative to MLP ones.

    Example::

        >>> tau = transformer_residual_scaling_rule()
        >>> round(tau(0, 4), 4)  # first branch of a 2-layer transformer
        0.7071
    """
    for name, value in (
        ("residual_mult", residual_mult),
        ("residual_attn_ratio", residual_attn_ratio),
    ):
        if not (isinstance(value, int | float) and 0 <= value < math.inf):
            raise ValueError(
                f"transformer_residual_scaling_rule: {name} must be a finite, "
                f"non-negative number, got {value!r}"
            )
    a_mlp = residual_mult * math.sqrt(2 / (1 + residual_attn_ratio**2))
    a_attn = residual_attn_ratio * a_mlp

    def tau(index: int, layers: int) -> float:
        if not 0 <= index < layers:
            raise ValueError(
                f"residual scaling rule: expected 0 <= index < layers (index counts "
                f"the residual branches, layers is their number), got "
                f"index={index}, layers={layers}"
            )
        n_attn = (index + 1) // 2
        n_mlp = index // 2
        a = a_attn if index % 2 == 0 else a_mlp
        return a / math.sqrt(layers / 2 + n_attn * a_attn**2 + n_mlp * a_mlp**2)

    return tau
