"""Real FP8 training with static unit scales: ``convert_to_float8_training``.

A unit-scaled linear layer's operands already sit near unit scale, so its three
matrix products can run in FP8 through ``torch._scaled_mm`` with **no per-tensor
scale bookkeeping**: a saturating cast of each operand, then one scaled GEMM
whose dequantisation scale is the op's own static scale (``alpha`` forward,
``beta_x`` and ``beta_W`` backward). No amax reduction, no extra pass over a
tensor, no host synchronisation — unlike dynamic ("current") scaling, which
reduces every operand to its absolute maximum before each GEMM.

The GEMMs, for ``y = alpha (x Wᵀ + b)``:

* forward: ``E4M3(x) @ E4M3(W)ᵀ`` with scale ``alpha``;
* input gradient: ``E5M2(g) @ E4M3(W)`` with scale ``beta_x``;
* weight gradient: ``E5M2(g)ᵀ @ E4M3(x)`` with scale ``beta_W``
  (E5M2 × E5M2 is not a cuBLAS FP8 GEMM).

Casts saturate (to ±448 for E4M3, ±57344 for E5M2), as the simulation in
:func:`unit_scaling.transforms.simulate_fp8` does, so a real FP8 layer computes
what the simulated one computes, up to the order of accumulation.

Example::

    >>> model = uu.TransformerDecoder(64, 256, layers=2, heads=4)
    >>> model = convert_to_float8_training(model)
    >>> type(model.layers[0].mlp.linear_1).__name__
    'Float8Linear'
    >>> model.loss(torch.randint(256, (2, 33))).shape
    torch.Size([])
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.fx import GraphModule

from . import functional as U
from ._fx_names import module_path
from ._torch_internals import (
    disabled_torch_function,
    onednn_enabled,
    pytree,
    scaled_mm,
    set_onednn_enabled,
)
from .constraints import apply_constraint
from .functional._checks import check_linear_args, validate_constraint
from .functional._scaling import attention_scales
from .modules import MHSA, Linear, LinearReadout
from .transforms._engine import Place, Transform, extend_in_place, transform_state
from .transforms._graph import example_value
from .transforms._rules import UNIT_SCALED_FUNCTIONS

__all__ = [
    "Float8Config",
    "Float8Linear",
    "Float8LinearReadout",
    "Float8MHSA",
    "convert_to_float8_training",
    "linear",
    "linear_readout",
    "scaled_dot_product_attention",
]

logger = logging.getLogger(__name__)
M = TypeVar("M", bound=nn.Module)
T = TypeVar("T", bound=Tensor)

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
# cuBLAS's FP8 GEMMs take dimensions that are multiples of 16.
_MULTIPLE = 16
_READOUT_POWER = (1.0, 0.5, 0.5)


@dataclasses.dataclass(frozen=True)
class Float8Config:
    """How :func:`convert_to_float8_training` runs the linear layers in FP8.

    Args:
        forward_dtype: format of the forward operands (``x`` and ``W``).
        gradient_dtype: format of the output gradient.
        output: run the forward GEMM in FP8.
        grad_input: run the input-gradient GEMM in FP8.
        grad_weight: run the weight-gradient GEMM in FP8.
        output_dtype: dtype of the layer's output (and of the input gradient);
            ``None``: the input's, or autocast's where autocast is on.
        save_fp8_inputs: save FP8 copies of ``x`` and ``W`` for the backward
            pass (a quarter of the float32 activation memory, half of bf16's);
            a backward GEMM kept in high precision then sees the FP8 values.
        unsupported_shapes: what to do with a layer whose ``in_features`` or
            ``out_features`` is not a multiple of 16 (what cuBLAS takes):
            ``"keep"`` it in high precision, or ``"pad"`` its operands with zeros.
        fsdp_fp8_all_gather: under :func:`unit_scaling.parallel.fully_shard`,
            gather the weights in FP8 (a quarter of float32's bytes, cast with
            the static scale 1 before the all-gather: no amax all-reduce).
        attention: run attention's matrix products in FP8 too (off by default:
            they stay in high precision): :func:`scaled_dot_product_attention`
            in place of the unit-scaled attention, for ``QKᵀ``, ``PV`` and their
            four gradient products. The ``output``/``grad_*`` fields are the
            linear layers' only.

    Example::

        >>> Float8Config(grad_weight=False).grad_weight
        False
    """

    forward_dtype: torch.dtype = torch.float8_e4m3fn
    gradient_dtype: torch.dtype = torch.float8_e5m2
    output: bool = True
    grad_input: bool = True
    grad_weight: bool = True
    output_dtype: torch.dtype | None = None
    save_fp8_inputs: bool = False
    unsupported_shapes: Literal["keep", "pad"] = "keep"
    fsdp_fp8_all_gather: bool = True
    attention: bool = False

    def __post_init__(self) -> None:
        for name in ("forward_dtype", "gradient_dtype"):
            value = getattr(self, name)
            if value not in _FP8:
                raise ValueError(
                    f"Float8Config: {name} must be torch.float8_e4m3fn or "
                    f"torch.float8_e5m2, got {value!r}"
                )
        if self.forward_dtype == self.gradient_dtype == torch.float8_e5m2 and (
            self.grad_weight or self.attention
        ):
            raise ValueError(
                "Float8Config: the weight-gradient GEMM (and attention's backward) "
                "would be E5M2 x E5M2, which cuBLAS does not run; use "
                "forward_dtype=torch.float8_e4m3fn, or grad_weight=False and "
                "attention=False"
            )
        if self.output_dtype is not None and not (
            isinstance(self.output_dtype, torch.dtype)
            and self.output_dtype.is_floating_point
            and self.output_dtype not in _FP8
        ):
            raise ValueError(
                "Float8Config: output_dtype must be None or a floating-point "
                "dtype wider than FP8 (float32, bfloat16, float16), got "
                f"{self.output_dtype!r}"
            )
        if self.unsupported_shapes not in ("keep", "pad"):
            raise ValueError(
                'Float8Config: unsupported_shapes must be "keep" or "pad", got '
                f"{self.unsupported_shapes!r}"
            )
        for name in (
            "output",
            "grad_input",
            "grad_weight",
            "save_fp8_inputs",
            "fsdp_fp8_all_gather",
            "attention",
        ):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"Float8Config: {name} must be a bool")


def fits(in_features: int, out_features: int) -> bool:
    """Whether cuBLAS's FP8 GEMMs take a layer of these sizes as they are."""
    return in_features % _MULTIPLE == 0 and out_features % _MULTIPLE == 0


