"""The FP8 linear layer's function: its three GEMMs in FP8 with the unit-scaled
linear's own static scales, as :func:`linear` and :func:`linear_readout`."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .. import functional as U
from ..constraints import apply_constraint
from ..functional._checks import check_linear_args, validate_constraint
from . import _fsdp, _gemm
from ._config import Float8Config, check_config, output_dtype

# The scale powers of unit_scaling.functional.linear_readout.
READOUT_POWER = (1.0, 0.5, 0.5)


class _Float8LinearFn(torch.autograd.Function):
    """``y = a (x Wᵀ + b)``; ``∂x = c ∂y W``; ``∂W = d ∂yᵀ x``; ``∂b = d Σ ∂y``,
    each GEMM in FP8 where ``config`` says so."""

    @staticmethod
    def forward(
        ctx: Any,
        input: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        scales: tuple[float, float, float],
        config: Float8Config,
        out_dtype: torch.dtype,
    ) -> Tensor:
        alpha = scales[0]
        x = input.reshape(-1, input.shape[-1])
        pad = config.unsupported_shapes == "pad"
        xq = wq = None
        if config.output or config.save_fp8_inputs:
            xq = _gemm.cast(x, config.forward_dtype)
            wq = _fsdp.fp8(weight, config.forward_dtype)
        if config.output:
            assert xq is not None and wq is not None
            a, b = (
                (_gemm.pad(xq, 1), _gemm.pad(_gemm.pad(wq, 1), 0)) if pad else (xq, wq)
            )
            y = _gemm.gemm(a, b.t(), alpha, out_dtype)[:, : weight.shape[0]]
        else:
            y = torch.mm(x.to(out_dtype), weight.to(out_dtype).t()).mul_(alpha)
        if bias is not None:
            y = y + (alpha * bias).to(out_dtype)
        if config.save_fp8_inputs:
            ctx.save_for_backward(xq, wq)
        else:
            ctx.save_for_backward(x, weight)
        ctx.scales, ctx.config = scales, config
        ctx.shapes = (input.shape, input.dtype, weight.dtype, bias is not None)
        return y.reshape(*input.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        _, beta_x, beta_w = ctx.scales
        config: Float8Config = ctx.config
        input_shape, input_dtype, weight_dtype, has_bias = ctx.shapes
        pad = config.unsupported_shapes == "pad"
        g = grad_output.reshape(-1, grad_output.shape[-1])
        needs_input, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        gq = None
        if (needs_input and config.grad_input) or (needs_weight and config.grad_weight):
            gq = _gemm.cast(g, config.gradient_dtype)
        grad_input = grad_weight = grad_bias = None
        if needs_input:
            if config.grad_input:
                assert gq is not None
                if pad:
                    wq = _fsdp.fp8(weight, config.forward_dtype)
                    a = _gemm.pad(gq, 1)
                    b = _gemm.column_major(_gemm.pad(_gemm.pad(wq, 0), 1))
                else:
                    a, b = gq, _fsdp.fp8_column_major(weight, config.forward_dtype)
                grad_input = _gemm.gemm(a, b, beta_x, input_dtype)
                grad_input = grad_input[:, : input_shape[-1]]
            else:
                w = weight.to(g.dtype)
                grad_input = torch.mm(g, w).mul_(beta_x).to(input_dtype)
            grad_input = grad_input.reshape(input_shape)
        if needs_weight:
            if config.grad_weight:
                assert gq is not None
                # The GEMM's inner dimension is the tokens': padded too.
                a = _gemm.pad(gq, 0).t()
                if pad or x.shape[0] % _gemm.MULTIPLE:
                    b = _gemm.pad(_fsdp.fp8(x, config.forward_dtype), 0)
                    if pad:
                        a, b = _gemm.pad(a, 0), _gemm.pad(b, 1)
                    b = _gemm.column_major(b)
                else:
                    b = _fsdp.fp8_column_major(x, config.forward_dtype)
                grad_weight = _gemm.gemm(a.contiguous(), b, beta_w, weight_dtype)
                grad_weight = grad_weight[: g.shape[1], : x.shape[1]]
            else:
                grad_weight = torch.mm(g.t(), x.to(g.dtype)).mul_(beta_w)
                grad_weight = grad_weight.to(weight_dtype)
        if has_bias and needs_bias:
            grad_bias = g.sum(0).mul_(beta_w)
        return grad_input, grad_weight, grad_bias, None, None, None


def linear(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    constraint: str | None = "to_output_scale",
    scale_power: tuple[float, float, float] = (0.5, 0.5, 0.5),
    *,
    config: Float8Config | None = None,
) -> Tensor:
    """:func:`unit_scaling.functional.linear` with its GEMMs in FP8.

    The same function and scales (``alpha = fan_in^-p0``, ``beta_x =
    fan_out^-p1``, ``beta_W = batch^-p2``, tied by ``constraint``), each scale
    passed to ``torch._scaled_mm`` as its dequantisation scale. A layer whose
    sizes are not multiples of 16 follows ``config.unsupported_shapes``.

    Example::

        >>> from unit_scaling import float8
        >>> y = float8.linear(torch.randn(64, 256), torch.randn(512, 256))
        >>> round(y.std().item(), 1)
        1.0
    """
    config = check_config("float8.linear", config)
    check_linear_args("float8.linear", input, weight, bias)
    if not (input.is_floating_point() and weight.is_floating_point()):
        raise TypeError(
            "float8.linear: input and weight must be floating-point tensors, got "
            f"{input.dtype} and {weight.dtype}"
        )
    validate_constraint(constraint)
    fan_out, fan_in = weight.shape
    fits_here = _gemm.fits(fan_in, fan_out)
    if input.numel() == 0 or (not fits_here and config.unsupported_shapes == "keep"):
        return U.linear(input, weight, bias, constraint, scale_power)
    alpha, beta_x = apply_constraint(
        constraint, fan_in ** -scale_power[0], fan_out ** -scale_power[1]
    )
    beta_w = max(input.numel() // max(fan_in, 1), 1) ** -scale_power[2]
    out: Tensor = _Float8LinearFn.apply(  # type: ignore[no-untyped-call]
        input,
        weight,
        bias,
        (alpha, beta_x, beta_w),
        config,
        output_dtype(input, config),
    )
    return out


def linear_readout(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    constraint: str | None = None,
    *,
    config: Float8Config | None = None,
) -> Tensor:
    """:func:`unit_scaling.functional.linear_readout` with its GEMMs in FP8.

    Example::

        >>> from unit_scaling import float8
        >>> float8.linear_readout(torch.randn(8, 64), torch.randn(256, 64)).shape
        torch.Size([8, 256])
    """
    return linear(input, weight, bias, constraint, READOUT_POWER, config=config)
