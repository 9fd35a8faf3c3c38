"""Argument checks shared by the unit-scaled functions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..constraints import validate_constraint

__all__ = [
    "autocast_inputs",
    "check_conv_shapes",
    "check_dim",
    "check_flag",
    "check_linear_args",
    "check_mult",
    "expand_size",
    "reject_unsupported",
    "spatial_shape",
    "validate_constraint",
]


def _is_default(value: Any, default: Any) -> bool:
    if value is default:
        return True
    if isinstance(value, Tensor) or isinstance(default, Tensor):
        return False
    return bool(value == default)


def reject_unsupported(op: str, **args: tuple[Any, Any]) -> None:
    """Raise ``ValueError`` for any torch argument given a non-default value.

    Each keyword maps an argument name to ``(value, default)``. Unit-scaled ops
    mirror torch signatures, so an argument they cannot honour must fail loudly
    rather than be ignored.
    """
    for name, (value, default) in args.items():
        if not _is_default(value, default):
            raise ValueError(
                f"U.{op}: the {name!r} argument has not been implemented "
                f"(got {name}={value!r}; only the default {default!r} is supported). "
                f"Use torch's {op} for this case, or open an issue."
            )


def autocast_inputs(*tensors: Tensor | None) -> tuple[Tensor | None, ...]:
    """Cast floating-point inputs to the autocast dtype when autocast is on.

    Our fused autograd functions call GEMMs directly; casting outside them keeps
    the casts on the autograd tape, so gradients come back in each input's dtype
    exactly as with the plain torch op under autocast.
    """
    first = next(t for t in tensors if t is not None)
    device_type = first.device.type
    if not torch.is_autocast_enabled(device_type):
        return tensors
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(
        t.to(dtype) if t is not None and t.is_floating_point() else t for t in tensors
    )


def expand_size(
    op: str, name: str, value: int | Sequence[int], n: int
) -> tuple[int, ...]:
    """``value`` as ``n`` ints: an int is repeated, a sequence must have ``n``."""
    values = (value,) * n if isinstance(value, int) else tuple(value)
    if len(values) != n:
        raise ValueError(f"U.{op}: {name}={value!r} must be an int or {n} ints")
    return values


def spatial_shape(op: str, input: Tensor, n: int) -> tuple[int, ...]:
    """The ``n`` trailing (spatial) sizes of a batched or unbatched ``input``."""
    if input.dim() not in (n + 1, n + 2):
        raise ValueError(
            f"U.{op}: expected input of shape (N, C, *spatial) or (C, *spatial) with "
            f"{n} spatial dims, got {tuple(input.shape)}"
        )
    return tuple(input.shape[-n:])


def check_mult(op: str, mult: float) -> None:
    """Raise a ``ValueError`` naming ``U.<op>`` unless ``mult`` is positive."""
    if not mult > 0:
        raise ValueError(
            f"U.{op}: mult must be a positive number (it is a temperature that "
            f"multiplies the input), got mult={mult!r}"
        )


def check_flag(
    op: str, name: str, value: object, choices: tuple[object, ...], takes_mult: bool
) -> None:
    """Raise unless ``value`` is one of ``choices`` (torch's values of a flag).

    Torch's flags come before our extras, so a temperature passed positionally
    (``U.silu(x, 2.0)``, the order of Graphcore's library) lands in a flag. Torch
    would take any truthy value; here a value of the wrong type is a ``TypeError``
    that says how to pass the temperature, and a string torch does not know is a
    ``ValueError``.
    """
    kind = type(choices[0])
    if not isinstance(value, kind):
        listed = ", ".join(map(repr, choices))
        expected = "a bool" if kind is bool else f"one of {listed}"
        number = isinstance(value, int | float) and not isinstance(value, bool)
        advice = (
            f"; pass the temperature by keyword: U.{op}(x, mult={value!r})"
            if takes_mult and number
            else ""
        )
        raise TypeError(
            f"U.{op}: {name} must be {expected}, got {value!r} "
            f"({type(value).__name__}){advice}"
        )
    if value not in choices:
        raise ValueError(
            f"U.{op}: {name}={value!r} is not valid; expected one of "
            f"{', '.join(map(repr, choices))}"
        )


def check_conv_shapes(
    op: str, n: int, input: Tensor, weight: Tensor, groups: int, transposed: bool
) -> None:
    """Raise ``ValueError`` unless ``input`` and ``weight`` are laid out as torch's
    ``n``-d convolution takes them (``transposed``: its adjoint, whose weight is
    ``(C_in, C_out / groups, *kernel)``)."""
    ranks = weight.dim() == n + 2 and input.dim() in (n + 1, n + 2)
    channels = input.shape[-n - 1] if ranks else None
    if transposed:
        layout, also = (
            "(C_in, C_out / groups, *kernel)",
            " and C_in divisible by groups",
        )
        fits = ranks and groups >= 1 and weight.shape[0] % groups == 0
        fits = fits and channels == weight.shape[0]
    else:
        layout, also = "(C_out, C_in / groups, *kernel)", ""
        fits = ranks and channels == weight.shape[1] * groups
    if not fits:
        raise ValueError(
            f"U.{op}: expected input of shape (N, C_in, *spatial) or (C_in, "
            f"*spatial) and weight of shape {layout} with {n} spatial dims{also}, "
            f"got input {tuple(input.shape)}, weight {tuple(weight.shape)} and "
            f"groups={groups}"
        )


def check_dim(op: str, dim: int, input: Tensor, name: str = "dim") -> int:
    """``dim`` as a non-negative index into ``input``'s dimensions; an
    ``IndexError`` naming ``U.<op>``, the argument and the valid range (as torch
    raises it) if it is out of range. A 0-d tensor takes ``dim`` 0 or -1."""
    rank = max(input.dim(), 1)
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"U.{op}: {name} must be an int, got {type(dim).__name__}")
    if not -rank <= dim < rank:
        raise IndexError(
            f"U.{op}: {name}={dim} is out of range for input of shape "
            f"{tuple(input.shape)} (expected a dimension in [{-rank}, {rank - 1}])"
        )
    return dim % rank


def check_linear_args(
    op: str, input: Tensor, weight: Tensor, bias: Tensor | None
) -> None:
    """Raise ``ValueError`` unless ``input (..., in)``, ``weight (out, in)`` and
    ``bias (out,)`` fit a linear layer; ``op`` names the caller in the message."""
    if input.dim() == 0 or weight.dim() != 2 or input.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"{op}: expected input of shape (..., in_features) and weight of "
            f"shape (out_features, in_features), got input {tuple(input.shape)} "
            f"and weight {tuple(weight.shape)}"
        )
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(
            f"{op}: expected bias of shape ({weight.shape[0]},), got "
            f"{tuple(bias.shape)}"
        )
