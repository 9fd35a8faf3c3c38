"""The analytic rules of ``unit_scale``: which traced op becomes which unit-scaled
function, and how the graph passes read and set call arguments."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch.fx import Node

from ... import functional as U
from ..._torch_internals import OpOverload, OpOverloadPacket
from .._capture.opaque import UNIT_SCALED_FUNCTIONS

__all__ = [
    "ATTENTION_PRODUCTS",
    "CONSTRAINED",
    "ELEMENTWISE",
    "WEIGHTED",
    "get_argument",
    "rule_for",
    "set_argument",
]


# Tensor methods with a unit-scaled equivalent taking the tensor first.
_METHOD_RULES: dict[str, Callable[..., Any]] = {
    "softmax": U.softmax,
    "matmul": U.matmul,
    "__matmul__": U.matmul,
    "bmm": U.bmm,
    "relu": U.relu,
    "tanh": U.tanh,
    "sigmoid": U.sigmoid,
}

# Elementwise functions: unit-scaled one at a time only when they stand alone
# between other ops (see ``regions``); inside a composition they are calibrated
# with it, as ``50 * tanh(x / 50)`` needs.
ELEMENTWISE: frozenset[Callable[..., Any]] = frozenset(
    {U.gelu, U.silu, U.relu, U.tanh, U.sigmoid}
)

# Ops with a weight (or two activations multiplied): a residual branch contains
# at least one, which keeps hand-written formulas such as ``x + 0.04 * x**3``
# from passing as residuals.
_WEIGHTED: list[Callable[..., Any]] = [
    U.linear,
    U.linear_readout,
    U.matmul,
    U.bmm,
    U.einsum,
    U.grouped_mm,
    U.conv1d,
    U.conv2d,
    U.scaled_dot_product_attention,
    U.embedding,
]
_WEIGHTED += [
    getattr(U, name)
    for name in ("conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")
    if hasattr(U, name)
]
WEIGHTED: frozenset[Callable[..., Any]] = frozenset(_WEIGHTED)

# Products that make attention out of softmax probabilities.
ATTENTION_PRODUCTS: frozenset[Callable[..., Any]] = frozenset(
    {U.matmul, U.bmm, U.einsum}
)

CONSTRAINED: frozenset[Callable[..., Any]] = frozenset(
    fn
    for fn in UNIT_SCALED_FUNCTIONS
    if "constraint" in inspect.signature(fn).parameters
)


# Operators other libraries register with ``torch.library`` (opaque to tracing, so
# recognisable only by their qualified name), with the torch op each computes.
# Listed in docs/DESIGN.md with the other name-keyed rules.
NAMED_OPERATORS: dict[str, Callable[..., Any]] = {
    # Hugging Face's mixture-of-experts layers, where torch's grouped_mm kernel
    # cannot run (CPU, float32): F.grouped_mm(input, weight, offs=offs).
    "transformers::grouped_mm_fallback": U.grouped_mm,
}


def _operator_name(target: Any) -> str | None:
    """``namespace::name`` of a ``torch.ops`` operator (packet or overload)."""
    if isinstance(target, OpOverloadPacket):
        return str(target._qualified_op_name)
    if isinstance(target, OpOverload):
        return str(target._name)
    return None


def rule_for(node: Node) -> Callable[..., Any] | None:
    """The unit-scaled function replacing ``node``, if there is an analytic rule."""
    if node.op == "call_function" and node.target in U.torch_map:
        return U.torch_map[node.target]
    if node.op == "call_function" and (name := _operator_name(node.target)):
        return NAMED_OPERATORS.get(name)
    if node.op == "call_method" and node.target in _METHOD_RULES:
        return _METHOD_RULES[str(node.target)]
    return None


def _position(target: Any, name: str) -> int:
    return list(inspect.signature(target).parameters).index(name)


def get_argument(node: Node, name: str) -> Any:
    """Argument ``name`` of a call node (``None`` if not given)."""
    position = _position(node.target, name)
    if position < len(node.args):
        return node.args[position]
    return node.kwargs.get(name)


def set_argument(node: Node, name: str, value: Any) -> None:
    """Set argument ``name`` of a call node, wherever it was passed."""
    position = _position(node.target, name)
    if position < len(node.args):
        node.args = (*node.args[:position], value, *node.args[position + 1 :])
    else:
        node.kwargs = {**node.kwargs, name: value}


def accepts(target: Any, name: str) -> bool:
    """Whether ``target`` takes an argument called ``name``."""
    try:
        return name in inspect.signature(target).parameters
    except (TypeError, ValueError):
        return False


def is_float_dtype(value: Any) -> bool:
    return isinstance(value, torch.dtype) and value.is_floating_point
