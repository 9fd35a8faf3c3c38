"""Matrix products on block-quantised operands, forward and backward.

A product ``y = f(a, b)``, bilinear in ``a`` and ``b`` (a linear layer, matmul,
einsum, or a scaled version of one), runs three GEMMs: the forward one, the one
giving ``∂a`` (from ``∂y`` and ``b``) and the one giving ``∂b`` (from ``∂y`` and
``a``). Each quantises its two operands along its own contraction, the axes that
it sums over: for ``y = x W^T`` the input features, the output features and the
tokens. The axes are named by einsum-style labels, one per dimension; a GEMM's
contraction is every label of its operands that its result lacks (or holds with
size 1 where the operands broadcast it). Several contracted axes are flattened
into one, in a single label order shared by both operands (the order in which
the labels are first named: ``a``'s, then ``b``'s), so their blocks line up as a
GEMM's would; for a convolution unfolded into a matmul this is the order of the
unfolded columns.

The backward GEMMs are computed by the product's own autograd, evaluated once
more at the backward operands: ``∂a`` is the vector-Jacobian product of
``f(·, b')`` with ``∂y'``, so a scaled product (a unit-scaled linear layer) keeps
its gradient scales, and any further arguments (a bias) get their gradient from
the unquantised ``∂y``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .._torch_internals import TorchDispatchMode
from ._block import BlockFormat
from ._recipe import Recipe, random_hadamard

__all__ = [
    "quantised_attention",
    "quantised_conv",
    "quantised_einsum",
    "quantised_linear",
    "quantised_matmul",
]

Labels = tuple[str, ...]
_HADAMARD_SIZE = 16


@dataclass(frozen=True)
class _Product:
    """One call's product: the function, its operands' labels, the recipe."""

    op: Callable[..., Tensor]
    left: Labels
    right: Labels
    out: Labels
    recipe: Recipe
    # How each GEMM quantises its operands (default: by the labels).
    planner: Callable[[_Product, Tensor, Tensor, Sequence[int]], _Plan] | None = None
    out_shape: tuple[int, ...] | None = None  # where labels do not give it

    def plan(self, left: Tensor, right: Tensor, out_shape: Sequence[int]) -> _Plan:
        """How each GEMM quantises its operands, for these operands."""
        planner = self.planner or _label_plan
        return planner(self, left, right, out_shape)

    def order(self, label: str) -> int:
        return (*self.left, *self.right, *self.out).index(label)


def _contraction(
    result: Labels, result_shape: Sequence[int], sizes: dict[str, int]
) -> set[str]:
    """The labels a GEMM giving ``result`` sums over."""
    own = dict(zip(result, result_shape, strict=True))
    return {
        label
        for label, size in sizes.items()
        if label not in own or (own[label] == 1 and size > 1)
    }


def _dims(product: _Product, labels: Labels, summed: set[str]) -> list[int]:
    """The axes of an operand with ``labels`` that a GEMM summing ``summed``
    contracts, in the product's label order."""
    found = [d for d, label in enumerate(labels) if label in summed]
    return sorted(found, key=lambda d: product.order(labels[d]))


def _rotate(flat: Tensor, hadamard: Tensor) -> Tensor:
    """``flat``'s last axis times ``hadamard`` in consecutive groups, a shorter
    tail left as it is (a block-diagonal orthogonal matrix)."""
    size = hadamard.shape[0]
    whole = flat.shape[-1] // size * size
    if whole == 0:
        return flat
    lead = flat.shape[:-1]
    # One (rows, size) x (size, size) GEMM: a batched product of this shape
    # runs on CPU as one small GEMM per row.
    groups = flat[..., :whole].reshape(-1, size)
    head = torch.mm(groups, hadamard).reshape(*lead, whole)
    if whole == flat.shape[-1]:
        return head
    return torch.cat([head, flat[..., whole:]], -1)


