"""Parameters: their roles, unit initialisation and gradient scales.

Unit scaling wants weights at unit standard deviation (the ops carry the
``1/sqrt(fan_in)``), biases at zero and multiplicative gains at one. Parameters of
torch's own layers (``nn.Linear``, ``nn.Embedding``, convolutions,
``nn.MultiheadAttention``) are initialised when ``unit_scale`` is called. Any
other parameter — an expert weight used through ``F.linear``, a layer-scale gain,
a learned position table — has a role only its use in the graph reveals, so it is
initialised when the first graph is captured (once; later captures and copies of
the module keep its values):

* used as the weight of a linear, convolution, matmul or embedding: **weight**,
  unit standard deviation;
* used as the bias of a linear or convolution, or added to activations while
  having at most one dimension larger than 1: **bias**, zero;
* added to or concatenated with activations, with more than one such dimension
  (a position table, a class token): **table**, unit standard deviation;
* multiplying activations: **gain**, one;
* the weight or bias of a normalisation: **norm** (one) or **norm bias** (zero),
  the values every normalisation starts from;
* anything else (e.g. ``A_log`` of a state-space model, used through ``exp``):
  **other**, kept.

A weight's **fan-in** is read from its use too (:func:`weight_fan_ins`): the
number of terms each output of the product sums. It is what u-μP's
learning-rate rules need, and differs from what the weight's shape says for a
weight stored ``(in, out)`` and used as ``x @ W``.

A parameter that enters an activation op directly (not through a linear layer or
normalisation, which scale their own parameter gradients) gets its gradient
scaled by ``expansion^(-1/2)``, ``expansion`` being how many output elements each
of its elements reaches: the gradient of a broadcast parameter sums that many
unit terms. A parameter's gradient feeds nothing else, so this scale is free.
Where the op broadcasts the parameter (an elementwise op), ``expansion`` is read
from each call's shapes, since it counts the examples of the batch.
"""

from __future__ import annotations

import inspect
import logging
import operator
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.fx import Graph, Node

from ... import functional as U
from ..._torch_internals import ConvNdBase
from ...scale import scale_bwd
from .._capture.library import AttentionFunctions
from .._capture.targets import broadcast_gradient
from .regions import is_rearrangement
from .rules import WEIGHTED
from .values import GraphValues, Kind

__all__ = [
    "graph_roles",
    "initialise",
    "scale_direct_parameter_gradients",
    "unit_init_layers",
    "weight_fan_ins",
]

logger = logging.getLogger("unit_scaling.transforms.unit_scale")

_NORMS = frozenset(
    getattr(U, name)
    for name in (
        "layer_norm",
        "rms_norm",
        "group_norm",
        "batch_norm",
        "instance_norm",
    )
    if hasattr(U, name)
)
_WEIGHT_ARGUMENT = {U.linear: 1, U.linear_readout: 1, U.embedding: 1}
# Where each normalisation takes its bias positionally (see its signature).
_NORM_BIAS_POSITION = {
    norm: list(inspect.signature(norm).parameters).index("bias")
    for norm in _NORMS
    if "bias" in inspect.signature(norm).parameters
}
_BIAS_ARGUMENT = {U.linear: 2, U.linear_readout: 2}
_MULTIPLY = {operator.mul, operator.truediv, torch.mul, torch.div, "mul", "div"}
_ADD = {operator.add, operator.sub, torch.add, torch.sub, U.add, "add", "sub"}
_JOIN = {torch.cat, torch.concat, torch.stack}
# Ops that resample their input's values: Hugging Face's vision transformers
# interpolate their position table to an image of another size than their
# config's (see _consumers).
_RESAMPLING = {U.interpolate, F.interpolate}


def _layer_weights(module: nn.Module) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(weights, biases)`` attribute names of torch's layers."""
    if isinstance(
        module,
        (nn.Linear, nn.Embedding, ConvNdBase, nn.Bilinear),
    ):
        return ("weight",), ("bias",)
    if isinstance(module, (nn.MultiheadAttention, AttentionFunctions)):
        return (
            ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight"),
            ("in_proj_bias", "bias_k", "bias_v"),
        )
    return (), ()


