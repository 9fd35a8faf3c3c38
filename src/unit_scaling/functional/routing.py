"""Unit-scaled routing: ``index_add``, ``scatter_add``, ``gather``, ``index_select``.

These are the dispatch and combine steps of a mixture of experts (and of any
sparse lookup). Scales depend on shapes only, as expectations under uniformly
random indices:

* **combining** (``index_add``, ``scatter_add``) adds ``r = terms / outputs``
  source elements into each output element on average, plus the ``input``
  element itself unless the caller says it is zero (MoE combinations start from
  ``torch.zeros``): output scale ``(1 + r)^-½`` or ``r^-½``. Each input and
  source element receives one output-gradient element, so their gradients are
  already unit;
* **selecting** (``gather``, ``index_select``) copies elements, so the output is
  already unit, and each input element's gradient sums the ``picks`` times it
  was selected (``picks = selected / input elements``): gradient scale
  ``picks^-½``, like :func:`~unit_scaling.functional.embedding`'s weight.

Non-floating-point tensors (indices, counts) are routed plainly, unscaled.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._twoway import scale_twoway
from ..constraints import apply_constraint
from ..scale import scale_bwd
from ._checks import check_dim, validate_constraint

__all__ = ["gather", "index_add", "index_select", "scatter_add"]


def _size(t: Tensor, dim: int) -> int:
    return t.shape[dim] if t.dim() > 0 else 1


def _combine_scales(
    constraint: str | None, terms: int, outputs: int, input_is_zero: bool
) -> tuple[float, float, float]:
    """``(output, grad input, grad source)`` scales of a combination."""
    per_output = terms / max(outputs, 1)
    carried = per_output if input_is_zero else 1 + per_output
    output_scale = carried**-0.5 if carried > 0 else 1.0
    sigma, beta_x, beta_s = apply_constraint(constraint, output_scale, 1.0, 1.0)
    return sigma, beta_x, beta_s


def _combine_input(
    input: Tensor, output_scale: float, grad_scale: float, input_is_zero: bool
) -> Tensor:
    # A zero input needs no forward multiply: the output scale leaves it zero.
    return scale_twoway(input, 1.0 if input_is_zero else output_scale, grad_scale)


def _check_dims(op: str, expected: str, ok: bool, **tensors: Tensor) -> None:
    if not ok:
        got = ", ".join(f"{name} {tuple(t.shape)}" for name, t in tensors.items())
        raise ValueError(f"U.{op}: expected {expected}, got {got}")


def index_add(
    input: Tensor,
    dim: int,
    index: Tensor,
    source: Tensor,
    *,
    alpha: float = 1,
    constraint: str | None = "to_output_scale",
    input_is_zero: bool = False,
) -> Tensor:
    """Unit-scaled :func:`torch.index_add`: ``input`` plus ``alpha * source``
    rows added at ``index`` along ``dim``.

    .. math::
        y = \\sigma\\,(x + \\alpha \\textstyle\\sum_{i: \\mathrm{index}_i = j}
            s_i),\\quad
        \\sigma = (1 + r)^{-1/2}\\ \\big(r^{-1/2} \\text{ if input\\_is\\_zero}\\big),
        \\quad r = \\frac{\\text{source.shape[dim]}}{\\text{input.shape[dim]}},
        \\quad \\beta_x = \\beta_s = 1

    ``r`` is the number of source rows each output row receives under uniform
    routing. The gradients of ``input`` and ``source`` are copies of the output
    gradient, already unit. The constraint applies to
    ``(sigma, beta_x, beta_s)``; by default all are ``sigma`` and the op is
    ``sigma * index_add(...)`` with its true gradient, ``sigma`` folded into
    ``alpha``.

    Args:
        input: the tensor added into (not modified).
        dim: the dimension along which to index.
        index: 1-D indices into ``input``'s ``dim``, one per source row.
        source: the rows to add, ``source.shape[dim] == len(index)``.
        alpha: multiplier of ``source``, as in torch (keyword-only).
        constraint: applied to ``(sigma, beta_x, beta_s)``; see
            :mod:`unit_scaling.constraints`.
        input_is_zero: promise that ``input`` is all zeros (the start of a
            mixture-of-experts combination), so that it does not count as a
            term; shapes cannot tell.

    Example::

        >>> tokens, experts_out = torch.zeros(1024, 32), torch.randn(2048, 32)
        >>> index = torch.randint(0, 1024, (2048,))
        >>> y = U.index_add(tokens, 0, index, experts_out, input_is_zero=True)
        >>> round(y.pow(2).mean().sqrt().item(), 1)
        1.0
    """
    check_dim("index_add", dim, input)
    validate_constraint(constraint)
    if not input.is_floating_point():
        return torch.index_add(input, dim, index, source, alpha=alpha)
    _check_dims(
        "index_add",
        "1-D index and source with input's number of dims",
        index.dim() <= 1 and source.dim() == input.dim(),
        input=input,
        index=index,
        source=source,
    )
    sigma, beta_x, beta_s = _combine_scales(
        constraint, _size(source, dim), _size(input, dim), input_is_zero
    )
    input = _combine_input(input, sigma, beta_x, input_is_zero)
    # index_add's alpha carries sigma into the source's contribution.
    source = scale_bwd(source, beta_s / sigma)
    return torch.index_add(input, dim, index, source, alpha=alpha * sigma)


def scatter_add(
    input: Tensor,
    dim: int,
    index: Tensor,
    src: Tensor,
    constraint: str | None = "to_output_scale",
    input_is_zero: bool = False,
) -> Tensor:
    """Unit-scaled :func:`torch.scatter_add`: ``src`` elements added into
    ``input`` at ``index`` along ``dim``.

    .. math::
        y = \\sigma\\,(x + \\mathrm{scatter}(s)),\\quad
        \\sigma = (1 + r)^{-1/2}\\ \\big(r^{-1/2} \\text{ if input\\_is\\_zero}\\big),
        \\quad r = \\frac{\\text{index.numel()}}{\\text{input.numel()}},
        \\quad \\beta_x = \\beta_s = 1

    ``r`` is the number of ``src`` elements each output element receives under
    uniform routing (only the ``index.numel()`` elements of ``src`` that
    ``index`` covers are added). Their gradients are copies of the output
    gradient, already unit. The constraint applies to
    ``(sigma, beta_x, beta_s)``.

    Args:
        input: the tensor added into (not modified).
        dim: the dimension along which to scatter.
        index: where each element of ``src`` goes along ``dim``; same number of
            dims as ``input``.
        src: the elements to add.
        constraint: applied to ``(sigma, beta_x, beta_s)``; see
            :mod:`unit_scaling.constraints`.
        input_is_zero: promise that ``input`` is all zeros, so that it does not
            count as a term.

    Example::

        >>> src, index = torch.randn(4096, 8), torch.randint(0, 256, (4096, 8))
        >>> y = U.scatter_add(torch.zeros(256, 8), 0, index, src, input_is_zero=True)
        >>> round(y.pow(2).mean().sqrt().item(), 1)
        1.0
    """
    check_dim("scatter_add", dim, input)
    validate_constraint(constraint)
    if not input.is_floating_point():
        return torch.scatter_add(input, dim, index, src)
    _check_dims(
        "scatter_add",
        "input, index and src with the same number of dims",
        input.dim() == index.dim() == src.dim(),
        input=input,
        index=index,
        src=src,
    )
    sigma, beta_x, beta_s = _combine_scales(
        constraint, index.numel(), input.numel(), input_is_zero
    )
    input = _combine_input(input, sigma, beta_x, input_is_zero)
    return torch.scatter_add(input, dim, index, scale_twoway(src, sigma, beta_s))


def gather(
    input: Tensor, dim: int, index: Tensor, *, sparse_grad: bool = False
) -> Tensor:
    """Unit-scaled :func:`torch.gather`: ``input`` elements picked at ``index``.

    .. math::
        y = \\mathrm{gather}(x, \\mathrm{index}),\\qquad
        \\beta_x = \\left(\\frac{\\text{input.numel()}}
            {\\text{index.numel()}}\\right)^{1/2}

    The output copies unit data, so it is unscaled. Each input element is picked
    ``index.numel() / input.numel()`` times on average (uniform routing), and
    its gradient sums that many unit terms, hence ``beta_x``.

    Args:
        input: the source tensor.
        dim: the dimension along which to index.
        index: the indices, with ``input``'s number of dims.
        sparse_grad: as in torch (keyword-only).

    Example::

        >>> x = torch.randn(64, 32, requires_grad=True)
        >>> index = torch.randint(0, 64, (256, 32))
        >>> U.gather(x, 0, index).backward(torch.randn(256, 32))
        >>> round(x.grad.pow(2).mean().sqrt().item(), 1)
        1.0
    """
    check_dim("gather", dim, input)
    if input.is_floating_point():
        _check_dims(
            "gather",
            "input and index with the same number of dims",
            input.dim() == index.dim(),
            input=input,
            index=index,
        )
        scale = (max(input.numel(), 1) / max(index.numel(), 1)) ** 0.5
        input = scale_bwd(input, scale)
    return torch.gather(input, dim, index, sparse_grad=sparse_grad)


def index_select(input: Tensor, dim: int, index: Tensor) -> Tensor:
    """Unit-scaled :func:`torch.index_select`: slices of ``input`` at ``index``.

    .. math::
        y = x[\\ldots, \\mathrm{index}, \\ldots],\\qquad
        \\beta_x = \\left(\\frac{\\text{input.shape[dim]}}{\\text{len(index)}}
            \\right)^{1/2}

    The output copies unit data, so it is unscaled; each input slice is selected
    ``len(index) / input.shape[dim]`` times on average, and its gradient sums
    that many unit terms, hence ``beta_x``.

    Args:
        input: the source tensor.
        dim: the dimension along which to select.
        index: 1-D indices.

    Example::

        >>> x = torch.randn(64, 32, requires_grad=True)
        >>> y = U.index_select(x, 0, torch.randint(0, 64, (256,)))
        >>> y.backward(torch.randn(256, 32))
        >>> round(x.grad.pow(2).mean().sqrt().item(), 1)
        1.0
    """
    check_dim("index_select", dim, input)
    if input.is_floating_point():
        _check_dims(
            "index_select", "1-D index", index.dim() <= 1, input=input, index=index
        )
        scale = (_size(input, dim) / max(index.numel(), 1)) ** 0.5
        input = scale_bwd(input, scale)
    return torch.index_select(input, dim, index)
