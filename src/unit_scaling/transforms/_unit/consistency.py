"""Independent gradient scales, kept consistent along every path.

A unit-scaled op scales its output by ``alpha`` and each input's gradient by
``beta``. With ``beta = alpha`` (a constraint) the backward pass is the true
gradient of the forward, but a projection that widens or narrows the stream gets
a gradient ``sqrt(fan_out / fan_in)`` away from unit scale: in an MLP with
expansion 4 the hidden gradients sit at 1/2. With ``beta`` at its natural value
each op's gradient is unit-scaled, and the backward pass is the true gradient
times a factor ``K`` per node: the product, along the path from the output, of
each op's ``rho = beta / alpha``.

That is still a correct gradient wherever ``K`` is the same on every path that
meets at a node, because a common factor only rescales what lies upstream. Paths
through chains of projections that return to their width (``d -> 4d -> d``, an
MLP; ``q, k, v, o``, attention) telescope to the same ``K``, and residual
connections are consistent by construction. So ``unit_scale`` gives every
projection its natural gradient scale, propagates ``K`` from the outputs, and
where paths meet at a node it equalises their factors with a gradient scale on
each path's edge into the node (see :func:`_main_path` for the factor kept),
which also keeps the sum of several unit-scaled contributions at unit scale.
"""

from __future__ import annotations

import inspect
import logging
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.fx import Graph, Node

from ... import functional as U
from ...scale import scale_bwd
from .._capture.graph import OpSet
from .._capture.targets import broadcast_gradient, repeated_gradient
from .gradients import toward_loss
from .rules import get_argument, set_argument
from .values import GraphValues, Kind

__all__ = ["scale_broadcast_gradients", "unconstrain_consistently"]

logger = logging.getLogger("unit_scaling.transforms.unit_scale")

# Relative difference below which two paths' factors count as equal.
_TOLERANCE = 1e-3

Ratios = Callable[[Node, GraphValues], dict[Node, float] | None]


def _shape(values: GraphValues, node: Any) -> tuple[int, ...] | None:
    info = values.tensor(node)
    return None if info is None else info.shape


def _linear(node: Node, values: GraphValues) -> dict[Node, float] | None:
    """``alpha = fan_in^-1/2``, ``beta_x = fan_out^-1/2``."""
    weight = _shape(values, get_argument(node, "weight"))
    source = get_argument(node, "input")
    if weight is None or len(weight) != 2 or not isinstance(source, Node):
        return None
    fan_out, fan_in = weight
    return {source: math.sqrt(fan_in / max(fan_out, 1))}


