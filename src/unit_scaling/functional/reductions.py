"""Unit-scaled reductions: ``sum`` and ``mean``.

A sum of ``n`` independent unit terms has scale ``sqrt(n)`` and a mean
``1 / sqrt(n)``, so once unit-scaled both are the same function,
``n^(-1/2) · sum(x)``: they differ only in which plain op the scales are relative
to. Both are here so that code written with either can be unit-scaled.

They are deliberately not in :data:`~unit_scaling.functional.torch_map`: models use
``mean``/``sum`` inside hand-written normalisations and losses, where replacing
them would change what the model computes.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Sequence

import torch
from torch import Tensor

from ..constraints import apply_constraint
from ..scale import scale_bwd, scale_fwd
from ._checks import check_dim, validate_constraint

__all__ = ["mean", "sum"]

_Dim = int | Sequence[int] | None


def _reduced_numel(op: str, input: Tensor, dim: _Dim) -> int:
    if dim is None:
        return input.numel()
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    if not dims:  # torch reduces over every dimension for dim=()
        return input.numel()
    normalized = {check_dim(op, d, input) for d in dims}
    if len(normalized) != len(dims):
        raise ValueError(f"U.{op}: dim={dim!r} repeats a dimension")
    shape = input.shape if input.dim() else (1,)
    return math.prod([shape[d] for d in normalized])


def _unit_sum(
    op: str,
    input: Tensor,
    dim: _Dim,
    keepdim: bool,
    dtype: torch.dtype | None,
    constraint: str | None,
) -> Tensor:
    """``n^(-1/2) sum(x)`` forwards, gradient ``1·∂y`` before the constraint."""
    validate_constraint(constraint)
    n = builtins.max(_reduced_numel(op, input, dim), 1)
    output_scale, grad_input_scale = apply_constraint(constraint, n**-0.5, 1.0)
    reduce_dims = dim if dim is None or isinstance(dim, int) else tuple(dim)
    if output_scale == grad_input_scale:
        # c · sum(x) with its true gradient; the multiply is output-sized.
        out = torch.sum(input, dim=reduce_dims, keepdim=keepdim, dtype=dtype)
        return out if output_scale == 1 else out * output_scale
    input = scale_bwd(input, grad_input_scale)
    out = torch.sum(input, dim=reduce_dims, keepdim=keepdim, dtype=dtype)
    return scale_fwd(out, output_scale)


def sum(
    input: Tensor,
    dim: _Dim = None,
    keepdim: bool = False,
    dtype: torch.dtype | None = None,
    constraint: str | None = "to_output_scale",
) -> Tensor:
    """Unit-scaled :func:`torch.sum`.

    With ``n`` the number of elements reduced into each output element,
    relative to the plain sum:

    .. math::
        y = \\alpha \\sum_i x_i,\\quad \\alpha = n^{-1/2},\\quad \\beta_x = 1

    The default ``"to_output_scale"`` constraint keeps the true gradient: the output
    is unit and the input gradient is ``n^(-1/2) ∂y`` (scale ``n^(-1/2)``).
    ``constraint=None`` gives a unit output and a unit gradient (``∂x = ∂y``);
    ``"to_grad_input_scale"`` is the plain sum. :func:`mean` is the same function.

    Args:
        input: the tensor to reduce.
        dim: the dimension(s) to reduce; ``None`` (or ``()``) for all.
        keepdim: keep reduced dimensions with size 1.
        dtype: the dtype to accumulate and return in, as in torch.
        constraint: applied to ``(alpha, beta_x)``; see
            :mod:`unit_scaling.constraints`.

    Example::

        >>> y = U.sum(torch.randn(10_000, 64), dim=-1)
        >>> round(y.std().item(), 1)
        1.0
    """
    return _unit_sum("sum", input, dim, keepdim, dtype, constraint)


def mean(
    input: Tensor,
    dim: _Dim = None,
    keepdim: bool = False,
    dtype: torch.dtype | None = None,
    constraint: str | None = "to_output_scale",
) -> Tensor:
    """Unit-scaled :func:`torch.mean`: identical to :func:`sum`.

    Relative to the plain mean over ``n`` elements:

    .. math::
        y = \\alpha \\frac{1}{n}\\sum_i x_i,\\quad \\alpha = n^{1/2},\\quad
        \\beta_x = n

    which is ``n^(-1/2) sum(x)``: with the default constraint the output is unit
    and the input gradient ``n^(-1/2) ∂y``; with ``None`` both are unit. The
    arguments are those of :func:`sum`.

    Example::

        >>> x = torch.randn(1000, 256)
        >>> torch.allclose(U.mean(x, dim=-1), U.sum(x, dim=-1))
        True
    """
    return _unit_sum("mean", input, dim, keepdim, dtype, constraint)