def _prepare(
    x: Tensor,
    dims: list[int],
    fmt: BlockFormat | None,
    recipe: Recipe,
    rotate: bool = False,
) -> Tensor:
    """``x`` as a GEMM contracting its ``dims`` reads it: rotated (optionally)
    and quantised along those axes, flattened in the given order."""
    if fmt is None and not rotate:
        return x
    first = dims[0] if dims else 0
    if not rotate and fmt is not None and dims == list(range(first, first + len(dims))):
        # The contracted axes are adjacent and in order: quantise along them
        # merged, in x's own layout (no transposed copy, a contiguous result).
        merged = (
            x.reshape(
                *x.shape[:first],
                math.prod(x.shape[d] for d in dims),
                *x.shape[first + len(dims) :],
            )
            if len(dims) != 1
            else x
        )
        if fmt.block_dims == 2 and merged.dim() < 2:
            fmt = BlockFormat(fmt.element, fmt.block_size, fmt.scale, fmt.scale_rule)
        if fmt.block_dims == 1 or first >= merged.dim() - 2:
            amax = recipe.tensor_amax if fmt.scale == "e4m3" else None
            return fmt.quantise(merged, first, tensor_amax=amax).reshape(x.shape)
    kept = [d for d in range(x.dim()) if d not in dims]
    order = kept + dims
    moved = x.permute(order)
    lead = moved.shape[: len(kept)]
    flat = moved.reshape(*lead, math.prod(moved.shape[len(kept) :]))
    if rotate:
        flat = _rotate(flat, random_hadamard(_HADAMARD_SIZE, device=x.device).to(x))
    if fmt is not None:
        if fmt.block_dims == 2 and flat.dim() < 2:
            fmt = BlockFormat(fmt.element, fmt.block_size, fmt.scale, fmt.scale_rule)
        amax = recipe.tensor_amax if fmt.scale == "e4m3" else None
        flat = fmt.quantise(flat, -1, tensor_amax=amax)
    inverse = sorted(range(x.dim()), key=order.__getitem__)
    return flat.reshape(moved.shape).permute(inverse)


Quantiser = Callable[[Tensor], Tensor]


class _Plan(NamedTuple):
    """How each GEMM quantises its operands: ``(Q1, Q2)`` for ``(a, b)`` in the
    forward GEMM, ``(Q3, Q4)`` for ``(∂y, b)`` in ``∂a``'s, ``(Q5, Q6)`` for
    ``(∂y, a)`` in ``∂b``'s."""

    forward: tuple[Quantiser, Quantiser]
    grad_input: tuple[Quantiser, Quantiser]
    grad_weight: tuple[Quantiser, Quantiser]


def _quantiser(
    dims: list[int], fmt: BlockFormat | None, recipe: Recipe, rotate: bool = False
) -> Quantiser:
    return lambda x: _prepare(x, dims, fmt, recipe, rotate)


def _label_plan(
    product: _Product, left: Tensor, right: Tensor, out_shape: Sequence[int]
) -> _Plan:
    """The plan of a product whose axes are named by labels: each GEMM
    contracts the labels its result lacks."""
    recipe = product.recipe
    sizes = _sizes(product, left, right)
    summed = _contraction(product.out, [sizes[x] for x in product.out], sizes)
    # ∂left's GEMM: ∂y and right, summing what left lacks; ∂right's: ∂y and
    # left, summing what right lacks.
    summed_l = _contraction(product.left, left.shape, sizes)
    summed_r = _contraction(product.right, right.shape, sizes)
    dims_out_r = _dims(product, product.out, summed_r)
    dims_left = _dims(product, product.left, summed_r)
    # A Hadamard transform lines up only where both operands hold the whole
    # contraction.
    rotate = recipe.hadamard and math.prod(left.shape[d] for d in dims_left) == (
        math.prod(out_shape[d] for d in dims_out_r)
    )
    return _Plan(
        (
            _quantiser(_dims(product, product.left, summed), recipe.forward[0], recipe),
            _quantiser(
                _dims(product, product.right, summed), recipe.forward[1], recipe
            ),
        ),
        (
            _quantiser(
                _dims(product, product.out, summed_l), recipe.grad_input[0], recipe
            ),
            _quantiser(
                _dims(product, product.right, summed_l), recipe.grad_input[1], recipe
            ),
        ),
        (
            _quantiser(dims_out_r, recipe.grad_weight[0], recipe, rotate),
            _quantiser(dims_left, recipe.grad_weight[1], recipe, rotate),
        ),
    )


