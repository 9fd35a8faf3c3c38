"""Unit-scaled normalisation: ``layer_norm``, ``rms_norm``, ``group_norm``,
``batch_norm`` and ``instance_norm``.

A normalisation's output is unit-scaled by construction, and so (to a good
approximation) is its input gradient. Only the affine parameters need scaling: each
element of a weight or bias gradient sums one term per normalised group, so it is
scaled by the inverse square root of that count. The scale is applied to the
weight and bias themselves (weight-sized, cheap) and the torch kernel does the rest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor

from ..scale import scale_bwd

__all__ = ["batch_norm", "group_norm", "instance_norm", "layer_norm", "rms_norm"]


def _checked_shape(
    op: str, input: Tensor, normalized_shape: int | Sequence[int]
) -> tuple[int, ...]:
    """``normalized_shape`` as a tuple, checked against ``input``'s trailing dims."""
    if isinstance(normalized_shape, int):
        shape: tuple[int, ...] = (normalized_shape,)
    else:
        shape = tuple(normalized_shape)
    trailing = tuple(input.shape[input.dim() - len(shape) :])
    if not shape or len(shape) > input.dim() or trailing != shape:
        raise ValueError(
            f"U.{op}: normalized_shape={shape} must equal the trailing dimensions "
            f"of input, which has shape {tuple(input.shape)}"
        )
    return shape


def _channels(op: str, input: Tensor) -> int:
    if input.dim() < 2:
        raise ValueError(
            f"U.{op}: expected input of shape (N, C, *), got {tuple(input.shape)}"
        )
    return input.shape[1]


def _scale_affine(
    params: tuple[Tensor | None, ...], group_numel: int, input: Tensor
) -> tuple[Tensor | None, ...]:
    """Scale each affine parameter's gradient by ``(group_numel / numel)^½``.

    ``numel / group_numel`` is the number of normalised groups, i.e. of terms summed
    into one element of the gradient.
    """
    scale = (group_numel / max(input.numel(), 1)) ** 0.5
    return tuple(None if p is None else scale_bwd(p, scale) for p in params)