# --------------------------------------------------------------------------- #
# The GEMMs.
# --------------------------------------------------------------------------- #


def _cast(x: Tensor, dtype: torch.dtype) -> Tensor:
    """Round ``x`` to the FP8 ``dtype``, saturating at its largest value."""
    limit = torch.finfo(dtype).max
    return x.clamp(-limit, limit).to(dtype)


def _pad(x: Tensor, dim: int) -> Tensor:
    """``x`` with zeros appended along ``dim`` up to a multiple of 16 (for FP8
    tensors through their bytes: a zero byte is +0.0)."""
    short = -x.shape[dim] % _MULTIPLE
    if short == 0:
        return x
    widths = [0, 0] * (x.dim() - 1 - dim % x.dim()) + [0, short]
    if x.dtype in _FP8:
        return F.pad(x.view(torch.uint8), widths).view(x.dtype)
    return F.pad(x, widths)


_SCALES: dict[tuple[float, torch.device], Tensor] = {}


def _scale(value: float, device: torch.device) -> Tensor:
    """``value`` as the float32 scalar tensor ``_scaled_mm`` takes, made once per
    value and device (a fresh one on a GPU would be a host-to-device copy)."""
    if torch.compiler.is_compiling():
        return torch.full((), value, dtype=torch.float32, device=device)
    key = (value, device)
    found = _SCALES.get(key)
    if found is None:
        found = _SCALES[key] = torch.full((), value, dtype=torch.float32, device=device)
    return found


def _gemm(a: Tensor, b: Tensor, scale: float, out_dtype: torch.dtype) -> Tensor:
    """``scale * (a @ b)`` for FP8 ``a`` (row-major) and ``b`` (column-major)."""
    if a.device.type == "cpu":
        on_cpu: Tensor = _cpu_gemm(a, b, _scale(scale, a.device), out_dtype)
        return on_cpu
    out: Tensor = scaled_mm(
        a,
        b,
        scale_a=_scale(scale, a.device),
        scale_b=_scale(1.0, a.device),
        out_dtype=out_dtype,
    )
    return out


