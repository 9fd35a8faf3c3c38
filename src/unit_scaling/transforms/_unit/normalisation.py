"""A loss normalised by a count the caller passes: ``U.step_mean``.

Training loops that accumulate gradients normalise each micro-batch's summed
loss by the elements of the whole step, counted outside the model and passed
in: Hugging Face's ``loss_sum / num_items_in_batch``, a float tensor under
``Trainer`` (or an integer from a custom loop). Left to the other stages, that
division would be a region of no known rule around a scalar: calibrated once
for the first call's count, or its ``1 / N`` kept in the gradient. Here it
becomes :func:`unit_scaling.functional.step_mean`, which gives the loss its
share ``n / N`` of the step (``n`` the elements the loss sums, counted on the
device), whatever ``N`` is on each call; see :mod:`unit_scaling.functional.steps`
for the rule.

Recognised: ``U.cross_entropy`` or ``U.mse_loss`` with ``reduction="sum"``,
divided by a count that is an argument of the call (a one-element tensor,
through dtype and device conversions, or a number: baked into the graph as a
constant until it changes, then a symbolic one). A normaliser the model
computes itself (a literal, a size, a count of its own targets) is left to the
other stages: computed from the call alone, it cannot describe other calls.
A call argument that reaches the scalar loss through anything else is named in
one warning, as the gradient then carries whatever the division left in it.
"""

from __future__ import annotations

import inspect
import logging
import operator
from typing import Any

import torch
from torch.fx import Graph, Node

from ... import functional as U
from .._capture.graph import retarget
from .analytic import record_op
from .report import UnitScaleReport
from .values import GraphValues, Kind

__all__ = ["recognise_step_means", "unrecognised_normalisers"]

logger = logging.getLogger("unit_scaling.transforms.unit_scale")

_DIVIDE = {operator.truediv, torch.div, torch.true_divide, "div", "__truediv__"}
# Conversions a count goes through on its way to the division (``.to(device)``).
_CONVERSIONS = {"to", "float", "double", "type", "type_as", "view", "reshape"}
_SUM_LOSSES = {U.cross_entropy: 1, U.mse_loss: 0}


def _argument(node: Node, name: str, default: Any) -> Any:
    """An argument of a call to a unit-scaled loss, by name."""
    try:
        bound = inspect.signature(node.target).bind(*node.args, **node.kwargs)  # type: ignore[arg-type]
    except TypeError:
        return default
    return bound.arguments.get(name, default)


def _summed_loss(node: Any) -> bool:
    return (
        isinstance(node, Node)
        and node.op == "call_function"
        and node.target in _SUM_LOSSES
        and _argument(node, "reduction", "mean") == "sum"
    )


def _source(node: Any) -> Any:
    """What ``node`` converts (through ``.to``, ``.float()``, ...), or itself."""
    while (
        isinstance(node, Node)
        and node.op == "call_method"
        and node.target in _CONVERSIONS
        and node.args
    ):
        node = node.args[0]
    return node


def _is_call_count(
    divisor: Any, values: GraphValues, call_inputs: set[Node], call_numbers: Any
) -> bool:
    """Whether ``divisor`` is a count the caller passed (see the module docstring)."""
    if isinstance(divisor, bool):
        return False
    if isinstance(divisor, (int, float)):
        return divisor in call_numbers
    source = _source(divisor)
    if not isinstance(source, Node) or source.op != "placeholder":
        return False
    if source in call_inputs:
        info = values.tensor(source)
        return info is not None and info.numel == 1
    # A number Dynamo made symbolic after it changed: an argument, not a size.
    return bool(source.meta.get("call_argument")) and values.tensor(source) is None


def _count(graph: Graph, loss: Node) -> Node:
    """A node counting the elements ``loss`` sums, inserted before ``loss``."""
    with graph.inserting_before(loss):
        if loss.target is U.cross_entropy:
            target = _argument(loss, "target", None)
            ignore = _argument(loss, "ignore_index", -100)
            kept = graph.call_function(torch.ne, (target, ignore))
            return graph.call_method("sum", (kept,))
        return graph.call_method("numel", (_argument(loss, "input", None),))


def _mark_constant(divisor: Any, values: GraphValues) -> None:
    """A count is not an activation: no stage may draw a stand-in for it."""
    node = divisor
    while isinstance(node, Node):
        values.kinds[node] = Kind.CONST
        converts = node.op == "call_method" and node.target in _CONVERSIONS
        node = node.args[0] if converts and node.args else None


def _is_division(node: Node) -> bool:
    return (
        node.op in ("call_function", "call_method")
        and node.target in _DIVIDE
        and len(node.args) == 2
        and node.kwargs.get("rounding_mode") is None
    )


def recognise_step_means(
    graph: Graph,
    values: GraphValues,
    report: UnitScaleReport,
    call_inputs: set[Node],
    call_numbers: Any,
) -> list[Node]:
    """Rewrite every ``loss_sum / count`` (see the module docstring) into
    ``U.step_mean(loss_sum, n, count)``; returns the rewritten nodes."""
    done = []
    for node in list(graph.nodes):
        if not _is_division(node):
            continue
        loss, divisor = node.args
        if not _summed_loss(loss) or not _is_call_count(
            divisor, values, call_inputs, call_numbers
        ):
            continue
        assert isinstance(loss, Node)
        source = _source(divisor)
        if isinstance(source, Node) and not all(
            _is_division(r) and _summed_loss(r.args[0]) and _source(r.args[1]) is source
            for r in _readers(source)
        ):
            continue  # the count is used as data too, not only as a normaliser
        count = _count(graph, loss)
        values.kinds[count] = Kind.CONST
        _mark_constant(divisor, values)
        retarget(node, U.step_mean, args=(loss, count, divisor), kwargs={})
        record_op(report, node, "analytic", "loss / a count the caller passes")
        logger.info("unit scaling function: %s (a share of the step)", node)
        done.append(node)
    return done


def _readers(source: Node) -> list[Node]:
    """The nodes that read ``source`` other than through conversions of it."""
    found: list[Node] = []
    stack = list(source.users)
    while stack:
        user = stack.pop()
        if user.op == "call_method" and user.target in _CONVERSIONS:
            stack.extend(user.users)
        else:
            found.append(user)
    return found


def unrecognised_normalisers(
    graph: Graph, values: GraphValues, call_inputs: set[Node]
) -> list[str]:
    """The arguments of the call that divide a scalar output of the graph (the
    loss) other than as ``U.step_mean``'s count: a normalisation this stage
    does not recognise (say, a mean-reduced loss divided by the step's count)."""
    exits = list(graph.find_nodes(op="output"))
    if not exits:
        return []
    returned = exits[0].args[0]
    leaves = list(returned) if isinstance(returned, (tuple, list)) else [returned]
    stack = [
        n
        for n in leaves
        if isinstance(n, Node)
        and values.is_data(n)
        and (info := values.tensor(n)) is not None
        and info.numel == 1
    ]
    found: set[str] = set()
    seen: set[Node] = set()
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if _is_division(node) and _is_call_count(
            node.args[1], values, call_inputs, frozenset()
        ):
            source = _source(node.args[1])
            found.add(str(source.meta.get("source_name", source.name)))
        # (a step_mean's count and divisor are not part of its loss)
        inputs = node.args[:1] if node.target is U.step_mean else node.all_input_nodes
        stack.extend(n for n in inputs if isinstance(n, Node))
    return sorted(found)