def initialise(param: Tensor, role: str) -> str:
    """Set ``param`` for its role in place; returns what was done."""
    with torch.no_grad():
        if role in ("weight", "table"):
            std = param.float().std() if param.numel() > 1 else param.new_zeros(())
            if param.numel() > 1 and torch.isfinite(std) and std > 0:
                param.div_(std.to(param.dtype))
            else:
                param.normal_()
            return "unit std"
        if role in ("bias", "norm bias"):
            param.zero_()
            return "zero"
        if role in ("gain", "norm"):
            param.fill_(1)
            return "ones"
    return "kept"


def unit_init_layers(module: nn.Module, skip: set[int] | None = None) -> set[int]:
    """Initialise the parameters of torch's layers in ``module`` but those whose
    ids are in ``skip``; returns the ids of those initialised."""
    done: set[int] = set()
    skip = skip or set()
    for name, sub in module.named_modules():
        weights, biases = _layer_weights(sub)
        for attrs, role in ((weights, "weight"), (biases, "bias")):
            for attr in attrs:
                param = getattr(sub, attr, None)
                if (
                    isinstance(param, Tensor)
                    and id(param) not in done
                    and id(param) not in skip
                ):
                    done.add(id(param))
                    path = f"{name}.{attr}" if name else attr
                    message = (
                        "unit scaling weight: %s"
                        if role == "weight"
                        else "setting bias to zero: %s"
                    )
                    logger.info(message, path)
                    initialise(param, role)
    return done


def _consumers(
    node: Node, values: GraphValues, resampled: bool = False
) -> Iterable[tuple[Node, Node]]:
    """``(consumer, input)`` pairs: where a parameter, through rearrangements of
    parameters only, enters an op that is not such a rearrangement.

    With ``resampled``, also through resamplings of the parameter's values and
    rearrangements of those, as long as what they read is computed from the
    parameter alone: a position table sliced, interpolated to another image
    size and joined again is still the table (an interpolation has a rule, so
    :mod:`.values` counts what it computes as an activation). A model resamples
    its table only at some shapes, and a parameter must find the same role at
    whichever shape it is first captured (its value is set then).
    """
    candidates: dict[Node, None] = {}  # ordered sets
    frontier = [node]
    while frontier:
        for user in frontier.pop().users:
            if user not in candidates and _passes_values(user, values, resampled):
                candidates[user] = None
                frontier.append(user)
    # A join of the parameter's values with an activation computed otherwise is
    # where the parameter is used: a candidate stays only if every activation
    # it reads is derived (sweeps until none is added: joins come in any order).
    derived = {node: None}
    grown = True
    while grown:
        size = len(derived)
        for user in candidates:
            if user not in derived and all(
                a in derived or not values.is_data(a) for a in user.all_input_nodes
            ):
                derived[user] = None
        grown = len(derived) > size
    seen = set(derived)
    for current in derived:
        for user in current.users:
            if user not in seen:
                seen.add(user)
                yield user, current


def _passes_values(user: Node, values: GraphValues, resampled: bool) -> bool:
    """Whether ``user`` hands on the values of its parameter input (see
    :func:`_consumers`)."""
    rearranges = is_rearrangement(user) or user.target is operator.getitem
    if values.kind(user) is Kind.PARAM and rearranges:
        return True
    return resampled and (rearranges or user.target in _RESAMPLING)


def _role_at(consumer: Node, via: Node, values: GraphValues) -> str:
    target: Any = consumer.target
    args = consumer.args
    if target in _WEIGHT_ARGUMENT:
        position = _WEIGHT_ARGUMENT[target]
        if len(args) > position and args[position] is via:
            return "weight"
        if target in _BIAS_ARGUMENT and (
            (len(args) > _BIAS_ARGUMENT[target] and args[_BIAS_ARGUMENT[target]] is via)
            or consumer.kwargs.get("bias") is via
        ):
            return "bias"
        return "weight" if consumer.kwargs.get("weight") is via else "other"
    if target in WEIGHTED:
        if "conv" in getattr(target, "__name__", ""):
            bias = args[2] if len(args) > 2 else consumer.kwargs.get("bias")
            return "bias" if bias is via else "weight"
        return "weight"
    if target in _NORMS:
        bias = consumer.kwargs.get("bias")
        bias_position = _NORM_BIAS_POSITION.get(target)
        if bias_position is not None and len(args) > bias_position:
            bias = args[bias_position]
        return "norm bias" if bias is via else "norm"
    others = [a for a in consumer.all_input_nodes if a is not via]
    with_data = any(values.is_data(a) for a in others)
    if target in _MULTIPLY and with_data:
        return "gain"
    info = values.tensor(via)
    wide = info is not None and sum(s > 1 for s in info.shape) > 1
    if target in _ADD and with_data:
        return "table" if wide else "bias"
    if target in _JOIN and wide:
        return "table"
    if wide and with_data and values.is_data(consumer):
        return "weight"  # a product no rule covers, such as a grouped matmul
    return "other"