@torch.library.custom_op("unit_scaling::cpu_fp8_gemm", mutates_args=())
def _cpu_gemm(a: Tensor, b: Tensor, scale: Tensor, out_dtype: torch.dtype) -> Tensor:
    """``_scaled_mm`` on the CPU, as an op of its own. torch 2.13's CPU emulation
    sends E4M3 x E4M3 to oneDNN, which takes ~250x longer than torch's own path
    (3.9 s against 16 ms for 1024x128x512) for the same result; compiled graphs
    take that path too. Here oneDNN is off for the call (eager or compiled).
    ``tests/test_float8.py`` times both paths and says when this can go."""
    enabled = onednn_enabled()
    set_onednn_enabled(False)
    try:
        out: Tensor = scaled_mm(
            a, b, scale_a=scale, scale_b=_scale(1.0, a.device), out_dtype=out_dtype
        )
    finally:
        set_onednn_enabled(enabled)
    return out


@_cpu_gemm.register_fake
def _(a: Tensor, b: Tensor, scale: Tensor, out_dtype: torch.dtype) -> Tensor:
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


def _column_major(x: Tensor) -> Tensor:
    """``x`` with the same values, laid out column-major."""
    return x.t().contiguous().t()


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
            xq = _cast(x, config.forward_dtype)
            wq = _fp8(weight, config.forward_dtype)
        if config.output:
            assert xq is not None and wq is not None
            a, b = (_pad(xq, 1), _pad(_pad(wq, 1), 0)) if pad else (xq, wq)
            y = _gemm(a, b.t(), alpha, out_dtype)[:, : weight.shape[0]]
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
            gq = _cast(g, config.gradient_dtype)
        grad_input = grad_weight = grad_bias = None
        if needs_input:
            if config.grad_input:
                assert gq is not None
                wq = _fp8(weight, config.forward_dtype)
                a, b = (_pad(gq, 1), _pad(_pad(wq, 0), 1)) if pad else (gq, wq)
                grad_input = _gemm(a, _column_major(b), beta_x, input_dtype)
                grad_input = grad_input[:, : input_shape[-1]]
            else:
                w = weight.to(g.dtype)
                grad_input = torch.mm(g, w).mul_(beta_x).to(input_dtype)
            grad_input = grad_input.reshape(input_shape)
        if needs_weight:
            if config.grad_weight:
                assert gq is not None
                xq = _fp8(x, config.forward_dtype)
                # The GEMM's inner dimension is the tokens': padded too.
                a, b = _pad(gq, 0).t(), _pad(xq, 0)
                if pad:
                    a, b = _pad(a, 0), _pad(b, 1)
                grad_weight = _gemm(
                    a.contiguous(), _column_major(b), beta_w, weight_dtype
                )
                grad_weight = grad_weight[: g.shape[1], : x.shape[1]]
            else:
                grad_weight = torch.mm(g.t(), x.to(g.dtype)).mul_(beta_w)
                grad_weight = grad_weight.to(weight_dtype)
        if has_bias and needs_bias:
            grad_bias = g.sum(0).mul_(beta_w)
        return grad_input, grad_weight, grad_bias, None, None, None


# Attention's probabilities lie in [0, 1] (at most 1/(1-p) after dropout): cast
# times 2^8, they keep E4M3's precision down to 2^-14 and never saturate (448).
_PROBS_SCALE = 256.0


def _batched_gemm(a: Tensor, b: Tensor, scale: float, out_dtype: torch.dtype) -> Tensor:
    """``scale * (a[i] @ b[i])`` for FP8 ``a`` (n, m, k) and ``b`` (n, k, p): one
    scaled GEMM per leading index (``_scaled_mm`` is two-dimensional), the inner
    and output sizes padded with zeros to multiples of 16."""
    size = b.shape[-1]
    out = [
        _gemm(_pad(a_i, 1), _column_major(_pad(_pad(b_i, 0), 1)), scale, out_dtype)
        for a_i, b_i in zip(a.unbind(0), b.unbind(0), strict=True)
    ]
    return torch.stack(out)[..., :size]


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
        aq = _cast(a.reshape(-1, *a.shape[-2:]) * sa, config.forward_dtype)
        bq = _cast(b.reshape(-1, *b.shape[-2:]) * sb, config.forward_dtype)
        y = _batched_gemm(aq, bq, scale / (sa * sb), out_dtype)
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
        gq = _cast(g, config.gradient_dtype)
        grad_a = grad_b = None
        if ctx.needs_input_grad[0]:
            bt = bq.transpose(1, 2).contiguous()
            grad_a = _batched_gemm(gq, bt, scale / sb, ctx.dtypes[0])
            grad_a = grad_a.reshape(*grad_output.shape[:-2], *aq.shape[-2:])
        if ctx.needs_input_grad[1]:
            at = aq.transpose(1, 2).contiguous()
            grad_b = _batched_gemm(at, gq, scale / sa, ctx.dtypes[1])
            grad_b = grad_b.reshape(*grad_output.shape[:-2], *bq.shape[-2:])
        return grad_a, grad_b, None, None, None


