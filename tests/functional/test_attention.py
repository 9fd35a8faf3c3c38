"""Tests for the unit-scaled ``scaled_dot_product_attention``."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import unit_scaling.functional as U
from tests.helpers import gradcheck_scaled, randn, unit_backward


def _rms(t: Tensor) -> float:
    return t.detach().double().pow(2).mean().sqrt().item()


def _expected_scale(
    mult: float, d: int, s: int, is_causal: bool, dropout_p: float = 0.0
) -> float:
    """The spec's rule, restated: sqrt(1-p) / interp(w, sqrt(λ/s), 1)."""
    w = 1 / (1 + 4 * d / mult**2)  # sigmoid(ln(mult² / 4d))
    spread = max(math.log(s), 1.0) if is_causal else 1.0
    lower = math.sqrt(spread / s)
    return math.sqrt(1 - dropout_p) / (lower ** (1 - w))


def _qkv(
    *shape: int, kv_heads: int | None = None, dtype: torch.dtype = torch.float32
) -> tuple[Tensor, Tensor, Tensor]:
    kv_shape = list(shape)
    if kv_heads is not None:
        kv_shape[-3] = kv_heads
    return (
        randn(*shape, dtype=dtype, seed=0),
        randn(*kv_shape, dtype=dtype, seed=1),
        randn(*kv_shape, dtype=dtype, seed=2),
    )


@pytest.mark.parametrize("mult", [0.25, 1.0, 4.0])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(4, 8, 256, 64), (8, 4, 128, 32)])
def test_unit_scale(shape: tuple[int, ...], is_causal: bool, mult: float) -> None:
    # The model interpolates between exact limits; measured within ~10% between.
    q, k, v = _qkv(*shape)
    y = U.scaled_dot_product_attention(q, k, v, is_causal=is_causal, mult=mult)
    unit_backward(y, seed=3)
    assert v.grad is not None
    assert abs(_rms(y) - 1) < 0.15, f"output RMS {_rms(y):.4f}"
    assert abs(_rms(v.grad) - 1) < 0.15, f"value grad RMS {_rms(v.grad):.4f}"


@pytest.mark.parametrize("mult", [0.25, 1.0])
def test_query_key_grads_are_about_mult_over_sqrt_d(mult: float) -> None:
    # Documented behaviour: q/k gradients are not unit-scaled while attention is
    # nearly uniform; their RMS is about mult / sqrt(d).
    q, k, v = _qkv(4, 8, 256, 64)
    unit_backward(U.scaled_dot_product_attention(q, k, v, mult=mult), seed=3)
    assert q.grad is not None and k.grad is not None
    for t in (q.grad, k.grad):
        assert _rms(t) == pytest.approx(mult / 8, rel=0.15)


def _masked_scale(mult: float, d: int, keys_per_query: Tensor) -> float:
    """The mask-aware rule, restated: lower = sqrt(mean_i 1/n_i)."""
    w = 1 / (1 + 4 * d / mult**2)
    lower = keys_per_query.double().reciprocal().mean().sqrt().item()
    return float(lower ** (w - 1))


def _check_matches_torch(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mult: float = 1.0,
    c: float | None = None,
    **kwargs: Any,
) -> None:
    """U.sdpa == c * F.sdpa(scale=mult/d), gradients included."""
    d, s = q.shape[-1], k.shape[-2]
    if c is None:
        c = _expected_scale(mult, d, s, bool(kwargs.get("is_causal", False)))
    refs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    y = U.scaled_dot_product_attention(q, k, v, mult=mult, **kwargs)
    y_ref = F.scaled_dot_product_attention(*refs, scale=mult / d, **kwargs)
    torch.testing.assert_close(y, c * y_ref)
    grad = unit_backward(y, seed=5)
    y_ref.backward(grad)
    for t, t_ref in zip((q, k, v), refs, strict=True):
        assert t.grad is not None and t_ref.grad is not None
        torch.testing.assert_close(t.grad, c * t_ref.grad)