class _QuantisedProductFn(torch.autograd.Function):
    """``f(Q1(a), Q2(b))``; ``∂a = vjp_a f(·, Q4(b)) [Q3(∂y)]``;
    ``∂b = vjp_b f(Q6(a), ·) [Q5(∂y)]``; other arguments: ``vjp f [∂y]``."""

    @staticmethod
    def forward(
        ctx: Any, product: _Product, left: Tensor, right: Tensor, *others: Any
    ) -> Tensor:
        out_shape = _output_shape(product, left, right)
        plan = product.plan(left, right, out_shape)
        q_left, q_right = plan.forward[0](left), plan.forward[1](right)
        ctx.product = product
        tensors = [o for o in others if isinstance(o, Tensor)]
        ctx.save_for_backward(left, right, *tensors)
        # The tensors among ``others`` are saved; the rest kept as they are.
        ctx.saved = [isinstance(o, Tensor) for o in others]
        ctx.others = [
            None if saved else o for o, saved in zip(others, ctx.saved, strict=True)
        ]
        return product.op(q_left, q_right, *others)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        product: _Product = ctx.product
        left, right, *saved = ctx.saved_tensors
        needs = ctx.needs_input_grad[1:]
        plan = product.plan(left, right, grad.shape)
        grads: list[Tensor | None] = [None] * (2 + len(ctx.others))
        saved_iter = iter(saved)
        others = [
            next(saved_iter).detach() if is_saved else o
            for o, is_saved in zip(ctx.others, ctx.saved, strict=True)
        ]
        # One graph per gradient, only its own input requiring grad (a custom
        # Function computes every gradient its inputs need), each recomputing
        # the product's forward without its GEMMs (their results are unused).
        if needs[0]:
            q_right = plan.grad_input[1](right.detach())
            g = plan.grad_input[0](grad)
            grads[0] = _vjp(product, [left.detach(), q_right, *others], 0, g)
        if needs[1]:
            q_left = plan.grad_weight[1](left.detach())
            g = plan.grad_weight[0](grad)
            grads[1] = _vjp(product, [q_left, right.detach(), *others], 1, g)
        for i, need in enumerate(needs[2:]):
            if need:
                operands = [left.detach(), right.detach(), *others]
                grads[2 + i] = _vjp(product, operands, 2 + i, grad)
        return (None, *grads)


def _output_shape(product: _Product, left: Tensor, right: Tensor) -> list[int]:
    if product.out_shape is not None:
        return list(product.out_shape)
    sizes = _sizes(product, left, right)
    return [sizes[x] for x in product.out]


_GEMMS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten.baddbmm.default,
}


