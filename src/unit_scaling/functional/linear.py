"""Unit-scaled matrix products: ``matmul``, ``linear``, ``linear_readout``.

The scales are folded into the ``alpha`` argument that the GEMM kernels
(``addmm``/``baddbmm``) already take, inside autograd functions that save exactly
what the plain op saves. A unit-scaled linear layer therefore costs the same as
``F.linear``: no extra elementwise pass in either direction.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from .._autograd import Function
from .._torch_internals import any_autocast_enabled, unsafe_view
from ..constraints import apply_constraint
from ..scale import scale_bwd, scale_fwd
from ._checks import autocast_inputs, check_linear_args, validate_constraint
from ._scaling import scaled_affine

__all__ = ["bmm", "einsum", "linear", "linear_readout", "matmul"]


_unsafe_view = unsafe_view


def _bmm(a: Tensor, b: Tensor, alpha: float) -> Tensor:
    """``alpha * (a @ b)`` for 3-D operands in one batched GEMM."""
    if alpha == 1:
        return torch.bmm(a, b)
    # With beta=0 baddbmm ignores its first argument (NaN/inf included), so a
    # 1x1x1 view of `a` serves as the broadcastable placeholder without allocating.
    return torch.baddbmm(a[:1, :1, :1], a, b, beta=0, alpha=alpha)


class _ScaledLinearFn(Function):
    """``y = a (x Wᵀ + b)``; ``∂x = c ∂y W``; ``∂W = d ∂yᵀ x``; ``∂b = d Σ ∂y``."""

    @staticmethod
    def forward(
        input: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        output_scale: float,
        grad_input_scale: float,
        grad_weight_scale: float,
    ) -> Tensor:
        # Kept flat (no helper calls): this runs for every linear layer, right after
        # a GEMM has evicted the interpreter's data from cache, where each extra
        # Python frame costs several times what it costs in a microbenchmark.
        # With beta=0 addmm ignores its first argument (NaN/inf included), so a
        # 1x1 view of an operand serves as the placeholder without allocating.
        x = input if input.dim() == 2 else input.reshape(-1, input.shape[-1])
        if bias is not None:
            y = torch.addmm(bias, x, weight.t(), beta=output_scale, alpha=output_scale)
        elif output_scale == 1:
            y = torch.mm(x, weight.t())
        else:
            y = torch.addmm(x[:1, :1], x, weight.t(), beta=0, alpha=output_scale)
        if input.dim() == 2:
            return y
        # Not y.view(...): a view made inside a custom Function may not be modified
        # in place, and models do write `h += ...` on a linear layer's output.
        out: Tensor = _unsafe_view(y, (*input.shape[:-1], weight.shape[0]))
        return out

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        input, weight, bias, _, grad_input_scale, grad_weight_scale = inputs
        ctx.save_for_backward(input, weight)
        ctx.scales = (grad_input_scale, grad_weight_scale)
        ctx.has_bias = bias is not None

    @staticmethod
    def backward(
        ctx: Any, grad_output: Tensor
    ) -> tuple[Tensor | None, Tensor | None, Tensor | None, None, None, None]:
        input, weight = ctx.saved_tensors
        grad_input_scale, grad_weight_scale = ctx.scales
        needs_input, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        flat = grad_output.dim() == 2
        g = grad_output if flat else grad_output.reshape(-1, grad_output.shape[-1])
        grad_input = grad_weight = grad_bias = None
        # As in forward: alpha=1 takes mm, anything else addmm with beta=0.
        if needs_input:
            if grad_input_scale == 1:
                grad_input = torch.mm(g, weight)
            else:
                grad_input = torch.addmm(
                    g[:1, :1], g, weight, beta=0, alpha=grad_input_scale
                )
            if not flat:
                grad_input = grad_input.view(input.shape)
        if needs_weight:
            x = input if flat else input.reshape(-1, input.shape[-1])
            gt = g.t()
            if grad_weight_scale == 1:
                grad_weight = torch.mm(gt, x)
            else:
                grad_weight = torch.addmm(
                    gt[:1, :1], gt, x, beta=0, alpha=grad_weight_scale
                )
        if ctx.has_bias and needs_bias:
            grad_bias = g.sum(0).mul_(grad_weight_scale)
        return grad_input, grad_weight, grad_bias, None, None, None


class _ScaledBmmFn(Function):
    """``y = a (L @ R)``; ``∂L = b ∂y Rᵀ``; ``∂R = c Lᵀ ∂y`` for 3-D operands."""

    @staticmethod
    def forward(
        left: Tensor,
        right: Tensor,
        output_scale: float,
        left_scale: float,
        right_scale: float,
    ) -> Tensor:
        return _bmm(left, right, output_scale)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        left, right, _, left_scale, right_scale = inputs
        ctx.save_for_backward(left, right)
        ctx.scales = (left_scale, right_scale)

    @staticmethod
    def backward(
        ctx: Any, grad_output: Tensor
    ) -> tuple[Tensor | None, Tensor | None, None, None, None]:
        left, right = ctx.saved_tensors
        left_scale, right_scale = ctx.scales
        grad_left = grad_right = None
        if ctx.needs_input_grad[0]:
            grad_left = _bmm(grad_output, right.transpose(1, 2), left_scale)
        if ctx.needs_input_grad[1]:
            grad_right = _bmm(left.transpose(1, 2), grad_output, right_scale)
        return grad_left, grad_right, None, None, None


def linear(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    constraint: str | None = "to_output_scale",
    scale_power: tuple[float, float, float] = (0.5, 0.5, 0.5),
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.linear`.

    .. math::
        y = \\alpha (x W^T + b),\\quad
        \\alpha = \\text{fan\\_in}^{-p_0},\\quad
        \\beta_x = \\text{fan\\_out}^{-p_1},\\quad
        \\beta_W = \\beta_b = \\text{batch}^{-p_2}

    where ``batch = input.numel() / fan_in``. The constraint ties ``alpha`` and
    ``beta_x``; the weight and bias gradient scales are always independent.

    Args:
        input: ``(..., fan_in)``.
        weight: ``(fan_out, fan_in)``.
        bias: ``(fan_out,)`` or ``None``.
        constraint: applied to ``(alpha, beta_x)``; see :mod:`unit_scaling.constraints`.
        scale_power: the powers ``(p0, p1, p2)``.

    Example::

        >>> y = U.linear(torch.randn(64, 256), torch.randn(512, 256))
        >>> round(y.std().item(), 1)
        1.0
    """
    if (
        weight.dim() != 2
        or input.dim() == 0
        or input.shape[-1] != weight.shape[1]
        or (bias is not None and bias.shape != weight.shape[:1])
    ):
        check_linear_args("U.linear", input, weight, bias)
    if type(scale_power) is not tuple:
        scale_power = tuple(scale_power)  # type: ignore[assignment]
    shape = (weight.shape[0], weight.shape[1], input.numel())
    scales = (
        _linear_scales if not torch.compiler.is_compiling() else _compute_linear_scales
    )(constraint, scale_power, *shape)
    if _any_autocast_enabled():
        input, weight, bias = cast(
            tuple[Tensor, Tensor, Tensor | None], autocast_inputs(input, weight, bias)
        )
    if input.numel() == 0 or weight.numel() == 0:
        # Zero-size operands: the GEMM placeholders of _ScaledLinearFn would not
        # broadcast, and speed does not matter. The same function as torch ops.
        # `scales` are constrained already, hence no constraint here.
        alpha, beta_x, beta_w = scales
        return scaled_affine(
            F.linear, input, weight, bias, alpha, (beta_x, beta_w, beta_w), None
        )
    out: Tensor = _ScaledLinearFn.apply(input, weight, bias, *scales)
    return out


