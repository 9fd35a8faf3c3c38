"""Compositions of traced torch ops that are one op with a unit-scaling rule.

Rules on the ops themselves, whatever library wrote them:

* **soft-capping**, ``tanh(x / c) * c`` (Gemma's attention and final logits):
  ``U.softcap(x, c)``;
* **a linear layer as** ``addmm(b, x, W)`` with a weight ``W`` of shape
  ``(in, out)`` (Hugging Face's ``Conv1D``, GPT-2): ``U.linear(x, W.t(), b)``.
"""

from __future__ import annotations

import logging
import operator
from typing import Any

import torch
from torch.fx import Graph, Node

from ... import functional as U
from .._capture.graph import retarget
from .values import GraphValues, Kind, TensorInfo

__all__ = ["rewrite_patterns"]

logger = logging.getLogger("unit_scaling.transforms.unit_scale")

_TANH = {torch.tanh, "tanh", torch.nn.functional.tanh}
_DIVIDE = {operator.truediv, torch.div, "div", "__truediv__"}
_MULTIPLY = {operator.mul, torch.mul, "mul", "__mul__"}


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and value else None


def _divisor(node: Node) -> tuple[Node, float] | None:
    """``(x, c)`` if ``node`` computes ``x / c`` or ``x * (1/c)`` for a number."""
    if len(node.args) != 2 or not isinstance(node.args[0], Node):
        return None
    number = _number(node.args[1])
    if number is None:
        return None
    if node.target in _DIVIDE:
        return node.args[0], number
    if node.target in _MULTIPLY:
        return node.args[0], 1 / number
    return None


def _softcap(node: Node) -> tuple[Node, Node, float] | None:
    """``(output, x, c)`` if ``node`` is the ``tanh`` of ``tanh(x / c) * c``."""
    if node.target not in _TANH or len(node.users) != 1 or not node.args:
        return None
    inner = node.args[0]
    if not isinstance(inner, Node) or len(inner.users) != 1:
        return None
    divided = _divisor(inner)
    (outer,) = node.users
    if divided is None or outer.target not in _MULTIPLY or len(outer.args) != 2:
        return None
    other = outer.args[1] if outer.args[0] is node else outer.args[0]
    cap = _number(other)
    if cap is None or abs(divided[1] - cap) > 1e-6 * abs(cap):
        return None
    return outer, divided[0], cap


def _linear(node: Node, values: GraphValues) -> tuple[Node, Node, Any] | None:
    """``(x, W, b)`` if ``node`` is ``addmm(b, x, W)`` with a parameter ``W``."""
    if node.op != "call_function" or node.target is not torch.addmm:
        return None
    if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
        return None
    if len(node.args) != 3:
        return None
    bias, x, weight = node.args
    if not (isinstance(x, Node) and isinstance(weight, Node)):
        return None
    if values.kind(weight) is not Kind.PARAM or not values.is_data(x):
        return None
    if isinstance(bias, Node) and values.kind(bias) is not Kind.PARAM:
        return None
    return x, weight, bias


def rewrite_patterns(graph: Graph, values: GraphValues) -> list[tuple[str, Node]]:
    """Apply the rules of the module docstring; returns ``(rule, node)`` for each
    rewrite."""
    done: list[tuple[str, Node]] = []
    for node in list(graph.nodes):
        capped = _softcap(node) if values.is_data(node) else None
        if capped is not None:
            outer, x, cap = capped
            inner = node.args[0]
            retarget(outer, U.softcap, args=(x, cap), kwargs={})
            graph.erase_node(node)
            assert isinstance(inner, Node)
            graph.erase_node(inner)
            logger.info("recognised soft-capping: %s (cap %g)", outer, cap)
            done.append(("softcap", outer))
            continue
        linear = _linear(node, values)
        if linear is not None:
            x, weight, bias = linear
            with graph.inserting_before(node):
                transposed = graph.call_method("t", (weight,))
            values.kinds[transposed] = Kind.PARAM
            info = values.tensor(weight)
            if info is not None:
                values.infos[transposed] = TensorInfo(
                    info.shape[::-1], info.dtype, info.device
                )
            retarget(node, U.linear, args=(x, transposed, bias), kwargs={})
            logger.info("recognised a linear layer: %s (addmm)", node)
            done.append(("linear", node))
    return done