@pytest.mark.parametrize("mult", [0.5, 1.0, 3.0])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_matches_torch_times_scale(is_causal: bool, mult: float) -> None:
    _check_matches_torch(*_qkv(2, 3, 10, 16), mult=mult, is_causal=is_causal)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_cross_attention_uses_key_length(is_causal: bool) -> None:
    q = randn(2, 3, 5, 16, seed=0)
    k, v = randn(2, 3, 9, 16, seed=1), randn(2, 3, 9, 8, seed=2)
    _check_matches_torch(q, k, v, mult=2.0, is_causal=is_causal)


def test_masks_pass_through_and_set_the_scale() -> None:
    keep = torch.rand(10, 10, generator=torch.Generator().manual_seed(0)) > 0.3
    keep |= torch.eye(10, dtype=torch.bool)  # no fully masked rows
    c = _masked_scale(2.0, 16, keep.sum(-1))
    _check_matches_torch(*_qkv(2, 3, 10, 16), mult=2.0, attn_mask=keep, c=c)
    # An additive mask: -inf (or the dtype's minimum) masks out, biases do not.
    additive = torch.zeros(10, 10).masked_fill(~keep, float("-inf"))
    _check_matches_torch(*_qkv(2, 3, 10, 16), mult=2.0, attn_mask=additive, c=c)
    bias = torch.randn(2, 1, 10, 10, generator=torch.Generator().manual_seed(1))
    full = _masked_scale(2.0, 16, torch.full((10,), 10))
    _check_matches_torch(*_qkv(2, 3, 10, 16), mult=2.0, attn_mask=bias, c=full)


def test_a_learned_mask_gradient_is_scaled_by_its_broadcast() -> None:
    # A relative position bias (3 heads, 10 x 10) added to the scores of every
    # example: its gradient sums the batch's, times batch^-1/2 for each batch
    # (the same bias given at full size gets the terms of that sum).
    for batch in (4, 2):
        q, k, v = _qkv(batch, 3, 10, 16)
        bias = randn(3, 10, 10, seed=3).requires_grad_()
        full = bias.detach().expand(batch, -1, -1, -1).clone().requires_grad_()
        for mask in (bias, full):
            y = U.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            unit_backward(y, seed=4)
        assert bias.grad is not None and full.grad is not None
        torch.testing.assert_close(bias.grad, batch**-0.5 * full.grad.sum(0))


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32])
def test_explicit_causal_mask_is_unit_scaled_like_is_causal(dtype: torch.dtype) -> None:
    # Hugging Face models pass a causal mask instead of is_causal=True.
    q, k, v = _qkv(4, 8, 256, 64)
    causal = torch.ones(256, 256, dtype=torch.bool).tril()
    mask = (
        causal
        if dtype == torch.bool
        else torch.zeros(256, 256).masked_fill(~causal, torch.finfo(torch.float32).min)
    )
    y = U.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    reference = U.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert abs(_rms(y) - 1) < 0.15
    # Same scale up to mean(1/i) = H_s/s versus the rule's ln(s)/s.
    assert _rms(y) / _rms(reference) == pytest.approx(1, rel=0.1)


def test_grouped_query_attention() -> None:
    q, k, v = _qkv(2, 8, 10, 16, kv_heads=2)
    _check_matches_torch(q, k, v, mult=2.0, is_causal=True, enable_gqa=True)


def test_explicit_scale_is_the_temperature_times_mult() -> None:
    q, k, v = _qkv(2, 3, 10, 16)
    d = q.shape[-1]
    # A model passing torch's 1/sqrt(d) keeps that temperature: m = sqrt(d).
    standard = U.scaled_dot_product_attention(q, k, v, scale=d**-0.5)
    torch.testing.assert_close(
        standard, U.scaled_dot_product_attention(q, k, v, mult=d**0.5)
    )
    # In general the effective mult is mult * scale * d: here 2 * 0.125 * 16 = 4.
    scaled = U.scaled_dot_product_attention(q, k, v, scale=0.125, mult=2.0)
    c = _expected_scale(4.0, d, 10, is_causal=False)
    plain = F.scaled_dot_product_attention(q, k, v, scale=0.25)
    torch.testing.assert_close(scaled, c * plain)


