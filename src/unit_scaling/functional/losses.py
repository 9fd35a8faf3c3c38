"""Unit-scaled losses: ``cross_entropy`` and ``mse_loss``.

A loss is where the backward pass starts, so its gradient scale decides the scale
of every gradient in the model. Both losses here compute the sum-reduced loss and
fold all scales into the 0-d result: the forward is divided by the count for
``reduction="mean"`` and the backward multiplied by the unit-scaling factor, with
no extra pass over the (possibly large) inputs.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .._twoway import scale_twoway
from ..scale import scale_bwd
from ._checks import check_mult, reject_unsupported

__all__ = ["cross_entropy", "mse_loss"]

_REDUCTIONS = ("mean", "sum", "none")


def _check_loss_args(
    op: str,
    reduction: str,
    size_average: bool | None,
    reduce: bool | None,
    **unsupported: tuple[Any, Any],
) -> None:
    """Reject torch's deprecated ``size_average``/``reduce`` (every loss has them),
    the other arguments this loss cannot honour, and an unknown reduction."""
    reject_unsupported(
        op, size_average=(size_average, None), reduce=(reduce, None), **unsupported
    )
    if reduction not in _REDUCTIONS:
        raise ValueError(
            f"U.{op}: reduction={reduction!r} is not valid; expected one of "
            f"{', '.join(repr(r) for r in _REDUCTIONS)}"
        )


def _check_class_targets(input: Tensor, target: Tensor) -> None:
    if input.dim() == 0:
        raise ValueError(
            "U.cross_entropy: expected input of shape (C,), (N, C) or "
            "(N, C, d1, ...), got a 0-d tensor"
        )
    if target.is_floating_point() and target.shape == input.shape:
        raise ValueError(
            "U.cross_entropy: probability targets (a floating-point target of the "
            "input's shape) have not been implemented; pass class indices"
        )
    if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        raise TypeError(
            "U.cross_entropy: expected class-index targets of an integer dtype "
            f"(e.g. torch.long), got {target.dtype}"
        )
    expected = input.shape[:1] + input.shape[2:] if input.dim() >= 2 else ()
    if target.shape != expected:
        raise ValueError(
            f"U.cross_entropy: input of shape {tuple(input.shape)} needs a target of "
            f"shape {tuple(expected)} (the input's shape without the class "
            f"dimension), got target of shape {tuple(target.shape)}"
        )


def cross_entropy(
    input: Tensor,
    target: Tensor,
    weight: Tensor | None = None,
    size_average: bool | None = None,
    ignore_index: int = -100,
    reduce: bool | None = None,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    mult: float = 1.0,
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.cross_entropy` for class indices.

    With ``V`` classes, logits ``x`` and the ``B`` targets that are not
    ``ignore_index``:

    .. math::
        L_{sum} = \\sum_{i} \\mathrm{CE}(m x_i, t_i), \\qquad
        L = L_{sum} / B \\;\\; (\\text{mean}), \\qquad
        \\partial_x = \\frac{V}{\\sqrt{V - 1}}\\, \\partial_x L_{sum}

    For near-uniform predictions each row's gradient ``softmax(x) - onehot(t)`` has
    RMS :math:`\\sqrt{V - 1} / V`, so the scale makes the logit gradients unit-scaled
    for a loss gradient of 1, for every reduction. The mean's ``1 / B`` scales only
    the forward (the value matches torch's), and ``B`` is counted on the device: no
    host synchronisation. With ``reduction="none"`` the per-element gradients are
    scaled by the same factor. The logit gradient keeps the chain rule's factor
    ``m`` (its RMS is about ``m`` for ``m ≤ 1``). With ``V = 1`` the loss is
    constant and the scale is 1.

    Args:
        input: logits of shape ``(C,)``, ``(N, C)`` or ``(N, C, d1, ...)``.
        target: class indices of shape ``()``, ``(N,)`` or ``(N, d1, ...)``.
        weight: not supported (must be ``None``).
        size_average: deprecated in torch; not supported.
        ignore_index: target value excluded from the loss and from ``B``.
        reduce: deprecated in torch; not supported.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        label_smoothing: not supported (must be 0).
        mult: the logits are multiplied by ``m`` first (skipped when 1).

    Example::

        >>> logits = torch.randn(32, 1000, requires_grad=True)
        >>> U.cross_entropy(logits, torch.randint(1000, (32,))).backward()
        >>> round(logits.grad.pow(2).mean().sqrt().item(), 1)
        1.0
    """
    _check_loss_args(
        "cross_entropy",
        reduction,
        size_average,
        reduce,
        weight=(weight, None),
        label_smoothing=(label_smoothing, 0.0),
    )
    check_mult("cross_entropy", mult)
    _check_class_targets(input, target)
    num_classes = input.shape[1] if input.dim() >= 2 else input.shape[0]
    grad_scale = num_classes / math.sqrt(num_classes - 1) if num_classes > 1 else 1.0
    logits = input if mult == 1 else input * mult
    if reduction == "none":
        loss = F.cross_entropy(
            logits, target, ignore_index=ignore_index, reduction="none"
        )
        # Scaling the per-element loss gradient scales the logit gradient equally,
        # on a tensor V times smaller.
        return scale_bwd(loss, grad_scale)
    if reduction == "sum":
        loss = F.cross_entropy(
            logits, target, ignore_index=ignore_index, reduction="sum"
        )
        return scale_bwd(loss, grad_scale)
    loss, reciprocal_count = _sum_and_reciprocal_count(logits, target, ignore_index)
    return scale_twoway(loss, reciprocal_count, grad_scale)