_PRIORITY = ("weight", "table", "gain", "bias", "norm", "norm bias", "other")


def graph_roles(
    graph: Graph, values: GraphValues, names: dict[Node, str]
) -> dict[Node, str]:
    """The role of each parameter placeholder of ``graph`` (see the module
    docstring); ``names`` gives each placeholder's readable name."""
    roles: dict[Node, str] = {}
    for node in names:
        found = {
            _role_at(c, via, values)
            for c, via in _consumers(node, values, resampled=True)
        }
        roles[node] = next((r for r in _PRIORITY if r in found), "other")
    return roles


# Products whose operands are (left, right), contracting left's last dimension
# with right's last but one.
_LEFT_RIGHT = {U.matmul: (0, 1), U.bmm: (0, 1)}


def _contraction(consumer: Node, via: Node, values: GraphValues) -> int | None:
    """How many terms each output of ``consumer`` sums over ``via``'s dimensions,
    where ``via`` is a product's weight; None for any other use."""
    info = values.tensor(via)
    if info is None or len(info.shape) < 2:
        return None
    args, target = consumer.args, consumer.target
    if target in (U.linear, U.linear_readout):  # weight (out, in)
        weight = args[1] if len(args) > 1 else consumer.kwargs.get("weight")
        return info.shape[-1] if weight is via else None
    if target in _LEFT_RIGHT:
        left, right = (args[i] if len(args) > i else None for i in _LEFT_RIGHT[target])
        if right is via and left is not via:
            return info.shape[-2]
        if left is via and right is not via:
            return info.shape[-1]
    return None


def weight_fan_ins(
    graph: Graph, values: GraphValues, nodes: Iterable[Node]
) -> dict[Node, int]:
    """The fan-in each parameter placeholder in ``nodes`` is used with as the
    weight of a linear layer or matmul (through rearrangements such as ``W.t()``),
    where every such use agrees; a parameter with none, or with uses that
    disagree, is left out (its shape decides)."""
    found: dict[Node, int] = {}
    for node in nodes:
        sizes = {
            size
            for consumer, via in _consumers(node, values)
            if (size := _contraction(consumer, via, values)) is not None
        }
        if len(sizes) == 1:
            found[node] = sizes.pop()
    return found


# Elementwise ops: their output has the broadcast shape of their tensor operands.
_ELEMENTWISE = frozenset(
    {operator.mul, operator.add, operator.sub, operator.truediv, U.add}
    | {torch.mul, torch.add, torch.sub, torch.div, torch.where}
    | {"mul", "add", "sub", "div", "where"}
)


def scale_direct_parameter_gradients(graph: Graph, values: GraphValues) -> int:
    """Scale the gradient of every parameter entering an activation op directly by
    ``expansion^(-1/2)`` (see the module docstring); returns how many uses."""
    scaled = 0
    for node in list(graph.nodes):
        if values.kind(node) is not Kind.PARAM or not values.tensor(node):
            continue
        for consumer, via in list(_consumers(node, values)):
            if via is not node or consumer.target in WEIGHTED | _NORMS:
                continue
            if consumer.target in _WEIGHT_ARGUMENT or not values.is_data(consumer):
                continue
            source, out = values.tensor(via), values.tensor(consumer)
            if source is None or out is None or source.numel == 0:
                continue
            expansion = out.numel / source.numel
            if expansion <= 1:
                continue
            others = [
                a
                for a in consumer.all_input_nodes
                if a is not via and values.tensor(a) is not None
            ]
            with graph.inserting_before(consumer):
                if consumer.target in _ELEMENTWISE:
                    # read from each call's shapes: the expansion counts the
                    # batch, which changes from call to call
                    sizes = [graph.call_method("size", (a,)) for a in others]
                    for size in sizes:
                        values.kinds[size] = Kind.CONST
                    use = graph.call_function(broadcast_gradient, (via, *sizes))
                else:  # any other op (a join): its sizes as captured
                    use = graph.call_function(scale_bwd, (via, expansion**-0.5))
            consumer.replace_input_with(via, use)
            scaled += 1
    return scaled