def test_dropout_scale_keeps_unit_scale() -> None:
    # Dropout on near-uniform attention weights multiplies the output variance by
    # 1/(1-p); the sqrt(1-p) factor cancels it (without it the ratio is sqrt 2).
    q, k, v = _qkv(4, 8, 256, 64)
    torch.manual_seed(0)
    y_drop = U.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    y = U.scaled_dot_product_attention(q, k, v)
    assert _rms(y_drop) / _rms(y) == pytest.approx(1.0, abs=0.05)
    unit_backward(y_drop, seed=3)
    assert v.grad is not None
    assert abs(_rms(v.grad) - 1) < 0.15


def test_dropout_matches_torch_with_the_same_mask() -> None:
    q, k, v = _qkv(2, 3, 10, 16)
    c = _expected_scale(1.0, 16, 10, is_causal=False, dropout_p=0.25)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        y = U.scaled_dot_product_attention(q, k, v, dropout_p=0.25)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        y_ref = F.scaled_dot_product_attention(q, k, v, dropout_p=0.25, scale=1 / 16)
    torch.testing.assert_close(y, c * y_ref)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_gradcheck(is_causal: bool) -> None:
    q, k, v = _qkv(1, 2, 4, 3, dtype=torch.float64)
    c = _expected_scale(2.0, 3, 4, is_causal)

    def attention(*qkv: Tensor) -> Tensor:
        return U.scaled_dot_product_attention(*qkv, is_causal=is_causal, mult=2.0)

    assert gradcheck_scaled(attention, [q, k, v], c, [c, c, c])


def _sdpa_with_shapes(
    q_shape: tuple[int, ...], kv_shape: tuple[int, ...], **kwargs: Any
) -> Callable[[], Tensor]:
    def call() -> Tensor:
        q, k = torch.randn(q_shape), torch.randn(kv_shape)
        v = torch.randn(kv_shape)
        return U.scaled_dot_product_attention(q, k, v, **kwargs)

    return call


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (_sdpa_with_shapes((2, 4, 8), (2, 4, 16)), r"same, nonzero head dimension"),
        (_sdpa_with_shapes((2, 4, 0), (2, 4, 0)), r"nonzero head dimension"),
        (_sdpa_with_shapes((8,), (8,)), r"at least 2 dimensions.*\(8,\)"),
        (
            _sdpa_with_shapes((2, 6, 4, 8), (2, 4, 4, 8), enable_gqa=True),
            "enable_gqa=True",
        ),
        (_sdpa_with_shapes((2, 4, 8), (2, 4, 8), dropout_p=1.5), "dropout_p must be"),
        (_sdpa_with_shapes((2, 4, 8), (2, 4, 8), mult=0.0), "mult must be a positive"),
        (_sdpa_with_shapes((2, 4, 8), (2, 4, 8), scale=-1.0), "scale must be positive"),
    ],
)
def test_bad_arguments_raise(call: Callable[[], Tensor], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def test_key_value_length_mismatch_raises() -> None:
    q, k, v = torch.randn(2, 4, 8), torch.randn(2, 5, 8), torch.randn(2, 6, 8)
    with pytest.raises(ValueError, match=r"same sequence length S.*\(2, 6, 8\)"):
        U.scaled_dot_product_attention(q, k, v)


def test_compile_fullgraph_matches_eager() -> None:
    def attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return U.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=0.25, enable_gqa=True, mult=2.0
        )

    compiled = torch.compile(attention, fullgraph=True)
    inputs = _qkv(2, 4, 16, 16, kv_heads=2)
    inputs_ref = [t.detach().clone().requires_grad_() for t in inputs]
    y, y_ref = compiled(*inputs), attention(*inputs_ref)
    torch.testing.assert_close(y, y_ref)
    grad = unit_backward(y, seed=3)
    y_ref.backward(grad)
    for t, t_ref in zip(inputs, inputs_ref, strict=True):
        torch.testing.assert_close(t.grad, t_ref.grad)
