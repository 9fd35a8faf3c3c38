"""The pattern every unit-scaled op shares, and the arithmetic of its scales.

:func:`scaled_unary` is "the torch op, plus an output scale, plus an input-gradient
scale, plus a constraint" with the fewest passes, and :func:`scaled_affine` the
same for a convolution-like op, with its scales on the weight and bias.
:func:`memoise` caches a pure scale computation, and makes ``torch.compile`` put
its result in the graph as a constant (the one place here that depends on how
Dynamo traces);
:func:`normal_expectation` integrates against the unit normal for scales that
have no closed form; :func:`attention_scales` gives attention's temperature and
output scale. Scales are Python floats computed from shapes and arguments only
(attention's under a mask is a tensor computed on the device): no tensor is read,
so nothing syncs with the device.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, TypeVar, cast

import torch
from torch import Tensor

from .._twoway import scale_twoway
from ..constraints import apply_constraint
from ..core.functional import logarithmic_interpolation
from ..scale import scale_bwd

__all__ = [
    "memoise",
    "normal_expectation",
    "scaled_affine",
    "scaled_unary",
    "sigmoid_of_log",
]

R = TypeVar("R")
Out = TypeVar("Out", bound=Tensor | tuple[Tensor, Tensor])


def scaled_unary(
    f: Callable[[Tensor], Out],
    input: Tensor,
    output_scale: float,
    grad_scale: float,
    constraint: str | None,
    input_mult: float = 1.0,
    output_mult: float = 1.0,
    scale_input: bool = False,
) -> Out:
    """``alpha * k * f(m * x)`` whose input gradient is ``beta * d/dx [k * f(m * x)]``.

    ``(alpha, beta)`` are ``(output_scale, grad_scale)`` after the constraint,
    ``m = input_mult`` and ``k = output_mult``. The temperature multiply carries the
    gradient correction ``beta / alpha`` in its backward (one op for both), and
    ``alpha * k`` is applied in one multiply of the output; either is skipped when
    it is 1.

    ``scale_input=True`` is for a positively homogeneous ``f`` (``f(a x) = a f(x)``
    for ``a > 0``: pooling, interpolation) whose input is the smaller tensor:
    ``alpha`` then multiplies the input instead of the output. When ``f`` returns
    ``(output, indices)`` only the output is scaled.
    """
    alpha, beta = apply_constraint(constraint, output_scale, grad_scale)
    if scale_input:
        x = scale_twoway(input, alpha * input_mult, beta * input_mult)
        out_mult = output_mult
    else:
        x = scale_twoway(input, input_mult, input_mult * beta / alpha)
        out_mult = alpha * output_mult
    y = f(x)
    if out_mult == 1:
        return y
    if isinstance(y, tuple):
        return cast(Out, (y[0] * out_mult, y[1]))
    return cast(Out, y * out_mult)


def scaled_affine(
    f: Callable[[Tensor, Tensor, Tensor | None], Tensor],
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    output_scale: float,
    grad_scales: tuple[float, float, float],
    constraint: str | None,
) -> Tensor:
    """``alpha * f(x, W, b)`` for an ``f`` linear in ``(W, b)`` (a convolution),
    with the gradients of ``(x, W, b)`` scaled by ``grad_scales``.

    ``(alpha, beta_x)`` are ``(output_scale, grad_scales[0])`` after the
    constraint. ``f(x, a W, a b) = a f(x, W, b)``, and its input gradient is ``a``
    times the plain one, so ``alpha`` costs weight-sized multiplies only; the input
    needs its own op only when ``beta_x`` differs from ``alpha``.
    """
    alpha, beta_x = apply_constraint(constraint, output_scale, grad_scales[0])
    input = scale_bwd(input, beta_x / alpha)
    weight = scale_twoway(weight, alpha, grad_scales[1])
    if bias is not None:
        bias = scale_twoway(bias, alpha, grad_scales[2])
    return f(input, weight, bias)


def _specialise(value: Any) -> Any:
    """``value`` with each number a Python constant, also under ``torch.compile``.

    Dynamo traces sizes (and float arguments) symbolically under dynamic shapes
    (``dynamic=True``, or automatically after a recompile), and a scale computed
    by loops over them would build a symbolic expression per iteration (minutes
    of tracing) or fail. Dynamo evaluates the bounds of a ``range`` and the
    items summed by ``math.fsum``, guarding on their values, so
    ``range(n + 1)[-1]`` and ``math.fsum([x])`` are ``n`` and ``x`` as
    constants: these ops specialise on the numbers their scales depend on.
    ``tests/functional/test_compile.py`` fails if a torch upgrade changes this.
    """
    if isinstance(value, tuple):
        return tuple(_specialise(v) for v in value)
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value >= 0:
        return range(value + 1)[-1]
    if isinstance(value, float):
        return math.fsum([value])
    return value


def memoise(fn: Callable[..., R]) -> Callable[..., R]:
    """Cache a pure scale computation of hashable arguments.

    In eager mode the result is cached per argument tuple. Under
    ``torch.compile`` the arguments are specialised (:func:`_specialise`) and the
    function is a :func:`torch.compiler.assume_constant_result`: Dynamo runs it
    (from the same cache) while tracing and puts the result in the graph as a
    constant, rather than tracing its loops over windows and quadrature points
    (seconds per call site).
    """
    cached = functools.lru_cache(maxsize=4096)(fn)
    constant = torch.compiler.assume_constant_result(  # type: ignore[no-untyped-call]
        lambda *args: cached(*args)
    )

    @functools.wraps(fn)
    def call(*args: Any) -> R:
        if torch.compiler.is_compiling():
            return cast(R, constant(*_specialise(args)))
        return cached(*args)

    return call


def normal_expectation(
    f: Callable[[float], float], width: float = 1.0, support: float = 12.0
) -> float:
    """``E[f(x)]`` for ``x ~ N(0, 1)`` by the trapezoid rule on ``[-support, support]``.

    ``f`` must be analytic in a strip of half-width about ``width`` around the
    real axis and negligible beyond ``support``. The trapezoid rule then
    converges exponentially in ``width / step`` (the error is about
    ``exp(-2π · width / step)``); the step is ``width / 4`` (at most ``1/4``), and
    the tests check the results against closed forms to ``1e-9``.
    """
    step = min(width, 1.0) / 4
    n = math.ceil(min(support, 12.0) / step)
    total = 0.0
    for i in range(-n, n + 1):
        x = i * step
        total += f(x) * math.exp(-0.5 * x * x)
    return total * step / math.sqrt(2 * math.pi)


def sigmoid_of_log(z: float) -> float:
    """``sigmoid(ln z) = z / (1 + z)``, the interpolation weight of the u-μP models.

    Written without the logarithm so that ``z = 0`` gives weight 0.
    """
    return z / (1 + z)


def attention_scales(
    op: str,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
    mult: float,
) -> tuple[float, float | Tensor]:
    """The softmax temperature and the output scale ``c`` of the unit-scaled
    attention (see :func:`unit_scaling.functional.scaled_dot_product_attention`),
    after checking the arguments: a ``ValueError`` naming ``op`` for those torch
    would reject deep inside (or silently accept)."""
    if not mult > 0:
        raise ValueError(
            f"{op}: mult must be a positive number (it is a temperature that "
            f"multiplies the input), got mult={mult!r}"
        )
    shapes = (
        f"got query {tuple(query.shape)}, key {tuple(key.shape)} and value "
        f"{tuple(value.shape)}"
    )
    if min(query.dim(), key.dim(), value.dim()) < 2:
        raise ValueError(
            f"{op}: expected query (..., L, E), key (..., S, E) and value "
            f"(..., S, Ev) with at least 2 dimensions; {shapes}"
        )
    if query.shape[-1] != key.shape[-1] or query.shape[-1] == 0:
        raise ValueError(
            f"{op}: query and key must have the same, nonzero head dimension E "
            f"(their last dimension); {shapes}"
        )
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(
            f"{op}: key and value must have the same sequence length S (their "
            f"second-to-last dimension); {shapes}"
        )
    if enable_gqa and min(query.dim(), key.dim(), value.dim()) >= 3:
        q_heads, k_heads, v_heads = query.shape[-3], key.shape[-3], value.shape[-3]
        if k_heads != v_heads or k_heads == 0 or q_heads % k_heads != 0:
            raise ValueError(
                f"{op}: with enable_gqa=True, key and value must have the same "
                "number of heads (dimension -3), dividing the number of query "
                f"heads; {shapes}"
            )
    if attn_mask is not None and is_causal:
        raise ValueError(
            f"{op}: pass either attn_mask or is_causal=True, not both (as torch); "
            "fold the causal mask into attn_mask instead"
        )
    if not 0 <= dropout_p <= 1:
        raise ValueError(
            f"{op}: dropout_p must be a probability between 0 and 1, got "
            f"dropout_p={dropout_p!r}"
        )
    if scale is not None and not scale > 0:
        raise ValueError(
            f"{op}: scale must be positive (it is read as the softmax temperature), "
            f"got scale={scale!r}"
        )
    d = query.shape[-1]
    s = max(key.shape[-2], 1)
    if scale is not None:
        mult = mult * scale * d
    w = sigmoid_of_log(mult**2 / (4 * d))
    c: float | Tensor
    if attn_mask is None:
        spread = max(math.log(s), 1.0) if is_causal else 1.0
        uniform_rms = math.sqrt(spread / s)
        c = math.sqrt(1 - dropout_p) / logarithmic_interpolation(w, uniform_rms, 1.0)
    else:
        c = math.sqrt(1 - dropout_p) * _masked_uniform_rms(attn_mask) ** (w - 1)
    return mult / d, c


def _masked_uniform_rms(attn_mask: Tensor) -> Tensor:
    """RMS of uniform attention under ``attn_mask``: ``sqrt(mean_i 1/n_i)``."""
    if attn_mask.dtype == torch.bool:
        allowed = attn_mask
    else:
        allowed = attn_mask > torch.finfo(attn_mask.dtype).min / 2
    keys = allowed.sum(-1, dtype=torch.float32).clamp_min(1)
    return keys.reciprocal().mean().sqrt()