def _matmul(left_name: str, right_name: str) -> Ratios:
    """``alpha = k^-1/2``, ``beta_left = (n B / B_left)^-1/2``,
    ``beta_right = (m B / B_right)^-1/2`` for ``[.., m, k] @ [.., k, n]``."""

    def ratios(node: Node, values: GraphValues) -> dict[Node, float] | None:
        left, right = get_argument(node, left_name), get_argument(node, right_name)
        a, b = _shape(values, left), _shape(values, right)
        if a is None or b is None or len(a) < 2 or len(b) < 2:
            return None
        assert isinstance(left, Node) and isinstance(right, Node)
        m, k, n = a[-2], a[-1], b[-1]
        batch_left, batch_right = math.prod(a[:-2]), math.prod(b[:-2])
        batch = max(batch_left, batch_right)
        result = {
            left: math.sqrt(k / max(n * batch // max(batch_left, 1), 1)),
            right: math.sqrt(k / max(m * batch // max(batch_right, 1), 1)),
        }
        return None if left is right else result

    return ratios


def _conv_operands(
    node: Node, values: GraphValues
) -> tuple[Node, Sequence[int], int, int] | None:
    """A convolution's input, weight shape, groups and product of strides."""
    weight = _shape(values, get_argument(node, "weight"))
    source = get_argument(node, "input")
    groups = get_argument(node, "groups") or 1
    stride = get_argument(node, "stride") or 1
    if weight is None or not isinstance(source, Node) or not isinstance(groups, int):
        return None
    dims = len(weight) - 2
    strides = (stride,) * dims if isinstance(stride, int) else tuple(stride)
    return source, weight, groups, math.prod(strides)


def _conv(node: Node, values: GraphValues) -> dict[Node, float] | None:
    """``alpha = (C_in/G K)^-1/2``, ``beta_x = (S G / (C_out K))^1/2``."""
    operands = _conv_operands(node, values)
    if operands is None:
        return None
    source, weight, groups, stride = operands
    fan_out, fan_in = weight[0], weight[1]
    return {source: math.sqrt(fan_in * stride * groups / max(fan_out, 1))}


def _conv_transpose(node: Node, values: GraphValues) -> dict[Node, float] | None:
    """``alpha = (C_in/G K / S)^-1/2``, ``beta_x = (C_out/G K)^-1/2``."""
    operands = _conv_operands(node, values)
    if operands is None:
        return None
    source, weight, groups, stride = operands
    fan_in, fan_out = weight[0] // groups, weight[1]
    return {source: math.sqrt(fan_in / max(fan_out * stride, 1))}


def _ratio_rules() -> dict[Callable[..., Any], Ratios]:
    rules: dict[Callable[..., Any], Ratios] = {
        U.linear: _linear,
        U.matmul: _matmul("left", "right"),
        U.bmm: _matmul("input", "mat2"),
    }
    for name in ("conv1d", "conv2d", "conv3d"):
        if hasattr(U, name):
            rules[getattr(U, name)] = _conv
    for name in ("conv_transpose1d", "conv_transpose2d", "conv_transpose3d"):
        if hasattr(U, name):
            rules[getattr(U, name)] = _conv_transpose
    return rules


def _probe_grad(
    node: Node,
    shape: tuple[int, ...],
    args: list[Any],
    kwargs: dict[str, Any],
    constraint: str | None,
) -> Tensor:
    # (a probe of the op's scale rule, not of the model's values: on the CPU)
    x = torch.linspace(-2, 2, math.prod(shape), dtype=torch.float64, device="cpu")
    x = x.reshape(shape)
    x.requires_grad_()
    assert callable(node.target)
    out = node.target(x, *args[1:], **{**kwargs, "constraint": constraint})
    (grad,) = torch.autograd.grad(out.sum(), x)
    return grad


def _probe_ratio(
    node: Node, values: GraphValues, source_name: str = "input"
) -> dict[Node, float] | None:
    """``beta / alpha`` of an elementwise unit-scaled op, read off the op
    itself: its input gradient unconstrained over its input gradient under its
    default constraint, on a small probe (the ratio is the same everywhere)."""
    source = get_argument(node, source_name)
    info = values.tensor(source)
    if not isinstance(source, Node) or info is None or not callable(node.target):
        return None
    kwargs = {k: v for k, v in node.kwargs.items() if k != "constraint"}
    args = list(node.args)
    shape: tuple[int, ...] = (8,)
    if node.target is U.softmax:  # its scales depend on the size of its dim
        dim = get_argument(node, "dim")
        if not isinstance(dim, int):
            return None
        shape = (2, info.shape[dim])
        args = [None, -1, *args[2:]] if len(args) > 1 else [None]
        kwargs.pop("dim", None)
        if len(args) == 1:
            kwargs["dim"] = -1
    grads = []
    with torch.enable_grad():
        grads = [
            _probe_grad(node, shape, args, kwargs, c) for c in (None, "to_output_scale")
        ]
    ratio = grads[0] / grads[1]
    finite = ratio[torch.isfinite(ratio)]
    if finite.numel() == 0:
        return None
    return {source: float(finite.median())}


_RATIOS = _ratio_rules()
for _fn in (U.gelu, U.silu, U.relu, U.tanh, U.sigmoid, U.softmax):
    _RATIOS[_fn] = _probe_ratio


def _constraint(node: Node) -> str | None:
    """The constraint a call node passes, or its function's default."""
    parameter = inspect.signature(node.target).parameters["constraint"]  # type: ignore[arg-type]
    position = list(inspect.signature(node.target).parameters).index("constraint")  # type: ignore[arg-type]
    if position < len(node.args):
        return node.args[position]  # type: ignore[return-value]
    value = node.kwargs.get("constraint", parameter.default)
    return value  # type: ignore[no-any-return]


def unconstrain_consistently(graph: Graph, values: GraphValues) -> int:
    """Give every projection (linear, convolution, matmul) its natural gradient
    scale and equalise the factors where paths meet (see the module docstring).
    Returns how many path factors had to be equalised."""
    rho: dict[tuple[Node, Node], float] = {}
    for node in graph.nodes:
        rule = _RATIOS.get(node.target) if node.op == "call_function" else None
        if rule is None or _constraint(node) is None:
            continue
        ratios = rule(node, values)
        if ratios is None:
            continue
        logger.info("unconstraining node: %s", node)
        set_argument(node, "constraint", None)
        for source, ratio in ratios.items():
            rho[(node, source)] = ratio
    factor: dict[Node, float] = {}
    equalised = 0
    live = toward_loss(graph, values)
    for node in reversed(list(graph.nodes)):
        if values.kind(node) is not Kind.DATA:
            continue
        paths = _path_factors(node, factor, rho)
        if not paths:
            continue
        # A tensor the model also returns (an encoder's last hidden state, a
        # key/value cache) follows its paths toward the loss: a loss rarely
        # uses such extra outputs, and their edges are equalised like any other.
        internal = {u: v for u, v in paths.items() if u in live}
        chosen = _main_path(internal or paths)
        factor[node] = chosen
        for user, value in paths.items():
            if abs(value / chosen - 1) > _TOLERANCE:
                if values.tensor(node) is not None:
                    _equalise(graph, node, user, chosen / value)
                else:  # a tuple: rescale what the user takes out of it instead
                    _equalise_output(graph, user, chosen / value)
                equalised += 1
    return equalised


# Elementwise ops whose gradient for a broadcast operand is a plain sum over the
# elements it was broadcast to.
_BROADCASTING = frozenset(
    {operator.mul, operator.add, operator.sub, torch.mul, torch.add, torch.sub}
    | {U.add, "mul", "add", "sub"}
)
# ``where(condition, a, b)``: each value is broadcast against the other and the
# condition (a relative position bias put into a padding mask, say).
_SELECTING = OpSet(frozenset({torch.where}), frozenset({"where"}))
# Ops that repeat each element of their input, as broadcasting does implicitly.
_REPEATING = OpSet(
    frozenset({torch.broadcast_to, torch.tile, torch.repeat_interleave}),
    frozenset(
        {"expand", "expand_as", "broadcast_to", "repeat", "tile", "repeat_interleave"}
    ),
)


def scale_broadcast_gradients(graph: Graph, values: GraphValues) -> None:
    """Give the operand of a product, sum or ``where`` that is broadcast over
    ``N`` times as many elements the gradient scale ``N^-1/2``: its gradient sums
    ``N`` terms, so it is ``sqrt(N)`` off unit scale, and by as much more as the
    shapes grow. That is a conditioning signal applied to the stream: a DiT's
    adaLN shift, scale and gate broadcast over tokens, a U-Net's timestep
    embedding added to every pixel.

    Not an operand computed from the other one (``x * rsqrt(mean(x**2))``, whose
    terms are not independent), nor a per-row scalar broadcast over the last
    dimension only (a norm's statistics, mixture-of-experts routing weights):
    its gradient is a dot product over features that the rules already scale,
    and rescaling it would pull down the gradient of the input the row shares
    with the other operand. The factor enters the path factors ``K`` like any
    ``beta / alpha``. Applied before regions are calibrated, so that a region
    holding such an op measures its gradients with the scale in place.

    The same holds where a tensor that no example owns is repeated explicitly
    (see :func:`_scale_repeats`). Every factor is read from each call's shapes:
    ``N`` counts the batch wherever the operand is shared by the examples, and
    a factor baked at the captured batch would be wrong for every other."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    found: list[tuple[Node, Node, list[Node], float]] = []
    for node in graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        out = values.tensor(node)
        if out is None or not values.is_data(node):
            continue
        for operand, others in _broadcast_operands(node, values):
            info = values.tensor(operand)
            if info is None or not info.numel or out.numel % info.numel:
                continue
            count = out.numel // info.numel
            dims = _broadcast_dims(info.shape, out.shape)
            if count == 1 or dims == {len(out.shape) - 1}:
                continue
            if not any(_depends_on(operand, other, order) for other in others):
                found.append((node, operand, others, count**-0.5))
    for node, operand, others, factor in found:
        with graph.inserting_before(node):
            # (the factor is read from the shapes of each call: the batch of a
            # dynamic-shape graph changes)
            sizes = [graph.call_method("size", (other,)) for other in others]
            scaled = graph.call_function(broadcast_gradient, (operand, *sizes))
        for size in sizes:
            values.kinds[size] = Kind.CONST
        scaled.meta["capture_factor"] = factor
        node.replace_input_with(operand, scaled)
        values.record_like(scaled, operand)
        logger.info(
            "scaling a broadcast gradient: %s -> %s (gradient x%.4g here)",
            node,
            operand,
            factor,
        )
    _scale_repeats(graph, values)


def _broadcast_operands(
    node: Node, values: GraphValues
) -> list[tuple[Node, list[Node]]]:
    """Each operand of an elementwise op that may be broadcast, with the
    tensors it is broadcast against."""
    args = node.args
    if node.target in _BROADCASTING and len(args) == 2:
        a, b = args
        if values.is_data(a) and values.is_data(b):
            assert isinstance(a, Node) and isinstance(b, Node)
            return [(a, [b]), (b, [a])]
        return []
    if node in _SELECTING and len(args) == 3:
        # torch.where(condition, a, b) or a.where(condition, b)
        condition, a, b = args if node.op == "call_function" else (args[1], *args[::2])
        tensors = [x for x in (condition, a, b) if isinstance(x, Node)]
        tensors = [x for x in tensors if values.tensor(x) is not None]
        return [
            (x, [t for t in tensors if t is not x])
            for x in (a, b)
            if isinstance(x, Node) and values.is_data(x)
        ]
    return []


def _scale_repeats(graph: Graph, values: GraphValues) -> None:
    """Scale the gradient of a tensor that an op repeats (``expand``,
    ``repeat``; a lookup ``table[indices]``) by ``repeats^-1/2``, read from each
    call's shapes (:func:`repeated_gradient`), wherever the repeats may count
    the examples of the batch. That is a parameter, or what is computed from
    parameters alone, whatever it is repeated over (a class token expanded to
    every example, a position table read at every example's positions); and an
    activation repeated along the leading (batch) dimension (DeBERTa's
    relative-position projections, one copy per example). An activation
    repeated along other dimensions (grouped-query attention's keys, one per
    query head) keeps its calibrated scales: its repeats do not depend on the
    batch."""
    for node in list(graph.nodes):
        if node.op not in ("call_function", "call_method") or not node.args:
            continue
        source = node.args[0]
        info, out = values.tensor(source), values.tensor(node)
        if info is None or out is None or not info.is_float or info.numel == 0:
            continue
        assert isinstance(source, Node)
        kind = values.kind(source)
        if node in _REPEATING:
            shared = kind is Kind.PARAM or (
                kind is Kind.DATA and _repeats_leading(info.shape, out.shape)
            )
        else:
            shared = kind is Kind.PARAM and _is_lookup(node, values)
        if not shared or (node in _REPEATING and out.numel == info.numel):
            continue
        with graph.inserting_before(node):
            size = graph.call_method("size", (source,))
        with graph.inserting_after(node):
            scaled = graph.call_function(repeated_gradient, (node, size))
        values.kinds[size] = Kind.CONST
        values.record_like(scaled, node)
        scaled.meta["capture_factor"] = (info.numel / out.numel) ** 0.5
        for user in list(node.users):
            if user is not scaled:
                user.replace_input_with(node, scaled)
        logger.info(
            "scaling a repeated gradient: %s (gradient x%.4g here)",
            node,
            scaled.meta["capture_factor"],
        )


def _repeats_leading(shape: tuple[int, ...], out: tuple[int, ...]) -> bool:
    """Whether a tensor of ``shape`` repeated into ``out`` is repeated along the
    leading dimension."""
    if len(shape) > len(out) or not out:
        return False
    padded = (1,) * (len(out) - len(shape)) + tuple(shape)
    return out[0] > padded[0]


def _is_lookup(node: Node, values: GraphValues) -> bool:
    """``x[indices]`` with integer tensor indices: a gather, which may read each
    element of ``x`` many times (an embedding written as indexing)."""
    if node.target is not operator.getitem or len(node.args) != 2:
        return False
    index = node.args[1]
    parts = index if isinstance(index, (tuple, list)) else (index,)
    return any(
        (info := values.tensor(part)) is not None
        and not info.is_float
        and info.dtype != torch.bool
        for part in parts
    )


def _broadcast_dims(shape: tuple[int, ...], out: tuple[int, ...]) -> set[int]:
    """The dimensions of ``out`` over which a tensor of ``shape`` is broadcast."""
    padded = (1,) * (len(out) - len(shape)) + tuple(shape)
    return {i for i, (s, o) in enumerate(zip(padded, out, strict=True)) if s < o}


def _depends_on(node: Node, ancestor: Node, order: dict[Node, int]) -> bool:
    """Whether ``ancestor`` is ``node`` or one of its ancestors."""
    stop = order[ancestor]
    seen: set[Node] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        if current is ancestor:
            return True
        if current in seen or order.get(current, -1) < stop:
            continue
        seen.add(current)
        stack.extend(current.all_input_nodes)
    return False


def _path_factors(
    node: Node, factor: dict[Node, float], rho: dict[tuple[Node, Node], float]
) -> dict[Node, float]:
    """The factor ``K`` each user's path brings to ``node``'s gradient."""
    paths: dict[Node, float] = {}
    for user in node.users:
        if user.op == "output":
            paths[user] = 1.0
        elif user in factor:
            paths[user] = factor[user] * _ratio(user, node, rho)
    return paths


def _ratio(user: Node, node: Node, rho: dict[tuple[Node, Node], float]) -> float:
    """``beta / alpha`` of ``user`` for its input ``node``."""
    if "capture_factor" in user.meta:  # a factor read from each call's shapes
        return float(user.meta["capture_factor"])  # (as it was at the capture)
    if user.target is scale_bwd:  # a calibrated gradient scale
        factor = user.args[1]
        assert isinstance(factor, (int, float))
        return float(factor)
    if user.target is U.residual_add:
        # The backward skips the forward weights (residual_split applies them).
        residual, skip, tau = user.args[:3]
        assert isinstance(tau, (int, float))
        b = 1 / math.sqrt(1 + tau * tau)
        return (
            1 / (tau * b)
            if node is residual and tau
            else 1 / b
            if node is skip
            else 1.0
        )
    if (
        user.target is operator.getitem
        and node.target is U.residual_split
        and len(user.args) > 1
    ):
        tau = node.args[1]
        assert isinstance(tau, (int, float))
        b = 1 / math.sqrt(1 + tau * tau)
        return tau * b if user.args[1] == 0 else b
    return rho.get((user, node), 1.0)


# Users that read a piece of a tensor rather than all of it.
_PIECES = frozenset(
    {
        operator.getitem,
        torch.split,
        torch.chunk,
        torch.unbind,
        torch.narrow,
        torch.select,
        "split",
        "chunk",
        "unbind",
        "narrow",
        "select",
        "__getitem__",
    }
)


def _main_path(paths: dict[Node, float]) -> float:
    """The factor a node's gradient keeps.

    Where a residual split reads the node, the residual stream's. Otherwise
    ``(sum_i K_i^-2)^-1/2`` over the users that read the whole tensor (the
    users that read pieces of it, such as the q, k, v chunks of a fused
    projection, count once, at their most common factor): each path's
    contribution is equalised to it, so that ``k`` independent unit-scaled
    contributions (a norm's output read by the query, key and value projections,
    an encoder's output read by every decoder layer) sum to a unit-scaled
    gradient rather than ``sqrt(k)``, while every tensor along those paths keeps
    its unit-scaled gradient.
    """
    for user, value in paths.items():
        if user.target is U.residual_split:
            return value
    pieces = [v for u, v in paths.items() if u.target in _PIECES]
    wholes = [v for u, v in paths.items() if u.target not in _PIECES]
    if pieces:
        counts: dict[float, int] = {}
        for value in pieces:
            key = float(f"{value:.6g}")
            counts[key] = counts.get(key, 0) + 1
        wholes.append(max(counts, key=lambda v: (counts[v], -abs(math.log(v)))))
    return float(sum(value**-2 for value in wholes) ** -0.5)


def _equalise_output(graph: Graph, node: Node, ratio: float) -> None:
    """Scale the gradient arriving at ``node`` from all its users by ``ratio``."""
    with graph.inserting_after(node):
        scaled = graph.call_function(scale_bwd, (node, ratio))
    for user in list(node.users):
        if user is not scaled:
            user.replace_input_with(node, scaled)
    logger.info("keeping gradients consistent: %s (gradient x%.4g)", node, ratio)


def _equalise(graph: Graph, node: Node, user: Node, ratio: float) -> None:
    """Scale the gradient flowing from ``user`` into ``node`` by ``ratio``."""
    with graph.inserting_before(user):
        scaled = graph.call_function(scale_bwd, (node, ratio))
    user.replace_input_with(node, scaled)
    logger.info(
        "keeping gradients consistent: %s -> %s (gradient x%.4g)", user, node, ratio
    )
