"""Hand-written ops recognised by what they compute.

Models write normalisations and activations by hand: Llama's RMSNorm as
``x * rsqrt(mean(x**2) + eps) * w``, Gemma's with ``(1 + w)``, T5's without the
mean subtraction, GPT-2's GELU as ``0.5 x (1 + tanh(...))``. Each is a region of
ops with no rule (see ``regions``). Before such a region is calibrated as a
whole, it is checked numerically against the torch functions it might compute:
run on a stand-in input (deliberately off unit scale and off zero mean, so that
normalisations and identities tell apart), with its real parameters, it must
match the candidate to float precision. A match replaces the region with the
torch function's unit-scaled equivalent, an analytic rule, whatever the model's
code looked like. No class or function names are consulted.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.fx import Graph, GraphModule, Node

from ... import functional as U
from ..._standins import normal, seeded
from .._capture.fallbacks import fell_back
from .._capture.graph import run_quietly
from .regions import Region, subgraph
from .values import GraphValues, Kind

__all__ = ["Recognised", "recognise", "recognise_within", "replace_region"]

# How close a region must be to a candidate to count as computing it.
_RTOL, _ATOL = 1e-4, 1e-5
_DEFAULT_EPS = 1e-6


@dataclasses.dataclass(frozen=True)
class Recognised:
    """What a region computes: ``target(x, *args, **kwargs)``, where an argument
    ``("gain", w)`` stands for ``1 + w`` and a node for itself."""

    name: str
    input: Node
    target: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def _eps_candidates(region: Region) -> list[float]:
    found = [
        a
        for n in region.nodes
        for a in (*n.args, *n.kwargs.values())
        if isinstance(a, float) and 0 < a < 1e-2
    ]
    return [*dict.fromkeys(found), _DEFAULT_EPS]


def _activations(
    x: Tensor,
) -> list[tuple[str, Callable[..., Any], dict[str, Any], Tensor]]:
    return [
        ("gelu", U.gelu, {}, F.gelu(x)),
        ("gelu", U.gelu, {"approximate": "tanh"}, F.gelu(x, approximate="tanh")),
        ("silu", U.silu, {}, F.silu(x)),
        ("relu", U.relu, {}, F.relu(x)),
        ("sigmoid", U.sigmoid, {}, torch.sigmoid(x)),
        ("tanh", U.tanh, {}, torch.tanh(x)),
    ]


_Candidate = tuple[str, Callable[..., Any], tuple[Any, ...], dict[str, Any], Tensor]


def _norms(x: Tensor, params: dict[Node, Tensor], eps: float) -> list[_Candidate]:
    """Normalisations over the last dim with each way of using the parameters."""
    size = x.shape[-1]
    shape = (size,)
    gains: list[tuple[Any, Tensor | None]] = [(None, None)]
    for node, value in params.items():
        gains += [(node, value), (("gain", node), 1 + value)]
    found: list[_Candidate] = []
    rms = F.rms_norm(x, shape, None, eps)
    centred = F.layer_norm(x, shape, None, None, eps)
    for gain, gain_value in gains:
        scaled = rms if gain_value is None else rms * gain_value
        found.append(("rms_norm", U.rms_norm, (shape, gain), {"eps": eps}, scaled))
        layer = centred if gain_value is None else centred * gain_value
        found.append(
            ("layer_norm", U.layer_norm, (shape, gain, None), {"eps": eps}, layer)
        )
        for bias, bias_value in params.items():
            if bias is not gain:
                found.append(
                    (
                        "layer_norm",
                        U.layer_norm,
                        (shape, gain, bias),
                        {"eps": eps},
                        layer + bias_value,
                    )
                )
    return found


def recognise(
    root: GraphModule, region: Region, values: GraphValues, activations: bool = True
) -> Recognised | None:
    """The torch function ``region`` computes, if it is a normalisation over the
    last dimension or (unless ``activations`` is false) an activation with a
    unit-scaled equivalent."""
    inputs, outputs = region.inputs, region.outputs
    data = [n for n in inputs if values.is_data(n)]
    if len(data) != 1 or len(outputs) != 1:
        return None
    x_node, y_node = data[0], outputs[0]
    x_info, y_info = values.tensor(x_node), values.tensor(y_node)
    if (
        x_info is None
        or y_info is None
        or x_info.shape != y_info.shape
        or not x_info.shape
    ):
        return None
    size = x_info.shape[-1]
    # Parameters take random values (around one, as gains are), so that a
    # parameter at its initial value (all ones, all zeros) cannot pass unnoticed.
    generator = seeded(0)
    params: dict[Node, Tensor] = {}
    leaves: list[Any] = []
    x = normal(x_info.shape, generator, x_info.device) * 2.5 + 0.7
    for node in inputs:
        if node is x_node:
            leaves.append(x.to(x_info.dtype))
            continue
        if node not in values.constants:
            return None
        value = values.constants[node]
        if values.kind(node) is Kind.PARAM and isinstance(value, Tensor):
            if tuple(value.shape) != (size,):
                return None
            params[node] = 1 + 0.3 * normal((size,), generator, value.device)
            value = params[node].to(value)
        leaves.append(value)
    try:
        with torch.no_grad():
            (y,) = run_quietly(subgraph(root, region.nodes, inputs, outputs), *leaves)
    except Exception as error:
        fell_back("recognise", f"{x_node.name} -> {y_node.name}", error)
        return None
    if not isinstance(y, Tensor) or not y.is_floating_point():
        return None
    y = y.float()
    x = x.to(x_info.dtype).float()

    def matches(candidate: Tensor) -> bool:
        return bool(torch.allclose(y, candidate, rtol=_RTOL, atol=_ATOL))

    if activations and not params:
        for name, target, kwargs, candidate in _activations(x):
            if matches(candidate):
                return Recognised(name, x_node, target, (), kwargs)
    for eps in _eps_candidates(region):
        for name, target, args, kwargs, candidate in _norms(x, params, eps):
            if matches(candidate):
                return Recognised(name, x_node, target, args, kwargs)
    return None


# The most ops a recognised part of a larger region may span (a hand-written
# normalisation takes about ten): bounds the search over the region's parts.
_PART_LIMIT = 16


def recognise_within(
    root: GraphModule, region: Region, values: GraphValues
) -> tuple[Region, Recognised] | None:
    """A part of ``region`` that computes a recognised function, when the region
    as a whole does not: the ops between some node ``x`` (of the region or one of
    its inputs) and a node ``y`` of the region, if the rest uses only ``y``. For
    instance a normalisation whose output feeds ops no rule covers (a
    mixture-of-experts dispatch), or the query and key norms of an attention
    layer, between the reshape into heads and the rotary embedding. The largest
    such part ending at the latest ``y`` is returned, with what it computes; call
    again on what is left to find the next one. Where ``x`` is computed inside
    the region, only normalisations count: they do not depend on the scale of
    their input, while an activation's rule assumes a unit input (``tanh(h / 50)``
    is not ``tanh`` of a unit-scaled ``h / 50``)."""
    inside = set(region.nodes)
    order = {n: i for i, n in enumerate(region.nodes)}
    for y in reversed(region.nodes):
        info = values.tensor(y)
        if info is None or not info.shape or values.kind(y) is not Kind.DATA:
            continue
        upstream: set[Node] = set()
        stack = [y]
        while stack:
            node = stack.pop()
            if node not in upstream:
                upstream.add(node)
                stack.extend(p for p in node.all_input_nodes if p in inside)
        sources = [
            n
            for n in (*region.inputs, *region.nodes)
            if n is not y
            and values.is_data(n)
            and getattr(values.tensor(n), "shape", None) == info.shape
            and (n in upstream or n not in inside)
        ]
        for x in sources:
            part = _between(x, upstream)
            if not 2 <= len(part) <= _PART_LIMIT or len(part) == len(region.nodes):
                continue
            sub = Region(sorted(part, key=order.__getitem__))
            if sub.outputs != [y] or [n for n in sub.inputs if values.is_data(n)] != [
                x
            ]:
                continue
            found = recognise(root, sub, values, activations=x not in inside)
            if found is not None:
                return sub, found
    return None


def _between(x: Node, upstream: set[Node]) -> set[Node]:
    """The nodes of ``upstream`` computed from ``x`` (``x`` itself excluded)."""
    part: set[Node] = set()
    stack = [u for u in x.users if u in upstream]
    while stack:
        node = stack.pop()
        if node not in part:
            part.add(node)
            stack.extend(u for u in node.users if u in upstream)
    return part


def replace_region(graph: Graph, region: Region, found: Recognised) -> Node:
    """Compute ``found`` in place of ``region``'s output; erase what is left
    unused of the region. Returns the new node."""
    output = region.outputs[0]
    with graph.inserting_after(output):
        args = []
        for arg in found.args:
            if isinstance(arg, tuple) and len(arg) == 2 and arg[0] == "gain":
                gain = graph.call_function(operator.add, (arg[1], 1.0))
                args.append(gain)
            else:
                args.append(arg)
        new = graph.call_function(
            found.target, (found.input, *args), dict(found.kwargs)
        )
    output.replace_all_uses_with(new, delete_user_cb=lambda user: user is not new)
    for node in reversed(region.nodes):
        if not node.users:
            graph.erase_node(node)
    return new
