"""Unit-scaled grouped matrix product, the expert layer of a mixture of experts.

``grouped_mm(a, b, offs=offs)`` multiplies consecutive row blocks of ``a`` (the
tokens routed to each expert, sorted by expert) by that expert's matrix
``b[g]``; ``grouped_mm(a, b)`` with 3-D operands multiplies ``a[g] @ b[g]``.
Scales are those of a matrix product, counted per group: the output sums ``k``
products (``alpha = k^-1/2``), each element of ``a``'s gradient sums ``n``
(``beta_a = n^-1/2``), and each element of an expert's gradient sums the rows of
its group, ``m`` on average (``beta_b = m^-1/2``, with ``m`` the rows per group).
As for a linear layer's weight, the constraint ties ``alpha`` and ``beta_a`` only:
``m`` grows with the batch, and a gradient accumulated over micro-batches is
exact only if every expert's gradient scale follows it (see
:mod:`unit_scaling.functional.steps`).

On CUDA the product is :func:`torch.nn.functional.grouped_mm`; elsewhere (its
CPU kernel takes only 16-byte aligned strides and has no backward for every
layout) a loop over the groups, registered as an opaque operator so that
``torch.compile`` does not trace the loop's data-dependent bounds.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .._twoway import scale_twoway
from ..constraints import apply_constraint
from ._checks import validate_constraint

__all__ = ["grouped_mm"]


def _ends(offs: Tensor) -> list[int]:
    return [int(e) for e in offs.tolist()]


@torch.library.custom_op("unit_scaling::grouped_mm_loop", mutates_args=())
def _loop(a: Tensor, b: Tensor, offs: Tensor) -> Tensor:
    """``a[rows of group g] @ b[g]`` for each group; rows past ``offs[-1]`` are
    zero, as in :func:`torch.nn.functional.grouped_mm`."""
    out = a.new_zeros(a.shape[0], b.shape[2])
    start = 0
    for group, end in enumerate(_ends(offs)):
        if end > start:
            torch.mm(a[start:end], b[group], out=out[start:end])
        start = end
    return out


@_loop.register_fake
def _(a: Tensor, b: Tensor, offs: Tensor) -> Tensor:
    return a.new_empty(a.shape[0], b.shape[2])


@torch.library.custom_op("unit_scaling::grouped_mm_loop_backward", mutates_args=())
def _loop_backward(
    a: Tensor, b: Tensor, offs: Tensor, grad: Tensor
) -> tuple[Tensor, Tensor]:
    grad_a, grad_b = torch.zeros_like(a), torch.zeros_like(b)
    start = 0
    for group, end in enumerate(_ends(offs)):
        if end > start:
            torch.mm(grad[start:end], b[group].t(), out=grad_a[start:end])
            torch.mm(a[start:end].t(), grad[start:end], out=grad_b[group])
        start = end
    return grad_a, grad_b


@_loop_backward.register_fake
def _(a: Tensor, b: Tensor, offs: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
    return torch.empty_like(a), torch.empty_like(b)


def _setup(ctx: Any, inputs: tuple[Tensor, Tensor, Tensor], output: Tensor) -> None:
    a, b, offs = inputs
    ctx.save_for_backward(a, b, offs)


def _backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None]:
    a, b, offs = ctx.saved_tensors
    grad_a, grad_b = _loop_backward(a, b, offs, grad.contiguous())
    return grad_a, grad_b, None


_loop.register_autograd(_backward, setup_context=_setup)


def _product(a: Tensor, b: Tensor, offs: Tensor | None) -> Tensor:
    if offs is None:
        return torch.bmm(a, b)
    if a.is_cuda and hasattr(F, "grouped_mm"):
        return F.grouped_mm(a, b, offs=offs)
    return _loop(a, b, offs)  # type: ignore[no-any-return]


def _shapes(
    mat_a: Tensor, mat_b: Tensor, offs: Tensor | None
) -> tuple[int, int, float]:
    """``(k, n, rows per group)``, or a ValueError naming what is wrong."""
    if not isinstance(mat_a, Tensor) or not isinstance(mat_b, Tensor):
        raise TypeError(
            "U.grouped_mm: expected tensors mat_a and mat_b, got "
            f"{type(mat_a).__name__} and {type(mat_b).__name__}"
        )
    if mat_b.dim() != 3 or mat_a.dim() not in (2, 3):
        raise ValueError(
            "U.grouped_mm: supports mat_a (tokens, k) with mat_b (groups, k, n) and "
            "offs, or mat_a (groups, m, k) with mat_b (groups, k, n); got mat_a "
            f"{tuple(mat_a.shape)} and mat_b {tuple(mat_b.shape)}"
        )
    groups, k, n = mat_b.shape
    if mat_a.shape[-1] != k:
        raise ValueError(
            f"U.grouped_mm: mat_a's last dimension ({mat_a.shape[-1]}) must equal "
            f"mat_b's middle dimension ({k}); got mat_a {tuple(mat_a.shape)} and "
            f"mat_b {tuple(mat_b.shape)}"
        )
    if mat_a.dim() == 2:
        if offs is None:
            raise ValueError(
                "U.grouped_mm: a 2-D mat_a needs offs, the end row of each group"
            )
        if (
            not isinstance(offs, Tensor)
            or offs.dim() != 1
            or offs.numel() != groups
            or offs.dtype.is_floating_point
        ):
            raise ValueError(
                f"U.grouped_mm: expected offs, a 1-D integer tensor of {groups} "
                f"group ends, got {offs!r:.80}"
            )
        return k, n, mat_a.shape[0] / groups
    if offs is not None:
        raise ValueError("U.grouped_mm: offs is only for a 2-D mat_a")
    if mat_a.shape[0] != groups:
        raise ValueError(
            f"U.grouped_mm: mat_a has {mat_a.shape[0]} groups, mat_b {groups}"
        )
    return k, n, float(mat_a.shape[1])


def grouped_mm(
    mat_a: Tensor,
    mat_b: Tensor,
    offs: Tensor | None = None,
    *,
    bias: Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    constraint: str | None = "to_output_scale",
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.grouped_mm` (the expert layer of a
    mixture of experts).

    .. math::
        y_{\\text{group } g} = \\alpha\\, a_g b_g,\\quad \\alpha = k^{-1/2},\\quad
        \\beta_a = n^{-1/2},\\quad \\beta_b = m^{-1/2}

    for ``b`` of shape ``(groups, k, n)`` and ``m`` rows of ``a`` per group (on
    average, with ``offs``).

    Args:
        mat_a: ``(tokens, k)`` rows sorted by group, or ``(groups, m, k)``.
        mat_b: ``(groups, k, n)``.
        offs: with a 2-D ``mat_a``, the end row of each group (cumulative counts;
            also accepted positionally, as ``torch._grouped_mm`` takes it).
        bias: not supported (``None``), as in torch's CPU kernel.
        out_dtype: the output's dtype (default ``mat_a``'s).
        constraint: applied to ``(alpha, beta_a)``; ``beta_b`` is always
            independent (see the module docstring).

    Example::

        >>> a, b = torch.randn(512, 64), torch.randn(4, 64, 32)
        >>> y = U.grouped_mm(a, b, offs=torch.tensor([128, 256, 384, 512]))
        >>> round(y.std().item(), 1)
        1.0
    """
    validate_constraint(constraint)
    k, n, rows = _shapes(mat_a, mat_b, offs)
    if bias is not None:
        raise ValueError(
            "U.grouped_mm: bias is not supported; add it after the product"
        )
    alpha, beta_a = apply_constraint(constraint, max(k, 1) ** -0.5, max(n, 1) ** -0.5)
    beta_b = max(rows, 1.0) ** -0.5
    # alpha rides on a's forward, so b's gradient (a product with a) needs 1/alpha.
    a = scale_twoway(mat_a, alpha, beta_a)
    b = scale_twoway(mat_b, 1.0, beta_b / alpha)
    out = _product(a, b, offs)
    return out if out_dtype is None else out.to(out_dtype)