# aten's reduction codes (torch.nn._reduction): the sum.
_SUM = 2


def _sum_and_reciprocal_count(
    logits: Tensor, target: Tensor, ignore_index: int
) -> tuple[Tensor, Tensor]:
    """``F.cross_entropy(..., reduction="sum")`` and ``1 / B`` (``B`` the targets
    that are not ``ignore_index``), both on the device.

    For float32 ``(N, C)`` logits (those of a language model's loss; autocast
    makes them float32) aten's ``nll_loss`` counts ``B`` as it sums (its
    ``total_weight``, exact in float32), which saves a count over the targets.
    ``F.cross_entropy`` is this ``log_softmax`` and ``nll_loss`` after autocast's
    cast to float32, so the results are bitwise the same either way.
    """
    if (
        torch.is_autocast_enabled(logits.device.type)
        and logits.is_floating_point()
        and logits.dtype != torch.float64
    ):
        logits = logits.float()  # autocast's policy for F.cross_entropy's input
    log_probs = F.log_softmax(logits, dim=1 if logits.dim() > 1 else 0)
    if log_probs.dim() == 2 and log_probs.dtype == torch.float32:
        loss, count = torch.ops.aten.nll_loss_forward(
            log_probs, target, None, _SUM, ignore_index
        )
        return loss, count.reciprocal()
    loss = F.nll_loss(log_probs, target, ignore_index=ignore_index, reduction="sum")
    count = (target != ignore_index).sum()
    return loss, count.reciprocal().to(loss.dtype)


def mse_loss(
    input: Tensor,
    target: Tensor,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
    weight: Tensor | None = None,
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.mse_loss`.

    The forward is torch's (mean, sum or elementwise squared error); the gradients
    of ``input`` and ``target`` are those of the sum-reduced loss, scaled:

    .. math::
        \\partial_x = \\frac{1}{\\sqrt 8}\\, 2 (x - y)\\, \\partial_L, \\qquad
        \\partial_y = -\\frac{1}{\\sqrt 8}\\, 2 (x - y)\\, \\partial_L

    For independent unit-normal ``x`` and ``y``, ``2 (x - y)`` has standard
    deviation :math:`\\sqrt 8`, so both gradients are unit-scaled for a loss
    gradient of 1 (``"mean"``, ``"sum"``) or a unit-normal one (``"none"``).
    Unlike torch, which broadcasts with a warning, different shapes are an error.

    Args:
        input: any shape.
        target: the same shape as ``input``.
        size_average: deprecated in torch; not supported.
        reduce: deprecated in torch; not supported.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        weight: per-element weights (torch 2.13); not supported.

    Example::

        >>> x = torch.randn(4096, requires_grad=True)
        >>> U.mse_loss(x, torch.randn(4096)).backward()
        >>> round(x.grad.std().item(), 1)
        1.0
    """
    _check_loss_args("mse_loss", reduction, size_average, reduce, weight=(weight, None))
    if input.shape != target.shape:
        raise ValueError(
            f"U.mse_loss: input and target must have the same shape, got input "
            f"{tuple(input.shape)} and target {tuple(target.shape)}; broadcast "
            "them explicitly if that is intended"
        )
    grad_scale = 8**-0.5
    if reduction == "none":
        return scale_bwd(F.mse_loss(input, target, reduction="none"), grad_scale)
    loss = F.mse_loss(input, target, reduction="sum")
    numel = input.numel()
    if reduction == "sum":
        return scale_bwd(loss, grad_scale)
    # An empty mean is NaN, as in torch.
    return scale_twoway(loss, 1 / numel if numel else math.nan, grad_scale)