def layer_norm(
    input: Tensor,
    normalized_shape: int | Sequence[int],
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.layer_norm`.

    .. math::
        y = \\frac{x - \\mathrm{E}[x]}{\\sqrt{\\mathrm{Var}[x] + \\epsilon}}
            \\odot w + b,\\qquad
        \\beta_w = \\beta_b = \\left(\\frac{\\prod \\text{normalized\\_shape}}
            {\\text{numel}}\\right)^{1/2}

    The output and input gradient are unscaled (already unit). Each element of
    the weight and bias gradients sums one term per normalised row,
    ``numel / prod(normalized_shape)`` of them, hence ``beta``.

    Args:
        input: ``(*, *normalized_shape)``.
        normalized_shape: the trailing dimensions to normalise over (an int is
            one dimension).
        weight: elementwise scale of shape ``normalized_shape``, or ``None``.
        bias: elementwise shift of shape ``normalized_shape``, or ``None``.
        eps: added to the variance for numerical stability.

    Example::

        >>> y = U.layer_norm(torch.randn(16, 64), (64,), weight=torch.ones(64))
        >>> round(y.std().item(), 1)
        1.0
    """
    shape = _checked_shape("layer_norm", input, normalized_shape)
    weight, bias = _scale_affine((weight, bias), math.prod(shape), input)
    return F.layer_norm(input, shape, weight, bias, eps)


def rms_norm(
    input: Tensor,
    normalized_shape: int | Sequence[int],
    weight: Tensor | None = None,
    eps: float | None = None,
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.rms_norm`.

    .. math::
        y = \\frac{x}{\\sqrt{\\mathrm{E}[x^2] + \\epsilon}} \\odot w,\\qquad
        \\beta_w = \\left(\\frac{\\prod \\text{normalized\\_shape}}
            {\\text{numel}}\\right)^{1/2}

    The output and input gradient are unscaled (already unit); the weight gradient
    sums one term per normalised row, hence ``beta_w``.

    Args:
        input: ``(*, *normalized_shape)``.
        normalized_shape: the trailing dimensions to normalise over (an int is
            one dimension).
        weight: elementwise scale of shape ``normalized_shape``, or ``None``.
        eps: added to the mean square; ``None`` uses ``torch.finfo(dtype).eps``.

    Example::

        >>> y = U.rms_norm(torch.randn(16, 64), (64,), weight=torch.ones(64))
        >>> round(y.pow(2).mean().sqrt().item(), 1)
        1.0
    """
    shape = _checked_shape("rms_norm", input, normalized_shape)
    (weight,) = _scale_affine((weight,), math.prod(shape), input)
    return F.rms_norm(input, shape, weight, eps)


def group_norm(
    input: Tensor,
    num_groups: int,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.group_norm`.

    .. math::
        y = \\mathrm{GroupNorm}(x) \\odot w + b,\\qquad
        \\beta_w = \\beta_b = \\left(\\frac{C}{\\text{numel}}\\right)^{1/2}

    for input ``(N, C, *)``. The output and input gradient are unscaled (already
    unit); each per-channel weight and bias gradient sums ``numel / C`` terms
    (every batch element and spatial position), hence ``beta``.

    Args:
        input: ``(N, C, *)``.
        num_groups: number of groups to split the ``C`` channels into.
        weight: per-channel scale of shape ``(C,)``, or ``None``.
        bias: per-channel shift of shape ``(C,)``, or ``None``.
        eps: added to the variance for numerical stability.

    Example::

        >>> y = U.group_norm(torch.randn(8, 32, 16), 4, weight=torch.ones(32))
        >>> round(y.std().item(), 1)
        1.0
    """
    if input.dim() < 2 or num_groups < 1 or input.shape[1] % num_groups:
        raise ValueError(
            f"U.group_norm: expected input of shape (N, C, *) with C divisible by "
            f"num_groups, got input {tuple(input.shape)} and num_groups={num_groups}"
        )
    weight, bias = _scale_affine((weight, bias), input.shape[1], input)
    return F.group_norm(input, num_groups, weight, bias, eps)


def batch_norm(
    input: Tensor,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.batch_norm`.

    .. math::
        y = \\frac{x - \\mathrm{E}_{N,*}[x]}{\\sqrt{\\mathrm{Var}_{N,*}[x] + \\epsilon}}
            \\odot w + b,\\qquad
        \\beta_w = \\beta_b = \\left(\\frac{C}{\\text{numel}}\\right)^{1/2}

    for input ``(N, C, *)``, with batch statistics per channel (over ``N`` and the
    spatial dims ``*``) when ``training`` and the running ones otherwise. The
    output and input gradient are unscaled (already unit in training; in
    evaluation the running statistics of unit data make the op close to the
    identity). Each per-channel weight and bias gradient sums ``numel / C``
    terms, hence ``beta``. ``running_mean`` and ``running_var`` are updated in
    place exactly as by torch.

    Args:
        input: ``(N, C, *)``.
        running_mean, running_var: per-channel running statistics ``(C,)``, or
            ``None`` to always use batch statistics.
        weight: per-channel scale ``(C,)``, or ``None``.
        bias: per-channel shift ``(C,)``, or ``None``.
        training: normalise by batch statistics (and update the running ones).
        momentum: the running statistics' update factor.
        eps: added to the variance for numerical stability.

    Example::

        >>> x, mean, var = 3 * torch.randn(32, 16, 8), torch.zeros(16), torch.ones(16)
        >>> y = U.batch_norm(x, mean, var, torch.ones(16), training=True)
        >>> round(y.std().item(), 1), round(var.mean().item(), 1)
        (1.0, 1.8)
    """
    channels = _channels("batch_norm", input)
    weight, bias = _scale_affine((weight, bias), channels, input)
    return F.batch_norm(
        input, running_mean, running_var, weight, bias, training, momentum, eps
    )


def instance_norm(
    input: Tensor,
    running_mean: Tensor | None = None,
    running_var: Tensor | None = None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    use_input_stats: bool = True,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.instance_norm`.

    .. math::
        y = \\frac{x - \\mathrm{E}_{*}[x]}{\\sqrt{\\mathrm{Var}_{*}[x] + \\epsilon}}
            \\odot w + b,\\qquad
        \\beta_w = \\beta_b = \\left(\\frac{C}{\\text{numel}}\\right)^{1/2}

    for input ``(N, C, *)``, normalised per sample and channel over the spatial
    dims. The output and input gradient are unscaled (already unit); each
    per-channel weight and bias gradient sums ``numel / C`` terms, hence
    ``beta``. Running statistics, when given, are updated in place exactly as by
    torch.

    Args:
        input: ``(N, C, *)``.
        running_mean, running_var: per-channel running statistics ``(C,)``, or
            ``None``.
        weight: per-channel scale ``(C,)``, or ``None``.
        bias: per-channel shift ``(C,)``, or ``None``.
        use_input_stats: normalise by each instance's statistics (``False``: by
            the running ones).
        momentum: the running statistics' update factor.
        eps: added to the variance for numerical stability.

    Example::

        >>> y = U.instance_norm(3 * torch.randn(8, 16, 64), weight=torch.ones(16))
        >>> round(y.std().item(), 1)
        1.0
    """
    channels = _channels("instance_norm", input)
    weight, bias = _scale_affine((weight, bias), channels, input)
    return F.instance_norm(
        input,
        running_mean,
        running_var,
        weight,
        bias,
        use_input_stats,
        momentum,
        eps,
    )
