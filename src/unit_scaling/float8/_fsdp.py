"""FSDP2 gathering a layer's weight in FP8: the tensor subclasses that carry
the FP8 shard through the all-gather, and what a layer reads from them."""

from __future__ import annotations

from typing import Any, TypeVar

import torch
from torch import Tensor, nn

from .._torch_internals import disabled_torch_function, pytree
from ..parameter import TAG_NAMES
from . import _gemm
from ._config import Float8Config

T = TypeVar("T", bound=Tensor)

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
        return (_gemm.cast(self.data_, self.fp8_dtype).view(torch.uint8),), None

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


def gather_in_fp8(layer: nn.Module) -> None:
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
    for tag in TAG_NAMES:
        if hasattr(weight, tag):
            setattr(wrapped, tag, getattr(weight, tag))
    layer._parameters["weight"] = wrapped


def fp8(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``x`` in ``dtype``: cast, unless it was saved in FP8 or gathered in FP8
    by FSDP2 already."""
    if isinstance(x, _GatheredFloat8):
        return x.fp8
    return x if x.dtype in _gemm.FP8 else _gemm.cast(x, dtype)


def fp8_column_major(x: Tensor, dtype: torch.dtype) -> Tensor:
    """:func:`fp8` of a 2-D ``x``, laid out column-major (as ``_scaled_mm``
    takes its second operand); a cast writes that layout as it converts."""
    if isinstance(x, _GatheredFloat8):
        return _gemm.column_major(x.fp8)
    if x.dtype in _gemm.FP8:
        return _gemm.column_major(x)
    return _gemm.cast_column_major(x, dtype)
