"""Rewrite in-place ops of a captured graph into out-of-place ones.

Models write residuals as ``h += self.mlp(x)``, activations as
``nn.ReLU(inplace=True)`` and scalings as ``x.mul_(c)``. Unit scaling replaces
such ops with out-of-place unit-scaled functions, and the unit-scaled functions'
outputs come from custom autograd functions, so the graph must stop relying on
mutation before it is rewritten. TorchDynamo records an in-place op as a node
whose first argument is the mutated tensor; later reads of the variable refer to
either that argument or the op's result. This pass turns each in-place op into its
out-of-place form and points every later read of the mutated tensor at the
result, which is exactly torch's semantics when nothing else aliases the tensor.
Where something may alias it (a graph input the caller still holds, a view, or a
tensor with views read later) the result is also written back with ``copy_``, so
the aliases see the new value as they would in eager PyTorch.
"""

from __future__ import annotations

import inspect
import logging
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx import Graph, Node

from .._capture.graph import is_view_node

__all__ = ["functionalize_inplace"]

logger = logging.getLogger("unit_scaling.transforms.unit_scale")

_INPLACE_OPERATORS: dict[Callable[..., Any], Callable[..., Any]] = {
    operator.iadd: operator.add,
    operator.isub: operator.sub,
    operator.imul: operator.mul,
    operator.itruediv: operator.truediv,
    operator.ifloordiv: operator.floordiv,
    operator.imod: operator.mod,
    operator.ipow: operator.pow,
    operator.imatmul: operator.matmul,
    operator.iand: operator.and_,
    operator.ior: operator.or_,
    operator.ixor: operator.xor,
}

# Tensor methods ``name_`` whose out-of-place form is the method ``name``: values
# only (no random fills, no storage or autograd bookkeeping such as
# ``requires_grad_``, ``resize_`` or ``set_``).
_INPLACE_METHODS = frozenset(
    {
        f"{name}_"
        for name in [
            "abs",
            "add",
            "addcdiv",
            "addcmul",
            "clamp",
            "clamp_max",
            "clamp_min",
            "clip",
            "cos",
            "cosh",
            "div",
            "erf",
            "exp",
            "expm1",
            "floor_divide",
            "fmod",
            "index_add",
            "index_copy",
            "index_fill",
            "lerp",
            "log",
            "log1p",
            "masked_fill",
            "masked_scatter",
            "mul",
            "nan_to_num",
            "neg",
            "pow",
            "reciprocal",
            "relu",
            "remainder",
            "round",
            "rsqrt",
            "scatter",
            "scatter_add",
            "scatter_reduce",
            "sigmoid",
            "sign",
            "sin",
            "sinh",
            "sqrt",
            "square",
            "squeeze",
            "sub",
            "t",
            "tanh",
            "transpose",
            "true_divide",
            "trunc",
            "unsqueeze",
        ]
    }
)

# Functions named ``f_`` that are ``f(..., inplace=True)`` or the in-place ``f``.
_INPLACE_FUNCTIONS: dict[Callable[..., Any], Callable[..., Any]] = {
    torch.relu_: torch.relu,
    torch.sigmoid_: torch.sigmoid,
    torch.tanh_: torch.tanh,
    torch.exp_: torch.exp,
    F.relu_: F.relu,
    F.elu_: F.elu,
    F.leaky_relu_: F.leaky_relu,
    F.hardtanh_: F.hardtanh,
    F.rrelu_: F.rrelu,
    F.celu_: F.celu,
    F.selu_: F.selu,
}


def _inplace_keyword(node: Node) -> bool:
    """Whether ``node`` calls a function with ``inplace=True``.

    Every torch function with an ``inplace`` parameter takes it by keyword or as
    its last positional argument, which Dynamo passes through unchanged.
    """
    if node.kwargs.get("inplace") is True:
        return True
    return _inplace_position(node) is not None


def _inplace_position(node: Node) -> int | None:
    if node.op != "call_function" or not callable(node.target):
        return None
    try:
        names = list(inspect.signature(node.target).parameters)
    except (TypeError, ValueError):
        return None
    if "inplace" not in names:
        return None
    position = names.index("inplace")
    if position < len(node.args) and node.args[position] is True:
        return position
    return None


def _make_out_of_place(node: Node) -> bool:
    """Retarget ``node`` to its out-of-place form; False if it is not in place."""
    if node.op == "call_function" and node.target in _INPLACE_OPERATORS:
        node.target = _INPLACE_OPERATORS[node.target]
    elif node.op == "call_function" and node.target in _INPLACE_FUNCTIONS:
        node.target = _INPLACE_FUNCTIONS[node.target]
    elif node.op == "call_method" and node.target in _INPLACE_METHODS:
        node.target = str(node.target)[:-1]
    elif node.op == "call_function" and _inplace_keyword(node):
        position = _inplace_position(node)
        if position is not None:
            node.args = (*node.args[:position], False, *node.args[position + 1 :])
        else:
            node.kwargs = {**node.kwargs, "inplace": False}
    else:
        return False
    return True


def _may_be_aliased(mutated: Node, op: Node, order: dict[Node, int]) -> bool:
    """Whether another tensor may share ``mutated``'s memory and be read after
    ``op``: a graph input (the caller holds it), a view of something, or a
    tensor whose views are read after ``op``."""
    if mutated.op in ("placeholder", "get_attr") or is_view_node(mutated):
        return True
    return any(
        user is not op
        and is_view_node(user)
        and order[user] < order[op]
        and any(order[reader] > order[op] for reader in user.users)
        for user in mutated.users
    )


def functionalize_inplace(graph: Graph) -> int:
    """Make every recognised in-place op of ``graph`` out of place (see the
    module docstring); returns how many were rewritten."""
    order = {node: i for i, node in enumerate(graph.nodes)}
    rewritten = 0
    for node in list(graph.nodes):
        if not node.args or not isinstance(node.args[0], Node):
            continue
        mutated = node.args[0]
        if not _make_out_of_place(node):
            continue
        rewritten += 1
        logger.info("making in-place op out of place: %s", node)
        aliased = _may_be_aliased(mutated, node, order)
        for user in list(mutated.users):
            if user is not node and order.get(user, -1) > order[node]:
                user.replace_input_with(mutated, node)
        if aliased:
            with graph.inserting_after(node):
                write_back = graph.call_method("copy_", (mutated, node))
            order[write_back] = order[node]
            logger.info("writing the result back to aliased tensor: %s", mutated)
    return rewritten