class _WithoutGemms(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """GEMMs return uninitialised memory of their result's shape: for a
    forward pass run only for its autograd graph, whose GEMM backward reads
    the operands, never the result."""

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if func in _GEMMS:
            a, b = args[-2], args[-1]
            return a.new_empty((*a.shape[:-1], b.shape[-1]))
        return func(*args, **(kwargs or {}))


def _plain(tensors: list[Any]) -> bool:
    return not torch.compiler.is_compiling() and all(
        type(t) is Tensor and t.device.type in ("cpu", "cuda")
        for t in tensors
        if isinstance(t, Tensor)
    )


def _vjp(product: _Product, operands: list[Any], index: int, grad: Tensor) -> Tensor:
    """The gradient of ``product.op(*operands)`` with respect to
    ``operands[index]`` (a tensor), for the incoming gradient ``grad``."""
    operands = list(operands)
    wrt = operands[index] = operands[index].detach().requires_grad_()
    mode = (
        _WithoutGemms()  # type: ignore[no-untyped-call]
        if _plain(operands)
        else contextlib.nullcontext()
    )
    with torch.enable_grad(), mode:
        out = product.op(*operands)
    found: Tensor = torch.autograd.grad(out, wrt, grad)[0]
    return found


def _sizes(product: _Product, left: Tensor, right: Tensor) -> dict[str, int]:
    """Each label's broadcast size."""
    sizes: dict[str, int] = {}
    for labels, shape in ((product.left, left.shape), (product.right, right.shape)):
        for label, size in zip(labels, shape, strict=True):
            sizes[label] = max(sizes.get(label, 1), size)
    return sizes


def _apply(product: _Product, left: Tensor, right: Tensor, *others: Any) -> Tensor:
    if not isinstance(product.recipe, Recipe):
        raise TypeError(f"recipe must be a Recipe, got {type(product.recipe).__name__}")
    out: Tensor = _QuantisedProductFn.apply(  # type: ignore[no-untyped-call]
        product, left, right, *others
    )
    return out


def quantised_linear(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    *,
    recipe: Recipe,
    linear: Callable[..., Tensor] = F.linear,
) -> Tensor:
    """:func:`torch.nn.functional.linear` with each GEMM's operands quantised
    along its contraction, as ``recipe`` says (see :class:`Recipe`).

    .. math::
        y = Q_1(x) Q_2(W)^T + b, \\quad \\partial x = Q_3(\\partial y) Q_4(W),
        \\quad \\partial W = Q_5(\\partial y)^T Q_6(x),
        \\quad \\partial b = \\textstyle\\sum \\partial y

    Args:
        input: ``(..., in_features)``; its leading axes are the tokens the
            weight-gradient GEMM contracts (flattened in order).
        weight: ``(out_features, in_features)``.
        bias: ``(out_features,)`` or ``None``; not quantised.
        recipe: the formats.
        linear: the function computing the product, ``linear(input, weight,
            bias)``: bilinear in ``input`` and ``weight`` (a scaled version such
            as :func:`unit_scaling.functional.linear` keeps its scales).

    Example::

        >>> from unit_scaling.formats import MXFP8_RECIPE
        >>> x, w = torch.randn(4, 64), torch.randn(8, 64)
        >>> y = quantised_linear(x, w, recipe=MXFP8_RECIPE)
        >>> exact = F.linear(x, w)
        >>> 0 < ((y - exact).norm() / exact.norm()).item() < 0.1
        True
    """
    tokens = tuple(f".{i}" for i in range(input.dim() - 1))
    product = _Product(
        lambda x, w, b: linear(x, w, b),
        (*tokens, "k"),
        ("n", "k"),
        (*tokens, "n"),
        recipe,
    )
    return _apply(product, input, weight, bias)


def _matmul_labels(left: int, right: int) -> tuple[Labels, Labels, Labels]:
    """Labels of ``torch.matmul``'s operands with ``left`` and ``right`` axes."""
    batch = max(left - 2, right - 2, 0)
    names = tuple(f".{i}" for i in range(batch))
    left_labels = ("k",) if left == 1 else (*names[batch - (left - 2) :], "m", "k")
    right_labels = ("k",) if right == 1 else (*names[batch - (right - 2) :], "k", "n")
    out = (*names, *(("m",) if left > 1 else ()), *(("n",) if right > 1 else ()))
    return left_labels, right_labels, out


def quantised_matmul(
    left: Tensor,
    right: Tensor,
    *others: Any,
    recipe: Recipe,
    matmul: Callable[..., Tensor] = torch.matmul,
) -> Tensor:
    """:func:`torch.matmul` with each GEMM's operands quantised along its
    contraction, as ``recipe`` says (``left`` in the role of the input ``x``,
    ``right`` in that of ``W^T``; see :class:`Recipe`).

    For ``(..., m, k) @ (..., k, n)`` the forward GEMM contracts ``k``, the one
    giving ``∂left`` contracts ``n``, the one giving ``∂right`` contracts ``m``
    and every batch axis along which ``right`` is broadcast (all of ``left``'s
    leading axes when ``right`` is a matrix).

    Args:
        left: at least 1-D.
        right: at least 1-D.
        others: further arguments of ``matmul`` (a bias); not quantised.
        recipe: the formats.
        matmul: the function computing the product, ``matmul(left, right,
            *others)``, bilinear in ``left`` and ``right``: ``torch.bmm``, a
            unit-scaled one, or ``addmm`` with its bias among ``others``.

    Example::

        >>> from unit_scaling.formats import MXFP4_RECIPE
        >>> a, b = torch.randn(2, 4, 64), torch.randn(64, 8)
        >>> quantised_matmul(a, b, recipe=MXFP4_RECIPE).shape
        torch.Size([2, 4, 8])
    """
    labels = _matmul_labels(left.dim(), right.dim())
    return _apply(_Product(matmul, *labels, recipe), left, right, *others)


def _einsum_labels(
    equation: str, left: int, right: int
) -> tuple[Labels, Labels, Labels]:
    """Labels of a two-operand einsum, ``...`` as ``.0``, ``.1``, ... aligned
    from the right as broadcasting aligns them."""
    lhs, arrow, rhs = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    if len(terms) != 2:
        raise ValueError(
            f"quantised_einsum takes two operands, got equation {equation!r}"
        )
    dims = (left, right)
    ellipsis = max(
        (d - len(t.replace("...", "")) for t, d in zip(terms, dims, strict=True)),
        default=0,
    )

    def expand(term: str, rank: int) -> Labels:
        before, dots, after = term.partition("...")
        filled = [f".{i}" for i in range(ellipsis - rank, ellipsis)] if dots else []
        labels = (*before, *filled, *after)
        if len(set(labels)) != len(labels):
            raise ValueError(
                f"quantised_einsum: term {term!r} of {equation!r} repeats a "
                "label (a diagonal is not a GEMM); use torch.einsum"
            )
        return labels

    operands = tuple(
        expand(t, d - len(t.replace("...", "")))
        for t, d in zip(terms, dims, strict=True)
    )
    every = [*operands[0], *operands[1]]
    if arrow:
        out = expand(rhs, ellipsis)
    else:
        out = (
            *[f".{i}" for i in range(ellipsis)],
            *sorted(
                x for x in set(every) if not x.startswith(".") and every.count(x) == 1
            ),
        )
    return operands[0], operands[1], out


def quantised_einsum(
    equation: str,
    left: Tensor,
    right: Tensor,
    *,
    recipe: Recipe,
    einsum: Callable[..., Tensor] = torch.einsum,
) -> Tensor:
    """A two-operand :func:`torch.einsum` with each GEMM's operands quantised
    along its contraction, as ``recipe`` says (``left`` in the role of the
    input, ``right`` of the weight). Several contracted labels are flattened
    into one axis, in the order they are first written in ``equation``.

    Args:
        equation: subscripts such as ``"bij,jk->bik"`` (letters and ``...``;
            no label twice in one operand).
        left: the first operand.
        right: the second.
        recipe: the formats.
        einsum: the function computing it, ``einsum(equation, left, right)``.

    Example::

        >>> from unit_scaling.formats import MXFP8_RECIPE
        >>> a, b = torch.randn(4, 2, 32), torch.randn(32, 2, 8)
        >>> quantised_einsum("mhk,khn->mn", a, b, recipe=MXFP8_RECIPE).shape
        torch.Size([4, 8])
    """
    labels = _einsum_labels(equation, left.dim(), right.dim())
    product = _Product(lambda a, b: einsum(equation, a, b), *labels, recipe)
    return _apply(product, left, right)


def _grouped(
    dim: int, groups: int, fmt: BlockFormat | None, recipe: Recipe
) -> Quantiser:
    """Quantise along axis ``dim``, split into ``groups`` equal parts that
    block separately (a grouped convolution's channels)."""
    if groups == 1:
        return _quantiser([dim], fmt, recipe)

    def run(x: Tensor) -> Tensor:
        split = x.reshape(*x.shape[:dim], groups, -1, *x.shape[dim + 1 :])
        return _prepare(split, [dim + 1], fmt, recipe).reshape(x.shape)

    return run


def _conv_planner(transposed: bool, groups: int) -> Callable[..., _Plan]:
    """The plan of a convolution (``transposed``: its transpose).

    The forward GEMM of output position ``p`` sums input channels times
    kernel offsets; its contraction runs kernel offset by kernel offset, each
    offset's channels a whole number of blocks (padded), so the input's
    blocks run along its channels at each position, the weight's along its
    input channels at each offset, the same for every output position. The
    input-gradient GEMM contracts output channels alike. The weight-gradient
    GEMM contracts the batch and positions: ``∂y`` and the input are each
    blocked along them in their own layout (for a kernel wider than one
    position, the input's blocks then do not follow each offset's shifted
    window; no Hadamard transform, which would not cancel across the shift).
    """

    def plan(
        product: _Product, left: Tensor, right: Tensor, out_shape: Sequence[int]
    ) -> _Plan:
        recipe = product.recipe
        channel = 1 if left.dim() == right.dim() else 0  # batched or not
        tokens_in = [d for d in range(left.dim()) if d != channel]
        tokens_out = [d for d in range(len(out_shape)) if d != channel]
        # Weight: (C_out, C_in / G, k...); transposed: (C_in, C_out / G, k...).
        w_in, w_out = (0, 1) if transposed else (1, 0)
        return _Plan(
            (
                _grouped(channel, groups, recipe.forward[0], recipe),
                _grouped(
                    w_in, 1 if not transposed else groups, recipe.forward[1], recipe
                ),
            ),
            (
                _grouped(channel, groups, recipe.grad_input[0], recipe),
                _grouped(
                    w_out, groups if not transposed else 1, recipe.grad_input[1], recipe
                ),
            ),
            (
                _quantiser(tokens_out, recipe.grad_weight[0], recipe),
                _quantiser(tokens_in, recipe.grad_weight[1], recipe),
            ),
        )

    return plan


def quantised_conv(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    *args: Any,
    recipe: Recipe,
    conv: Callable[..., Tensor] = F.conv2d,
    transposed: bool = False,
    groups: int = 1,
) -> Tensor:
    """A convolution with each GEMM's operands quantised along its
    contraction, as ``recipe`` says (``input`` in the role of ``x``, ``weight``
    of ``W``).

    The contraction of a convolution's forward GEMM runs over kernel offsets
    and, within each, input channels, each offset's channels padded to whole
    blocks: the input is blocked along its channels at each position and the
    weight along its input channels at each offset (in groups, for
    ``groups > 1``); so is the input gradient's GEMM along output channels.
    The weight gradient's GEMM contracts the batch and positions, and its two
    operands are blocked along them in their own layouts, which for a kernel
    wider than one position approximates a GEMM over each offset's shifted
    window (see ``docs/limitations.md``); the recipe's Hadamard transform is
    not applied to convolutions.

    Args:
        input: ``(N, C_in, ...)`` or unbatched ``(C_in, ...)``.
        weight: ``(C_out, C_in / groups, k...)`` (transposed: ``(C_in,
            C_out / groups, k...)``).
        bias: not quantised.
        args: ``conv``'s further positional arguments (stride, padding, ...).
        recipe: the formats.
        conv: the convolution, ``conv(input, weight, bias, *args)``, e.g.
            :func:`torch.nn.functional.conv2d` or a unit-scaled one.
        transposed: whether ``conv`` is a transposed convolution.
        groups: ``conv``'s ``groups`` (also passed in ``args`` if it is one of
            them).

    Example::

        >>> from unit_scaling.formats import MXFP8_RECIPE
        >>> x, w = torch.randn(2, 64, 8, 8), torch.randn(32, 64, 3, 3)
        >>> y = quantised_conv(x, w, None, 1, 1, recipe=MXFP8_RECIPE)
        >>> exact = F.conv2d(x, w, None, 1, 1)
        >>> 0 < ((y - exact).norm() / exact.norm()).item() < 0.1
        True
    """
    if not isinstance(groups, int) or groups < 1:
        raise ValueError(f"groups must be a positive int, got {groups!r}")
    product = _Product(
        lambda x, w, b: conv(x, w, b, *args),
        (),
        (),
        (),
        recipe,
        planner=_conv_planner(transposed, groups),
        out_shape=(0,) * input.dim(),  # (the planner reads only its rank)
    )
    return _apply(product, input, weight, bias)


def quantised_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    recipe: Recipe,
) -> Tensor:
    """:func:`torch.nn.functional.scaled_dot_product_attention` as explicit
    products, each quantised by :func:`quantised_matmul`.

    .. math::
        y = \\mathrm{dropout}_p\\big(\\mathrm{softmax}(s\\, Q K^T + M)\\big) V

    ``Q K^T`` contracts the head dimension (and its backward GEMMs the keys and
    the queries), the product with ``V`` contracts the keys. The temperature
    ``s`` multiplies the GEMM's result, the mask ``M`` (boolean: ``True``
    attends; or float, added) stays in high precision, as do the softmax and
    dropout.

    Arguments as :func:`torch.nn.functional.scaled_dot_product_attention`, and
    ``recipe``, the formats (``query`` and the attention weights in the role of
    the input, ``key`` and ``value`` in that of the weight).

    Example::

        >>> from unit_scaling.formats import MXFP8_RECIPE
        >>> q, k, v = torch.randn(3, 2, 4, 32, 16).unbind(0)
        >>> y = quantised_attention(q, k, v, is_causal=True, recipe=MXFP8_RECIPE)
        >>> exact = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        >>> 0 < ((y - exact).norm() / exact.norm()).item() < 0.1
        True
    """
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        repeats = query.shape[-3] // key.shape[-3]
        key = key.repeat_interleave(repeats, -3)
        value = value.repeat_interleave(repeats, -3)
    temperature = query.shape[-1] ** -0.5 if scale is None else scale
    scores = quantised_matmul(query, key.transpose(-2, -1), recipe=recipe)
    scores = scores * temperature
    if is_causal:
        rows, columns = scores.shape[-2:]
        causal = torch.ones(rows, columns, dtype=torch.bool, device=scores.device)
        scores = scores.masked_fill(~causal.tril(), -math.inf)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, -math.inf)
        else:
            scores = scores + attn_mask
    weights = scores.softmax(-1)
    if dropout_p > 0:
        weights = F.dropout(weights, dropout_p)
    return quantised_matmul(weights, value, recipe=recipe)