def _fp8(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``x`` in ``dtype``: cast, unless it was saved in FP8 or gathered in FP8
    by FSDP2 already."""
    if isinstance(x, _GatheredFloat8):
        return x.fp8
    return x if x.dtype in _FP8 else _cast(x, dtype)


# --------------------------------------------------------------------------- #
# FSDP2: weights gathered in FP8.
# --------------------------------------------------------------------------- #

_aten = torch.ops.aten
# What FSDP2 does to a parameter while sharding it and gathering it: these keep
# the FP8-gathering wrapper (anything else sees the plain high-precision tensor).
_KEEPS_WRAPPER = {
    _aten.detach.default,
    _aten.alias.default,
    _aten.empty_like.default,
    _aten.new_zeros.default,
    _aten.slice.Tensor,
    _aten.copy_.default,
    _aten.view.default,
    _aten.as_strided.default,
    _aten._to_copy.default,
    _aten._pin_memory.default,
    _aten.split.Tensor,
    _aten.split_with_sizes.default,
    _aten.clone.default,
}


def _wrapper(cls: type[T], inner: Tensor, dtype: torch.dtype, grad: bool) -> T:
    """A ``cls`` tensor with ``inner``'s size, strides and device, and ``dtype``."""
    out: T = Tensor._make_wrapper_subclass(
        cls,
        inner.size(),
        strides=inner.stride(),
        storage_offset=inner.storage_offset(),
        dtype=dtype,
        device=inner.device,
        requires_grad=grad,
    )
    return out


class _FSDPFloat8Weight(Tensor):
    """A high-precision weight that FSDP2 all-gathers in FP8: the shard is cast
    to ``fp8_dtype`` with the static scale 1 (a unit-scaled weight needs no
    other) and gathered as bytes (gloo carries no float8), then seen by the
    layer as a :class:`_GatheredFloat8`. Optimizers and checkpoints see the
    high-precision master ``data``."""

    data_: Tensor
    fp8_dtype: torch.dtype

    @staticmethod
    def __new__(cls, data: Tensor, fp8_dtype: torch.dtype) -> _FSDPFloat8Weight:
        return _wrapper(cls, data, data.dtype, data.requires_grad)

    def __init__(self, data: Tensor, fp8_dtype: torch.dtype) -> None:
        self.data_ = data
        self.fp8_dtype = fp8_dtype

    __torch_function__ = disabled_torch_function

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        fp8_dtype = next(
            a.fp8_dtype for a in pytree.tree_leaves(args) if isinstance(a, cls)
        )
        plain_args, plain_kwargs = pytree.tree_map_only(
            cls, lambda t: t.data_, (args, kwargs or {})
        )
        out = func(*plain_args, **plain_kwargs)
        if func is _aten.copy_.default:
            return args[0]
        if func not in _KEEPS_WRAPPER:
            return out
        return pytree.tree_map_only(Tensor, lambda t: cls(t, fp8_dtype), out)

    def __tensor_flatten__(self) -> tuple[list[str], torch.dtype]:
        return ["data_"], self.fp8_dtype

    @staticmethod
    def __tensor_unflatten__(
        inner: dict[str, Tensor], fp8_dtype: torch.dtype, size: Any, stride: Any
    ) -> _FSDPFloat8Weight:
        return _FSDPFloat8Weight(inner["data_"], fp8_dtype)

    def __repr__(self) -> str:  # type: ignore[override]
        return f"_FSDPFloat8Weight({self.data_!r}, gathered as {self.fp8_dtype})"

    def __reduce_ex__(self, protocol: Any) -> Any:
        # Saved (torch.save, DCP) as the plain master tensor it wraps.
        return self.data_.__reduce_ex__(protocol)  # type: ignore[no-untyped-call]

    def fsdp_pre_all_gather(
        self, mesh: Any, outer_size: Any, outer_stride: Any, module: Any, policy: Any
    ) -> tuple[tuple[Tensor, ...], None]:
        return (_cast(self.data_, self.fp8_dtype).view(torch.uint8),), None

    def fsdp_post_all_gather(
        self,
        outputs: tuple[Tensor, ...],
        metadata: Any,
        param_dtype: torch.dtype,
        *,
        out: Tensor | None = None,
    ) -> tuple[Tensor, tuple[Tensor, ...]] | None:
        (data,) = outputs
        if out is not None:  # gathered again into the storage ``out`` views
            return None
        return _GatheredFloat8(data.view(self.fp8_dtype), param_dtype), (data,)


class _GatheredFloat8(Tensor):
    """A weight FSDP2 gathered in FP8, in the guise of its high-precision dtype:
    :func:`linear` takes its FP8 values as they are; any other op sees them
    converted to that dtype."""

    fp8: Tensor

    @staticmethod
    def __new__(cls, fp8: Tensor, dtype: torch.dtype) -> _GatheredFloat8:
        return _wrapper(cls, fp8, dtype, False)

    def __init__(self, fp8: Tensor, dtype: torch.dtype) -> None:
        self.fp8 = fp8

    __torch_function__ = disabled_torch_function

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        if func in (
            _aten.as_strided.default,
            _aten.view.default,
            _aten.detach.default,
            _aten.alias.default,
            _aten.t.default,
        ):
            self = args[0]
            return cls(func(self.fp8, *args[1:], **(kwargs or {})), self.dtype)
        plain_args, plain_kwargs = pytree.tree_map_only(
            cls, lambda t: t.fp8.to(t.dtype), (args, kwargs or {})
        )
        return func(*plain_args, **plain_kwargs)

    def __tensor_flatten__(self) -> tuple[list[str], torch.dtype]:
        return ["fp8"], self.dtype

    @staticmethod
    def __tensor_unflatten__(
        inner: dict[str, Tensor], dtype: torch.dtype, size: Any, stride: Any
    ) -> _GatheredFloat8:
        return _GatheredFloat8(inner["fp8"], dtype)

    def __repr__(self) -> str:  # type: ignore[override]
        return f"_GatheredFloat8({self.fp8!r}, as {self.dtype})"


def _gather_in_fp8(layer: nn.Module) -> None:
    """Before FSDP2 shards ``layer``: its weight becomes one that is gathered in
    FP8 (the same values, tags and ``requires_grad``)."""
    weight = layer._parameters["weight"]
    if weight is None or isinstance(weight.data, _FSDPFloat8Weight):
        return
    if type(weight.data).__name__ == "DTensor":  # sharded already
        return
    config: Float8Config = layer.float8_config  # type: ignore[assignment]
    wrapped = nn.Parameter(
        _FSDPFloat8Weight(weight.detach(), config.forward_dtype),
        requires_grad=weight.requires_grad,
    )
    for tag in ("mup_type", "mup_scaling_depth"):
        if hasattr(weight, tag):
            setattr(wrapped, tag, getattr(weight, tag))
    layer._parameters["weight"] = wrapped


# --------------------------------------------------------------------------- #
# The functional layer.
# --------------------------------------------------------------------------- #


def _check_config(op: str, config: Float8Config | None) -> Float8Config:
    """``config``, or the default one; a ``TypeError`` naming ``op`` for anything
    else."""
    if config is None:
        return Float8Config()
    if not isinstance(config, Float8Config):
        raise TypeError(f"{op}: config must be a Float8Config, got {config!r}")
    return config


def _output_dtype(input: Tensor, config: Float8Config) -> torch.dtype:
    if config.output_dtype is not None:
        return config.output_dtype
    device = input.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return input.dtype


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
    config = _check_config("float8.linear", config)
    check_linear_args("float8.linear", input, weight, bias)
    if not (input.is_floating_point() and weight.is_floating_point()):
        raise TypeError(
            "float8.linear: input and weight must be floating-point tensors, got "
            f"{input.dtype} and {weight.dtype}"
        )
    validate_constraint(constraint)
    fan_out, fan_in = weight.shape
    fits_here = fits(fan_in, fan_out)
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
        _output_dtype(input, config),
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
    return linear(input, weight, bias, constraint, _READOUT_POWER, config=config)


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
    config = _check_config("float8.scaled_dot_product_attention", config)
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
        _output_dtype(query, config),
    )
    return out if isinstance(c, float) else out * c


