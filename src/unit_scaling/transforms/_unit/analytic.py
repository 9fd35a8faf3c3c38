"""The stages of ``unit_scale`` that need no measurement: torch ops with a rule
replaced by their unit-scaled versions (with the arguments rebound by name),
sums of independent activations made ``U.add``, attention given the
unit-scaling temperature, and ops that alone read the model's inputs
unconstrained."""

from __future__ import annotations

import inspect
import logging
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx import Graph, Node

from ... import functional as U
from ..._fx_names import module_path
from ...scale import scale_bwd
from .._capture.graph import have_common_ancestor, is_add, retarget
from .._capture.opaque import UNIT_SCALED_FUNCTIONS
from .._capture.targets import (
    broadcast_gradient,
    calibrated_scale,
    low_rank_update,
    repeated_gradient,
    sum_branches,
)
from .regions import (
    is_rearrangement,
)
from .report import OpRecord, UnitScaleReport
from .rules import (
    CONSTRAINED,
    ELEMENTWISE,
    accepts,
    get_argument,
    rule_for,
    set_argument,
)
from .values import GraphValues

__all__ = [
    "OURS",
    "op_name",
    "rebind",
    "record_op",
    "replace_functions",
    "replace_with_unit_scaled",
    "unconstrain_inputs",
    "unit_scale_adds",
]

logger = logging.getLogger("unit_scaling.transforms.unit_scale")

# Our own graph targets, which the other stages leave alone.
OURS = frozenset(
    {
        *UNIT_SCALED_FUNCTIONS,
        scale_bwd,
        calibrated_scale,
        sum_branches,
        broadcast_gradient,
        repeated_gradient,
        low_rank_update,
    }
)


def op_name(node: Node) -> str:
    target = node.target
    if isinstance(target, str):
        return target
    return str(getattr(target, "__name__", target)).strip("_")


def record_op(report: UnitScaleReport, node: Node, how: Any, detail: str = "") -> None:
    report.ops.append(OpRecord(op_name(node), how, module_path(node), detail))


def replace_functions(
    graph: Graph, replace: dict[Callable[..., Any], Any], found: set[Any]
) -> None:
    for node in graph.nodes:
        if node.op == "call_function" and node.target in replace:
            found.add(node.target)
            target = replace[node.target]
            logger.info(
                "replacing function: %s with %s",
                node,
                getattr(target, "__name__", target),
            )
            retarget(node, target)


def rebind(node: Node, original: Any, target: Callable[..., Any]) -> None:
    """Pass ``node``'s arguments to ``target`` by name, as ``original`` named them,
    so that a unit-scaled function whose extra arguments sit between torch's in
    a different order still receives each one correctly."""
    try:
        signature = inspect.signature(original)
        bound = signature.bind(*node.args, **node.kwargs)
    except (TypeError, ValueError):
        retarget(node, target)
        return
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    if any(p.kind in variadic for p in signature.parameters.values()):
        retarget(node, target)  # e.g. torch.einsum(equation, *operands)
        return
    names = list(bound.arguments)
    first = names[0] if names else None
    if first is None or not all(accepts(target, n) for n in names[1:]):
        retarget(node, target)
        return
    args = (bound.arguments[first],)
    kwargs = {n: bound.arguments[n] for n in names[1:]}
    retarget(node, target, args, kwargs)


def replace_with_unit_scaled(
    graph: Graph, values: GraphValues, report: UnitScaleReport
) -> None:
    """Ops with an analytic rule (elementwise functions are left to the regions)."""
    for node in graph.nodes:
        if is_add(node):
            continue  # adds are handled once residuals are known
        target = rule_for(node)
        if target is None or target in ELEMENTWISE or not values.is_data(node):
            continue  # constants (masks, rotary tables) keep their plain ops
        if target in _AVERAGING and not _zero_mean(node.args[0] if node.args else None):
            continue  # calibrated with its input's producer instead (see _AVERAGING)
        logger.info("unit scaling function: %s", node)
        record_op(report, node, "analytic")
        original = node.target
        if node.op == "call_function":
            rebind(node, original, target)
        else:
            retarget(node, target)
        if target is U.scaled_dot_product_attention:
            _unit_attention_temperature(node, values)


