"""A loss's share of an optimizer step: how unit-scaled gradients add up.

**The rule.** The gradient of an optimizer step is the gradient that *one call
on the step's whole batch* computes: every micro-batch it accumulates, on every
process. A unit-scaled call's parameter gradient is the sum of its examples'
contributions times ``b^-½`` for its own batch of ``b`` (``U.linear``'s
``batch^-½``, and the equivalents of embeddings, norms and broadcast
parameters), while its activation gradients are per example, at unit scale
whatever ``b``. So a call holding a fraction ``φ`` of the step's ``B``
examples contributes ``φ^½`` of its own gradient:

.. math::
    \\sqrt{\\varphi}\\; b^{-1/2} \\sum_{i \\in \\text{call}} g_i
    = B^{-1/2} \\sum_{i \\in \\text{call}} g_i,
    \\qquad \\varphi = b / B,

and the calls of a step add up to the whole batch's gradient, exactly when the
micro-batches are equal. A plain mean over ``k`` micro-batches (each loss
divided by ``k``) leaves a unit-scaled step ``k^-½`` of it; summing them,
``k^½``.

Two functions apply the rule, one for each place a loop normalises a loss:

* :func:`step_mean`, inside the model: a sum-reduced loss divided by a count of
  the whole step that the caller passes in (Hugging Face's
  ``num_items_in_batch``). :func:`~unit_scaling.transforms.unit_scale` rewrites
  ``loss_sum / N`` into it when ``N`` is an argument of the call.
* :func:`micro_batch_loss`, in a training loop: a micro-batch's loss before
  ``backward``, in place of ``loss / k``.

Across processes the same rule gives :mod:`unit_scaling.parallel`'s ``sum / √W``
when each process's loss counts its own examples, and a plain sum when the
count ``N`` already counts every process's (``φ`` then holds the ``1/W``).
"""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor

from .._autograd import Function

__all__ = ["micro_batch_loss", "step_mean"]

Number = int | float


class _StepShare(Function):
    """``loss / divisor`` in the forward pass (torch's division, so the value is
    exactly the plain loss's), the gradient times ``scale`` in the backward."""

    @staticmethod
    def forward(
        loss: Tensor, divisor: Tensor | Number, scale: Tensor | Number
    ) -> Tensor:
        return loss / divisor

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        ctx.scale = inputs[2]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        return grad * ctx.scale, None, None


class _MicroBatchShare(_StepShare):
    """:class:`_StepShare` for :func:`micro_batch_loss`: a class of its own so
    that a loss's autograd graph tells the two apart (a loss through
    :func:`step_mean` already holds its share of the step; see
    ``unit_scaling.integrations.accelerate.carries_step_share``)."""


def _check_loss(function: str, loss: Any) -> None:
    if not isinstance(loss, Tensor) or not loss.is_floating_point():
        raise TypeError(
            f"U.{function}: expected the loss as a floating-point tensor, got "
            f"{type(loss).__name__ if not isinstance(loss, Tensor) else loss.dtype}"
        )


def _check_count(function: str, name: str, value: Any) -> None:
    """Counts are tensors (not inspected: that would sync) or positive numbers."""
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(
                f"U.{function}: {name} must hold one number, got a tensor of shape "
                f"{tuple(value.shape)}"
            )
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"U.{function}: {name} must be a number or a one-element tensor, got "
            f"{type(value).__name__}"
        )
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(
            f"U.{function}: {name} must be a finite count >= 0, got {value!r}"
        )


def step_mean(
    loss: Tensor, count: Tensor | Number, step_count: Tensor | Number
) -> Tensor:
    """A sum-reduced loss over ``count`` elements, divided by ``step_count``,
    the elements of the whole optimizer step it is part of.

    .. math::
        y = L_{sum} / N, \\qquad
        \\partial_{L_{sum}} = \\sqrt{n / N}\\; \\partial_y

    for ``n = count`` and ``N = step_count``: the forward is torch's ``loss /
    step_count``; the backward gives the unit-scaled sum's gradient its share
    ``φ = n / N`` of the step (see the module docstring), so that the calls of
    a step, accumulated, compute one call's gradient on the whole step. With
    ``N = n`` it is a mean whose gradient is the unit-scaled loss's own.
    Tensors are used as they are, on the device: no host synchronisation.

    Args:
        loss: a sum-reduced, unit-scaled loss (e.g.
            ``U.cross_entropy(..., reduction="sum")``), one element.
        count: the elements ``loss`` sums (e.g. the targets that are not
            ``ignore_index``); a number or a one-element tensor.
        step_count: the same elements counted over the whole step; a number or
            a one-element tensor (an integer tensor is divided as torch divides).

    Example::

        >>> logits = torch.randn(64, 100, requires_grad=True)
        >>> targets = torch.randint(100, (64,))
        >>> total = U.cross_entropy(logits, targets, reduction="sum")
        >>> U.step_mean(total, 64, 256).backward()   # a quarter of the step
        >>> round(logits.grad.pow(2).mean().sqrt().item(), 1)  # sqrt(1/4)
        0.5
    """
    _check_loss("step_mean", loss)
    _check_count("step_mean", "count", count)
    _check_count("step_mean", "step_count", step_count)
    if isinstance(count, Tensor) or isinstance(step_count, Tensor):
        share = (count / step_count) ** 0.5
        if isinstance(share, Tensor) and share.device != loss.device:
            share = share.to(loss.device)
    else:
        share = math.sqrt(count / step_count) if step_count else math.inf
    out: Tensor = _StepShare.apply(loss, step_count, share)
    return out


def micro_batch_loss(loss: Tensor, fraction: Tensor | Number) -> Tensor:
    """A micro-batch's loss as a unit-scaled step accumulates it: ``loss ·
    fraction`` in the forward pass (what a loop logs, summing to the step's
    mean), ``fraction^½`` on its gradient (see the module docstring).

    .. math::
        y = \\varphi\\, L, \\qquad \\partial_L = \\sqrt{\\varphi}\\; \\partial_y

    Use it in place of ``loss / k`` for one of ``k`` equal micro-batches
    (``fraction = 1 / k``), or with each micro-batch's share of the step's
    elements (tokens) when they differ. For a model that is not unit-scaled,
    whose gradient is a plain mean, keep ``loss * fraction``.

    Args:
        loss: the micro-batch's unit-scaled loss, a mean over its own elements
            (e.g. ``model.loss(batch)``).
        fraction: its share of the step, in ``(0, 1]``; a number or a
            one-element tensor.

    Raises:
        ValueError: a number outside ``(0, 1]``.

    Example::

        >>> logits = torch.randn(64, 100, requires_grad=True)
        >>> loss = U.cross_entropy(logits, torch.randint(100, (64,)))
        >>> U.micro_batch_loss(loss, 1 / 4).backward()   # one of 4 micro-batches
        >>> round(logits.grad.pow(2).mean().sqrt().item(), 1)
        0.5
    """
    _check_loss("micro_batch_loss", loss)
    _check_count("micro_batch_loss", "fraction", fraction)
    if isinstance(fraction, Tensor):
        out: Tensor = _MicroBatchShare.apply(loss, 1 / fraction, fraction**0.5)
        return out
    if not 0 < fraction <= 1:
        raise ValueError(
            "U.micro_batch_loss: fraction must be the micro-batch's share of the "
            f"step, in (0, 1], got {fraction!r}"
        )
    if fraction == 1:
        return loss
    out = _MicroBatchShare.apply(loss, 1 / fraction, math.sqrt(fraction))
    return out