# --------------------------------------------------------------------------- #
# Modules and the conversion.
# --------------------------------------------------------------------------- #


class _Float8Layer(nn.Module):
    """The forward of a converted layer: its function's FP8 version."""

    float8_config: Float8Config
    constraint: str | None
    _power: tuple[float, float, float] = (0.5, 0.5, 0.5)

    def forward(self, input: Tensor) -> Tensor:
        weight, bias = self.weight, self.bias
        assert isinstance(weight, Tensor) and (bias is None or isinstance(bias, Tensor))
        return linear(
            input, weight, bias, self.constraint, self._power, config=self.float8_config
        )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, float8"

    def fsdp_prepare_parameters(self) -> None:
        """Called by :func:`unit_scaling.parallel.fully_shard` before sharding:
        with ``float8_config.fsdp_fp8_all_gather``, the weight is gathered in
        FP8."""
        if self.float8_config.fsdp_fp8_all_gather:
            _gather_in_fp8(self)


class Float8Linear(_Float8Layer, Linear):
    """A :class:`unit_scaling.Linear` whose GEMMs run in FP8 (made by
    :func:`convert_to_float8_training`; ``float8_config`` says how).

    Example::

        >>> layer = convert_to_float8_training(nn.Sequential(uu.Linear(64, 32)))[0]
        >>> layer.float8_config.forward_dtype
        torch.float8_e4m3fn
    """