# Pools, whose rules assume a zero-mean unit-normal input: an average of K values
# keeps their mean and shrinks the rest by K^-1/2, so the rule's K^1/2 would blow
# up the mean of, say, ReLU outputs (a global average pool after a ReLU: 8x at
# 8x8), and a maximum's scale depends on the distribution it takes the maximum
# of. Fed by anything but an op that keeps the mean at zero, a pool is left to
# calibration, which runs its producer in front of it.
_AVERAGING = frozenset(
    getattr(U, f"{kind}_pool{dims}d")
    for kind in ("avg", "adaptive_avg", "max", "adaptive_max")
    for dims in (1, 2, 3)
    if hasattr(U, f"{kind}_pool{dims}d")
)
# Torch ops (as traced) whose output keeps a zero mean for zero-mean inputs.
_ZERO_MEAN = frozenset(
    {
        F.linear,
        F.conv1d,
        F.conv2d,
        F.conv3d,
        F.layer_norm,
        F.group_norm,
        F.batch_norm,
        F.instance_norm,
        F.embedding,
        torch.matmul,
        operator.matmul,
        operator.add,
        operator.sub,
        torch.add,
    }
)


def _zero_mean(node: Any) -> bool:
    """Whether ``node`` is made by an op that keeps a zero mean (a projection, a
    normalisation, a sum), looking through rearrangements."""
    while isinstance(node, Node) and is_rearrangement(node) and node.args:
        node = node.args[0]
    return isinstance(node, Node) and (
        node.op == "placeholder" or node.target in _ZERO_MEAN or node.target in OURS
    )


def _unit_attention_temperature(node: Node, values: GraphValues) -> None:
    """Attention with the unit-scaling temperature ``d**-0.5``: unit-scaled ``q``
    and ``k`` then give unit-scaled logits, as they do in hand-written attention
    (a unit-scaled ``q @ k.T``). Models that scale ``q`` themselves, or leave the
    temperature to their initialisation (T5), lose that scale to unit scaling,
    so ``scale=`` is set rather than kept; U's own default would be u-μP's
    ``1/d``."""
    query = values.tensor(get_argument(node, "query"))
    if query is None or not query.shape:
        return
    scale = query.shape[-1] ** -0.5
    given = get_argument(node, "scale")
    if given is not None and given != scale:
        logger.info(
            "setting attention temperature: %s (scale %g, the model passed %s)",
            node,
            scale,
            given,
        )
    set_argument(node, "scale", scale)


def unit_scale_adds(graph: Graph, values: GraphValues, report: UnitScaleReport) -> None:
    """``a + b`` of two independent activations becomes ``U.add``, which divides
    by ``sqrt 2``: right only then. Sums of correlated terms (rotary embeddings'
    ``q cos + rotate(q) sin``) and sums with constants or parameters are left to
    the regions, which measure them."""
    index = {node: i for i, node in enumerate(graph.nodes)}
    for node in list(graph.nodes):
        if not is_add(node) or not values.is_data(node) or len(node.args) < 2:
            continue
        left, right = node.args[:2]
        if node.kwargs.get("alpha", 1) != 1 or not (
            values.is_data(left) and values.is_data(right)
        ):
            continue
        assert isinstance(left, Node) and isinstance(right, Node)
        if have_common_ancestor(left, right, index, values.is_data):
            continue
        logger.info("unit scaling function: %s", node)
        record_op(report, node, "analytic")
        retarget(node, U.add, args=(left, right), kwargs={})


def unconstrain_inputs(graph: Graph, inputs: set[Node]) -> None:
    """An op that alone reads the model's own ``inputs`` gets independent
    gradient scales (``constraint=None``): those gradients feed nothing else, so
    their scale is free. (Every other op's gradient scales are set consistently
    by ``consistency``; an input that several ops read keeps the true gradient,
    since its gradient is their sum.)"""
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in CONSTRAINED:
            continue
        read = [a for a in node.all_input_nodes if a in inputs]
        if read and all(len(a.users) == 1 for a in read):
            logger.info("unconstraining node: %s", node)
            set_argument(node, "constraint", None)