def _compute_linear_scales(
    constraint: str | None,
    scale_power: tuple[float, float, float],
    fan_out: int,
    fan_in: int,
    input_numel: int,
) -> tuple[float, float, float]:
    """``(output, grad_input, grad_weight)`` scales of :func:`linear`. A
    zero-size dimension (empty output or gradient, as torch allows) counts as 1."""
    validate_constraint(constraint)
    fan_out, fan_in = max(fan_out, 1), max(fan_in, 1)
    batch = max(input_numel // fan_in, 1)
    output_scale, grad_input_scale = apply_constraint(
        constraint, fan_in ** -scale_power[0], fan_out ** -scale_power[1]
    )
    return output_scale, grad_input_scale, batch ** -scale_power[2]


# Memoised for eager mode, where a model calls `linear` with a handful of distinct
# shapes many times. Under torch.compile the computation is traced instead (Dynamo
# warns about lru_cache) and folded into the graph as constants.
_linear_scales = functools.lru_cache(maxsize=4096)(_compute_linear_scales)
# One C call when autocast is off (the usual case).
_any_autocast_enabled = any_autocast_enabled


def linear_readout(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    constraint: str | None = None,
) -> Tensor:
    """Unit-scaled readout (final) linear layer, the μP output rule.

    :func:`linear` with ``scale_power=(1, 1/2, 1/2)``: the output is scaled by
    ``1 / fan_in`` rather than ``1 / sqrt(fan_in)``, so the logits shrink as the
    model widens, and the layer is unconstrained by default.

    Example::

        >>> logits = U.linear_readout(torch.randn(8, 64), torch.randn(10, 64))
        >>> logits.std().item() < 0.5
        True
    """
    return linear(input, weight, bias, constraint, scale_power=(1.0, 0.5, 0.5))


def _broadcast_batch(op: str, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    try:
        return tuple(torch.broadcast_shapes(*shapes))  # type: ignore[no-untyped-call]
    except RuntimeError:
        raise ValueError(
            f"U.{op}: batch dimensions {', '.join(map(str, shapes))} do not "
            "broadcast to a common shape"
        ) from None


def matmul(
    left: Tensor, right: Tensor, constraint: str | None = "to_output_scale"
) -> Tensor:
    """Unit-scaled :func:`torch.matmul`.

    For ``[m, k] @ [k, n]``:

    .. math::
        \\alpha = k^{-1/2}, \\quad \\beta_{left} = n^{-1/2}, \\quad
        \\beta_{right} = m^{-1/2}

    With batch dimensions, each count also includes the operand's broadcast
    expansion: with ``B`` the numel of the broadcast batch shape and ``B_left``,
    ``B_right`` each operand's own, ``beta_left = (n B / B_left)^-1/2`` and
    ``beta_right = (m B / B_right)^-1/2`` (a gradient element sums that many
    unit terms). A 1-D operand counts as one row (``m = 1``) or column (``n = 1``).

    Args:
        left: at least 1-D.
        right: at least 1-D; inner dimensions must match.
        constraint: applied to ``(alpha, beta_left, beta_right)``.

    Example::

        >>> y = U.matmul(torch.randn(256, 512), torch.randn(512, 256))
        >>> round(y.std().item(), 1)
        1.0
    """
    validate_constraint(constraint)
    if (
        left.dim() == 0
        or right.dim() == 0
        or (left.shape[-1] != right.shape[-2 if right.dim() >= 2 else 0])
    ):
        raise ValueError(
            "U.matmul: expected operands of shape (..., m, k) and (..., k, n), got "
            f"{tuple(left.shape)} and {tuple(right.shape)}"
        )
    k = left.shape[-1]
    m = left.shape[-2] if left.dim() >= 2 else 1
    n = right.shape[-1] if right.dim() >= 2 else 1
    left_batch, right_batch = left.shape[:-2], right.shape[:-2]
    batch = math.prod(_broadcast_batch("matmul", left_batch, right_batch))
    output_scale, left_scale, right_scale = apply_constraint(
        constraint,
        max(k, 1) ** -0.5,
        max(n * batch // max(math.prod(left_batch), 1), 1) ** -0.5,
        max(m * batch // max(math.prod(right_batch), 1), 1) ** -0.5,
    )
    left, right = cast(tuple[Tensor, Tensor], autocast_inputs(left, right))
    if right.dim() == 2:
        out: Tensor = _ScaledLinearFn.apply(
            left, right.t(), None, output_scale, left_scale, right_scale
        )
        return out
    if left.dim() >= 3 and left.shape[:-2] == right.shape[:-2]:
        out = _ScaledBmmFn.apply(
            left.reshape(-1, *left.shape[-2:]),
            right.reshape(-1, *right.shape[-2:]),
            output_scale,
            left_scale,
            right_scale,
        )
        return out.view(*left.shape[:-2], *out.shape[-2:])
    # General broadcasting: separate scale ops around torch.matmul.
    left = scale_bwd(left, left_scale)
    right = scale_bwd(right, right_scale)
    return scale_fwd(torch.matmul(left, right), output_scale)


def bmm(
    input: Tensor, mat2: Tensor, constraint: str | None = "to_output_scale"
) -> Tensor:
    """Unit-scaled :func:`torch.bmm`.

    For ``[b, m, k] @ [b, k, n]``:

    .. math::
        \\alpha = k^{-1/2}, \\quad \\beta_{input} = n^{-1/2}, \\quad
        \\beta_{mat2} = m^{-1/2}

    The scales are folded into the batched GEMM's ``alpha`` in both passes.

    Args:
        input: ``(b, m, k)``.
        mat2: ``(b, k, n)``.
        constraint: applied to ``(alpha, beta_input, beta_mat2)``.

    Example::

        >>> y = U.bmm(torch.randn(8, 64, 128), torch.randn(8, 128, 64))
        >>> round(y.std().item(), 1)
        1.0
    """
    validate_constraint(constraint)
    if (
        input.dim() != 3
        or mat2.dim() != 3
        or input.shape[0] != mat2.shape[0]
        or input.shape[2] != mat2.shape[1]
    ):
        raise ValueError(
            "U.bmm: expected input of shape (b, m, k) and mat2 of shape (b, k, n), "
            f"got input {tuple(input.shape)} and mat2 {tuple(mat2.shape)}"
        )
    _, m, k = input.shape
    n = mat2.shape[2]
    scales = apply_constraint(
        constraint, max(k, 1) ** -0.5, max(n, 1) ** -0.5, max(m, 1) ** -0.5
    )
    input, mat2 = cast(tuple[Tensor, Tensor], autocast_inputs(input, mat2))
    out: Tensor = _ScaledBmmFn.apply(input, mat2, *scales)
    return out


def _einsum_labels(
    equation: str, operands: tuple[Tensor, ...]
) -> tuple[list[dict[str, int]], set[str], dict[str, int]]:
    """Parse an einsum equation: each operand's labels, the output labels, sizes.

    Returns, for each operand, a dict from its (distinct) labels to its own sizes;
    the set of output labels; and each label's broadcast size. Dimensions under
    ``...`` get labels ``".0"``, ``".1"``, ... aligned from the right, as in
    broadcasting.
    """

    def invalid(reason: str) -> ValueError:
        return ValueError(f"U.einsum: invalid equation={equation!r}: {reason}")

    def parse_term(term: str) -> tuple[str, bool, str]:
        before, dots, after = term.partition("...")
        letters = before + after
        if "." in after or not all(c.isascii() and c.isalpha() for c in letters):
            raise invalid(f"{term!r} may contain only letters and one '...'")
        return before, bool(dots), after

    lhs, arrow, rhs = equation.replace(" ", "").partition("->")
    if "->" in rhs:
        raise invalid("more than one '->'")
    terms = [parse_term(term) for term in lhs.split(",")]
    if len(terms) != len(operands):
        raise ValueError(
            f"U.einsum: equation={equation!r} has {len(terms)} operand term(s) but "
            f"{len(operands)} operand(s) were given"
        )
    ellipsis_dims = [
        op.dim() - len(before) - len(after)
        for (before, _, after), op in zip(terms, operands, strict=True)
    ]
    for (before, dots, after), dims, op in zip(
        terms, ellipsis_dims, operands, strict=True
    ):
        if dims < 0 or (dims > 0 and not dots):
            raise invalid(
                f"term {before + ('...' if dots else '') + after!r} does not match "
                f"an operand of shape {tuple(op.shape)}"
            )
    ellipsis_rank = max(ellipsis_dims, default=0)
    operand_labels: list[dict[str, int]] = []
    sizes: dict[str, int] = {}
    every_label: list[str] = []
    for (before, _, after), dims, op in zip(
        terms, ellipsis_dims, operands, strict=True
    ):
        dotted = [f".{ellipsis_rank - dims + i}" for i in range(dims)]
        labels = [*before, *dotted, *after]
        every_label += labels
        own: dict[str, int] = {}
        for label, size in zip(labels, op.shape, strict=True):
            known = sizes.setdefault(label, size)
            if size != known and 1 not in (size, known):
                raise invalid(f"label {label!r} has sizes {known} and {size}")
            sizes[label] = max(size, known)
            own[label] = size
        operand_labels.append(own)
    if arrow:
        before, dots, after = parse_term(rhs)
        output = [*before, *after]
        if len(set(output)) != len(output) or not set(output) <= set(every_label):
            raise invalid("output labels must be distinct and appear in an input")
        dotted = [f".{i}" for i in range(ellipsis_rank)] if dots else []
        output_labels = {*output, *dotted}
    else:
        # Implicit output: the broadcast dims and every label used exactly once.
        output_labels = {
            label
            for label in every_label
            if label.startswith(".") or every_label.count(label) == 1
        }
    return operand_labels, output_labels, sizes


def einsum(
    equation: str,
    *operands: Tensor | Sequence[Tensor],
    constraint: str | None = "to_output_scale",
) -> Tensor:
    """Unit-scaled :func:`torch.einsum`.

    With ``S`` the product of the sizes of all labels (the iteration space), an
    output element sums ``S / |out|`` products and a gradient element of operand
    ``i`` sums ``S / |A_i|`` of them, where ``|X|`` is the product of the sizes of
    ``X``'s distinct labels:

    .. math::
        \\alpha = \\Big(\\prod_{l \\notin out} s_l\\Big)^{-1/2}, \\quad
        \\beta_i = \\Big(\\prod_{l \\notin A_i} s_l\\Big)^{-1/2}

    i.e. the output is scaled by the contracted sizes and each operand's gradient
    by the sizes of the labels summed when computing it (labels elsewhere but not
    in that operand, and the broadcast expansion of its size-1 dimensions). For
    ``"mk,kn->mn"`` this is :func:`matmul`'s rule. Repeated labels within one
    operand (diagonals) are counted once. When the constraint makes all scales
    equal (the default) the op is ``alpha * einsum(...)`` with its true gradient,
    folded into the smallest of the operands and the output.

    Args:
        equation: subscripts such as ``"bij,bjk->bik"``, with optional ``...``
            (the sublist format is not supported).
        operands: the tensors, or one list of them.
        constraint: applied to ``(alpha, beta_1, ..., beta_n)``.

    Example::

        >>> y = U.einsum("bij,jk->bik", torch.randn(8, 64, 128), torch.randn(128, 64))
        >>> round(y.std().item(), 1)
        1.0
    """
    validate_constraint(constraint)
    if not isinstance(equation, str):
        raise TypeError(
            "U.einsum: equation must be a string such as 'ij,jk->ik' (the sublist "
            f"format is not supported), got {type(equation).__name__}"
        )
    if len(operands) == 1 and not isinstance(operands[0], Tensor):
        operands = tuple(operands[0])
    tensors = cast(tuple[Tensor, ...], operands)
    operand_labels, output_labels, sizes = _einsum_labels(equation, tensors)
    space = max(math.prod(list(sizes.values())), 1)
    out_numel = math.prod([sizes[label] for label in output_labels])
    output_scale, *grad_scales = apply_constraint(
        constraint,
        (space / max(out_numel, 1)) ** -0.5,
        *(
            (space / max(math.prod(list(own.values())), 1)) ** -0.5
            for own in operand_labels
        ),
    )
    if all(s == output_scale for s in grad_scales):
        if output_scale == 1:
            return torch.einsum(equation, *tensors)
        # alpha * f with its true gradient: scale whichever tensor is smallest.
        numels = [t.numel() for t in tensors]
        smallest = numels.index(min(numels))
        if out_numel < numels[smallest]:
            return torch.einsum(equation, *tensors) * output_scale
        scaled = list(tensors)
        scaled[smallest] = scaled[smallest] * output_scale
        return torch.einsum(equation, *scaled)
    scaled = [scale_bwd(t, s) for t, s in zip(tensors, grad_scales, strict=True)]
    return scale_fwd(torch.einsum(equation, *scaled), output_scale)