class Float8LinearReadout(_Float8Layer, LinearReadout):
    """A :class:`unit_scaling.LinearReadout` whose GEMMs run in FP8.

    Example::

        >>> head = convert_to_float8_training(nn.Sequential(uu.LinearReadout(64, 256)))
        >>> type(head[0]).__name__
        'Float8LinearReadout'
    """

    _power = _READOUT_POWER


class Float8MHSA(MHSA):
    """A :class:`unit_scaling.MHSA` whose attention runs in FP8
    (:func:`scaled_dot_product_attention`; made by
    :func:`convert_to_float8_training` with ``Float8Config(attention=True)``).
    Its projections are converted as any linear layer.

    Example::

        >>> config = Float8Config(attention=True)
        >>> model = convert_to_float8_training(uu.MHSA(64, 4, True), config=config)
        >>> type(model).__name__, model(torch.randn(2, 16, 64)).shape
        ('Float8MHSA', torch.Size([2, 16, 64]))
    """

    float8_config: Float8Config

    def _attention(self, *args: Any, **kwargs: Any) -> Tensor:
        return scaled_dot_product_attention(*args, **kwargs, config=self.float8_config)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, float8"


Filter = Callable[[nn.Module, str], bool]


def _warn_kept(kept: list[str]) -> None:
    if kept:
        logger.warning(
            "convert_to_float8_training: %d layer(s) have sizes that are not "
            "multiples of 16 and stay in high precision: %s (pass "
            'Float8Config(unsupported_shapes="pad") to pad them instead)',
            len(kept),
            ", ".join(kept),
        )


def _bound(
    fn: Callable[..., Tensor], config: Float8Config, exact: Callable[..., Tensor]
) -> Callable[..., Tensor]:
    """``fn`` with ``config`` bound, as a graph target (a graph's code prints
    its arguments, and a config is not a literal). Its ``high_precision``
    attribute is ``exact``, the unit-scaled function it computes in FP8 (what
    :func:`unit_scaling.export.to_plain` folds)."""

    def run(*args: Any, **kwargs: Any) -> Tensor:
        return fn(*args, **kwargs, config=config)

    run.__name__ = run.__qualname__ = f"float8_{fn.__name__}"
    run.high_precision = exact  # type: ignore[attr-defined]
    return run


