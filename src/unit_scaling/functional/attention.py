"""Unit-scaled ``scaled_dot_product_attention``.

The u-μP softmax temperature is passed as the ``scale=`` argument torch already
takes, and the single output/gradient scale is one multiply of the output, so a
unit-scaled attention costs the same as torch's (the fused kernels included).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..scale import scale_bwd
from ._scaling import attention_scales

__all__ = ["scaled_dot_product_attention"]


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    mult: float = 1.0,
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.scaled_dot_product_attention`.

    With head dimension ``d`` (the last dimension of ``query``) and key sequence
    length ``s``, the softmax temperature is the u-μP :math:`m / d` rather than
    :math:`d^{-1/2}`, and the output and the ``query``, ``key`` and ``value``
    gradients share one scale ``c``:

    .. math::
        y = c\\, \\mathrm{softmax}\\!\\left(\\frac{m}{d}\\, Q K^T + M\\right)
            \\mathrm{dropout}_p(V), \\qquad
        c = \\frac{\\sqrt{1 - p}}{\\ell^{1-w}}, \\quad
        w = \\mathrm{sigmoid}\\!\\left(\\ln \\frac{m^2}{4 d}\\right), \\quad
        \\ell = \\sqrt{\\frac{\\lambda}{s}}

    where :math:`\\lambda = 1`, or :math:`\\lambda = \\max(\\ln s, 1)` when
    ``is_causal``. For unit-normal inputs and small :math:`m/\\sqrt d` attention is
    nearly uniform, so each output averages ``s`` values (``ln s`` on average
    under a causal mask) and has RMS ``ell``; as ``m`` grows attention tends to
    one-hot and the RMS to 1. ``sqrt(1 - p)`` undoes the variance that dropout on
    the attention probabilities adds. Since every scale equals ``c`` the backward
    pass is the true gradient of the forward. The output and the value gradient
    are unit-scaled; the query and key gradients are not (as in u-μP): while
    attention is nearly uniform their RMS is about :math:`m / \\sqrt d`. The floor
    of 1 on ``ln s`` only matters for ``s ≤ 2``, where ``ln s`` would vanish.

    A ``scale`` given explicitly (as models written for torch do) is kept as the
    softmax temperature, times ``mult``: the effective ``m`` is
    :math:`m \\cdot \\mathrm{scale} \\cdot d`. The :func:`unit_scale` transform relies
    on this to keep a model's own temperature (usually :math:`d^{-1/2}`), which
    also keeps its query and key gradients near unit scale.

    With an ``attn_mask`` (boolean: ``True`` attends; or float: added to the
    scores, where values below half the dtype's minimum mask a key out) the
    uniform-attention RMS is measured from the mask itself, on the device:
    :math:`\\ell = \\sqrt{\\operatorname{mean}_i 1/n_i}` with :math:`n_i` the number
    of keys query ``i`` may attend to. This reduces to the rule above for a full
    mask (:math:`n_i = s`) and for a causal one (:math:`\\operatorname{mean}_i 1/i
    \\approx \\ln s / s`), and covers padding and the explicit causal masks that
    Hugging Face models pass instead of ``is_causal``.

    A float ``attn_mask`` that requires grad (a learned relative position bias)
    is added to every score it is broadcast over, ``N`` of them per element: its
    gradient sums ``N`` terms, so it is scaled by ``N^-1/2``, as a broadcast
    operand's is. ``N`` is read from each call's shapes, since it grows with the
    batch (a gradient accumulated over micro-batches must scale with it too; see
    :mod:`unit_scaling.functional.steps`).

    Args:
        query: ``(..., Hq, L, d)``.
        key: ``(..., Hk, S, d)``.
        value: ``(..., Hk, S, Ev)``.
        attn_mask: optional mask broadcastable to ``(..., Hq, L, S)``.
        dropout_p: dropout probability on the attention weights (applied whenever
            it is nonzero, as in torch; pass 0 in evaluation).
        is_causal: apply a causal mask (aligned to the top-left corner, as torch).
        scale: optional softmax temperature, multiplied by ``mult`` (see above).
        enable_gqa: allow grouped-query attention (``Hq`` a multiple of ``Hk``).
        mult: the u-μP temperature ``m > 0``.

    Example::

        >>> q, k, v = torch.randn(3, 16, 8, 256, 64).unbind(0)
        >>> y = U.scaled_dot_product_attention(q, k, v)
        >>> round(y.std().item(), 1)
        1.0
    """
    temperature, c = attention_scales(
        "U.scaled_dot_product_attention",
        query,
        key,
        value,
        attn_mask,
        dropout_p,
        is_causal,
        scale,
        enable_gqa,
        mult,
    )
    if attn_mask is not None and attn_mask.requires_grad:
        attn_mask = _learned_mask(attn_mask, query, key)
    out = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attn_mask,
        dropout_p=dropout_p,
        is_causal=is_causal,
        scale=temperature,
        enable_gqa=enable_gqa,
    )
    return out if isinstance(c, float) and c == 1 else out * c


def _learned_mask(attn_mask: Tensor, query: Tensor, key: Tensor) -> Tensor:
    """``attn_mask`` with its gradient scaled by ``N^-1/2``, ``N`` the scores
    each of its elements is added to."""
    scores = (*query.shape[:-1], key.shape[-2])
    shape = torch.broadcast_shapes(attn_mask.shape, scores)  # type: ignore[no-untyped-call]
    expansion = math.prod(shape) / max(attn_mask.numel(), 1)
    return scale_bwd(attn_mask, expansion**-0.5) if expansion > 1 else attn_mask
