"""FP8 attention: ``QKᵀ`` and ``PV`` (and their gradients) as FP8 GEMMs with
static scales, as :func:`scaled_dot_product_attention`."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..functional._scaling import attention_scales
from . import _gemm
from ._config import Float8Config, check_config, output_dtype

# Attention's probabilities lie in [0, 1] (at most 1/(1-p) after dropout): cast
# times 2^8, they keep E4M3's precision down to 2^-14 and never saturate (448).
_PROBS_SCALE = 256.0


class _Float8MatmulFn(torch.autograd.Function):
    """``y = scale (a @ b)`` over matching leading dimensions, in FP8: forward
    ``E4M3(sa a) @ E4M3(sb b)`` dequantised by ``scale / (sa sb)``; backward
    ``∂a = E5M2(g) @ E4M3(sb b)ᵀ · scale / sb`` and ``∂b = E4M3(sa a)ᵀ @ E5M2(g)
    · scale / sa``. ``sa`` and ``sb`` are static; the FP8 operands are what is
    saved for the backward pass."""

    @staticmethod
    def forward(
        ctx: Any,
        a: Tensor,
        b: Tensor,
        scales: tuple[float, float, float],
        config: Float8Config,
        out_dtype: torch.dtype,
    ) -> Tensor:
        scale, sa, sb = scales
        batch = a.shape[:-2]
        aq = _gemm.cast(a.reshape(-1, *a.shape[-2:]) * sa, config.forward_dtype)
        bq = _gemm.cast(b.reshape(-1, *b.shape[-2:]) * sb, config.forward_dtype)
        y = _gemm.batched_gemm(aq, bq, scale / (sa * sb), out_dtype)
        ctx.save_for_backward(aq, bq)
        ctx.scales, ctx.config = scales, config
        ctx.dtypes = (a.dtype, b.dtype)
        return y.reshape(*batch, *y.shape[-2:])

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:
        aq, bq = ctx.saved_tensors
        scale, sa, sb = ctx.scales
        config: Float8Config = ctx.config
        g = grad_output.reshape(-1, *grad_output.shape[-2:])
        gq = _gemm.cast(g, config.gradient_dtype)
        grad_a = grad_b = None
        if ctx.needs_input_grad[0]:
            bt = bq.transpose(1, 2).contiguous()
            grad_a = _gemm.batched_gemm(gq, bt, scale / sb, ctx.dtypes[0])
            grad_a = grad_a.reshape(*grad_output.shape[:-2], *aq.shape[-2:])
        if ctx.needs_input_grad[1]:
            at = aq.transpose(1, 2).contiguous()
            grad_b = _gemm.batched_gemm(at, gq, scale / sa, ctx.dtypes[1])
            grad_b = grad_b.reshape(*grad_output.shape[:-2], *bq.shape[-2:])
        return grad_a, grad_b, None, None, None


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
    *,
    config: Float8Config | None = None,
) -> Tensor:
    """:func:`unit_scaling.functional.scaled_dot_product_attention` with its
    matrix products in FP8 (what ``Float8Config(attention=True)`` runs).

    The same function and scales (temperature, output scale ``c`` from the
    mask, GQA, dropout), computed explicitly: ``S = QKᵀ`` as FP8 GEMMs (E4M3 ×
    E4M3, the temperature as the dequantisation scale), the mask and the
    softmax in float32, then ``P V`` with ``P`` cast to E4M3 times the static
    scale 256 (probabilities lie in ``[0, 1]``: no amax is needed for them
    either). The backward products take the gradient in ``config``'s gradient
    format. Not a fused kernel: one ``_scaled_mm`` per batch and head, and the
    ``L × S`` scores are materialised; use it to measure FP8 attention's
    numerics, not its speed.

    Example::

        >>> from unit_scaling import float8
        >>> q, k, v = torch.randn(3, 4, 8, 256, 64).unbind(0)
        >>> y = float8.scaled_dot_product_attention(q, k, v)
        >>> round(y.std().item(), 1)
        1.0
    """
    config = check_config("float8.scaled_dot_product_attention", config)
    if not all(t.is_floating_point() for t in (query, key, value)):
        raise TypeError(
            "float8.scaled_dot_product_attention: query, key and value must be "
            f"floating-point tensors, got {query.dtype}, {key.dtype} and {value.dtype}"
        )
    temperature, c = attention_scales(
        "float8.scaled_dot_product_attention",
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
    if enable_gqa and key.dim() >= 3 and key.shape[-3] != query.shape[-3]:
        groups = query.shape[-3] // key.shape[-3]
        key = key.repeat_interleave(groups, -3)
        value = value.repeat_interleave(groups, -3)
    shapes = (query.shape[:-2], key.shape[:-2], value.shape[:-2])
    batch = torch.broadcast_shapes(*shapes)  # type: ignore[no-untyped-call]
    query = query.expand(*batch, *query.shape[-2:])
    key = key.expand(*batch, *key.shape[-2:])
    value = value.expand(*batch, *value.shape[-2:])
    scores: Tensor = _Float8MatmulFn.apply(  # type: ignore[no-untyped-call]
        query, key.transpose(-2, -1), (temperature, 1.0, 1.0), config, torch.float32
    )
    if is_causal:
        length, keys = scores.shape[-2:]
        allowed = torch.ones(length, keys, dtype=torch.bool, device=scores.device)
        attn_mask = allowed.tril()
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, -math.inf)
        else:
            scores = scores + attn_mask
    probs = scores.softmax(-1)
    if dropout_p > 0:
        probs = F.dropout(probs, dropout_p)
    probs_scale = _PROBS_SCALE * max(1 - dropout_p, 1 / _PROBS_SCALE)
    out_scale = c if isinstance(c, float) else 1.0
    out: Tensor = _Float8MatmulFn.apply(  # type: ignore[no-untyped-call]
        probs,
        value,
        (out_scale, probs_scale, 1.0),
        config,
        output_dtype(query, config),
    )
    return out if isinstance(c, float) else out * c