def _float8_pass(config: Float8Config, keep: Filter | None, root: nn.Module) -> Any:
    """Retarget the captured graph's ``U.linear`` and ``U.linear_readout`` calls
    to their FP8 versions (those ``keep`` accepts, by their module)."""
    targets: dict[Callable[..., Tensor], Callable[..., Tensor]] = {
        U.linear: _bound(linear, config, U.linear),
        U.linear_readout: _bound(linear_readout, config, U.linear_readout),
    }
    if config.attention:
        targets[U.scaled_dot_product_attention] = _bound(
            scaled_dot_product_attention, config, U.scaled_dot_product_attention
        )

    def run(gm: GraphModule) -> GraphModule:
        kept: list[str] = []
        for node in gm.graph.nodes:
            if node.op != "call_function" or node.target not in targets:
                continue
            path = module_path(node)
            if keep is not None:
                try:
                    owner = root.get_submodule(path)
                except AttributeError:
                    owner = root
                if not keep(owner, path):
                    continue
            is_attention = node.target is U.scaled_dot_product_attention
            node.target = targets[node.target]
            if is_attention:
                continue
            weight = node.args[1] if len(node.args) > 1 else node.kwargs.get("weight")
            shape = getattr(example_value(weight), "shape", None)
            keeps = config.unsupported_shapes == "keep"
            if shape is not None and keeps and not fits(shape[1], shape[0]):
                kept.append(f"{path or node.name} ({shape[1]} -> {shape[0]})")
        _warn_kept(kept)
        return gm

    return run


def convert_to_float8_training(
    module: M,
    *,
    config: Float8Config | None = None,
    module_filter_fn: Filter | None = None,
) -> M:
    """Run ``module``'s unit-scaled linear layers in real FP8, **in place**.

    A module conversion (as torchao's of the same name), not a graph transform:
    each :class:`unit_scaling.Linear` (and ``LinearReadout``) becomes a
    :class:`Float8Linear` (``Float8LinearReadout``) that keeps its parameters,
    tags and hooks; in a model made by :func:`unit_scaling.transforms.unit_scale`
    the graph's ``U.linear`` calls run in FP8 from the next call on (after
    ``unit_scale``, before ``track_scales``; do not combine it with
    ``simulate_fp8``). Attention's matrix products stay in high precision
    unless ``config.attention`` asks for FP8: then each :class:`unit_scaling.MHSA`
    becomes a :class:`Float8MHSA`, and the graph's unit-scaled attention calls
    run :func:`scaled_dot_product_attention`. Convert before ``fully_shard``.
    A layer whose sizes are not multiples of 16 is kept in high precision (or
    padded, see :class:`Float8Config`) and named in a warning.

    Args:
        module: the model (changed in place).
        config: the FP8 formats and GEMMs (default :class:`Float8Config`).
        module_filter_fn: ``fn(layer, fqn) -> bool``; only layers (and
            attention modules) it accepts are converted.

    Returns:
        ``module``.

    Example::

        >>> model = convert_to_float8_training(nn.Sequential(uu.Linear(64, 64)))
        >>> model(torch.randn(4, 64)).shape
        torch.Size([4, 64])
    """
    if not isinstance(module, nn.Module):
        raise TypeError(
            "convert_to_float8_training: module must be an nn.Module, got "
            f"{type(module).__name__}"
        )
    config = _check_config("convert_to_float8_training", config)
    from torch.distributed.fsdp import FSDPModule

    if any(isinstance(m, FSDPModule) for m in module.modules()):
        raise ValueError(
            "convert_to_float8_training: module is already sharded by fully_shard; "
            "convert it first, then shard"
        )
    if transform_state(module) is not None:
        extend_in_place(
            module,
            Transform(
                name="float8",
                place=Place.QUANTISE,
                graph_pass=_float8_pass(config, module_filter_fn, module),
                non_recurse=UNIT_SCALED_FUNCTIONS,
            ),
        )
        return module
    kept = []
    for fqn, sub in module.named_modules():
        if module_filter_fn is not None and not module_filter_fn(sub, fqn):
            continue
        if config.attention and type(sub) is MHSA:
            sub.__class__ = Float8MHSA
            object.__setattr__(sub, "float8_config", config)
        if not isinstance(sub, Linear) or isinstance(sub, _Float8Layer):
            continue
        keeps = config.unsupported_shapes == "keep"
        if keeps and not fits(sub.in_features, sub.out_features):
            kept.append(f"{fqn} ({sub.in_features} -> {sub.out_features})")
        sub.__class__ = (
            Float8LinearReadout if isinstance(sub, LinearReadout) else Float8Linear
        )
        object.__setattr__(sub, "float8_config", config)
    _warn_kept(kept)
    return module
