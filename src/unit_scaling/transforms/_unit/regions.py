"""Ops with no unit-scaling rule: grouped into regions and calibrated.

No list of ops will ever be complete, so ``unit_scale`` applies the definition of
unit scaling itself to what its rules do not cover. After every op with an
analytic rule has been replaced, the remaining ops that compute activations are
grouped into **regions**: connected sets of such ops between rule-covered ops
(whatever a model computes between two linear layers, say: a hand-written
activation, soft-capping ``c * tanh(x / c)``, rotary embeddings, an adaLN
modulation, a selective scan). A region is calibrated as a whole: it is run on
unit-normal stand-ins of its activation inputs at the traced shapes (with the
real values of its constant inputs: masks, tables, parameters), a unit-normal
gradient is backpropagated from each output, and each output that is not at unit
RMS is multiplied by the static factor that makes it so. The multiply keeps the
region's true gradient, so the backward pass stays consistent with the forward.

Regions, not single ops, because scale rules compose badly for nonlinear ops:
``50 * tanh(x / 50)`` is the identity for unit ``x``, but rescaling ``x / 50``,
``tanh`` and ``* 50`` one at a time would turn it into ``tanh(x)``.

Calibration is sound for floating-point ops of floating-point inputs. It is not
attempted, and the region is reported as left as is, where it cannot mean
anything: a region whose output shape depends on the data (``nonzero``), whose
constant inputs could not be evaluated, or that fails on the stand-ins.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import operator
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor
from torch.fx import Graph, GraphModule, Node

from ..._standins import normal, normal_like, seeded
from ...scale import scale_bwd
from .._capture.dynamo import is_functorch_internal
from .._capture.graph import SAME_ELEMENTS, OpSet, run_quietly
from .._capture.targets import broadcast_gradient, calibrated_scale, repeated_gradient
from .values import GraphValues, Kind, TensorInfo

__all__ = [
    "Calibration",
    "Region",
    "apply_output_scales",
    "calibrate",
    "find_regions",
    "is_rearrangement",
    "subgraph",
]

logger = logging.getLogger("unit_scaling.transforms.unit_scale")

# A calibrated scale within this factor of 1 is not applied: the op is already
# unit-scaled, and a multiply would cost a pass for nothing.
UNIT_TOLERANCE = 1.1
# Runs averaged when a region draws random numbers (see calibrate).
RANDOM_DRAWS = 8
# Ops that draw random numbers, as Dynamo records them.
_RANDOM = OpSet(
    frozenset(
        {
            torch.rand,
            torch.rand_like,
            torch.randn,
            torch.randn_like,
            torch.randint,
            torch.randint_like,
            torch.randperm,
            torch.bernoulli,
            torch.multinomial,
            torch.normal,
            torch.poisson,
            torch.dropout,
            torch.nn.functional.dropout,
            torch.nn.functional.alpha_dropout,
            torch.nn.functional.feature_alpha_dropout,
            torch.nn.functional.dropout1d,
            torch.nn.functional.dropout2d,
            torch.nn.functional.dropout3d,
            torch.nn.functional.rrelu,
        }
    ),
    frozenset(
        {
            "bernoulli",
            "bernoulli_",
            "uniform_",
            "normal_",
            "random_",
            "exponential_",
            "geometric_",
            "log_normal_",
            "cauchy_",
        }
    ),
)
# Elements this large are masks' fill values (-inf, finfo.min), not data: they are
# left out of the measured RMS.
_MASK_MAGNITUDE = 1e4

# Ops that only rearrange, copy or cast their input: a region made of these alone
# keeps the scale of its activation inputs and needs no calibration.
_REARRANGING = SAME_ELEMENTS | OpSet(
    frozenset(
        {
            operator.getitem,
            operator.neg,
            torch.cat,
            torch.concat,
            torch.concatenate,
            torch.stack,
            torch.split,
            torch.chunk,
            torch.unbind,
            torch.narrow,
            torch.select,
            torch.roll,
            torch.flip,
            torch.movedim,
            torch.neg,
        }
    ),
    frozenset(
        {
            "expand",
            "expand_as",
            "split",
            "chunk",
            "unbind",
            "narrow",
            "select",
            "repeat",
            "flip",
            "roll",
            "movedim",
            "swapaxes",
            "float",
            "half",
            "bfloat16",
            "double",
            "to",
            "type",
            "type_as",
            "neg",
            "__neg__",
            "__getitem__",
        }
    ),
)


def is_rearrangement(node: Node) -> bool:
    """True for ops that only rearrange, copy, cast or negate their input."""
    return node in _REARRANGING


@dataclasses.dataclass
class Calibration:
    """What calibrating a region measured.

    ``output_rms[i]`` is the RMS of output ``i`` on the stand-ins (``None`` for
    outputs that are not floating-point activations); ``input_grad_rms`` the RMS of
    each activation input's gradient once the outputs are rescaled.
    """

    output_rms: list[float | None]
    input_grad_rms: dict[Node, float]


@dataclasses.dataclass
class Region:
    """Connected ops with no analytic rule (see the module docstring)."""

    nodes: list[Node]
    calibration: Calibration | None = None
    # Why the region was not calibrated, if it was not.
    skipped: str | None = None

    @property
    def inputs(self) -> list[Node]:
        """Nodes outside the region that its nodes read (as the graph is now:
        calibrating a region before this one may have rescaled an input)."""
        inside = set(self.nodes)
        return list(
            dict.fromkeys(
                p for n in self.nodes for p in n.all_input_nodes if p not in inside
            )
        )

    @property
    def outputs(self) -> list[Node]:
        """Nodes of the region used outside it."""
        inside = set(self.nodes)
        return [n for n in self.nodes if any(u not in inside for u in n.users)]

    def op_names(self) -> list[str]:
        """Names of the ops that change values (rearrangements left out)."""
        names: dict[str, None] = {}
        for node in self.nodes:
            if not is_rearrangement(node):
                names[_op_name(node)] = None
        return list(names) or ["rearrangement"]

    @property
    def rearranges_only(self) -> bool:
        return all(is_rearrangement(n) for n in self.nodes)


def _op_name(node: Node) -> str:
    target = node.target
    if isinstance(target, str):
        return target
    return getattr(target, "__name__", str(target)).strip("_")


def find_regions(
    graph: Graph,
    values: GraphValues,
    is_covered: Callable[[Node], bool],
    stands_alone: Callable[[Node], bool],
) -> list[Region]:
    """Group the activation ops of ``graph`` not covered by a rule into regions.

    A call node is in a region if ``is_covered`` is false for it and it computes
    an activation, or is computed from a node in a region (a mask or index that
    depends on activations is recomputed with them). Regions are the connected
    components of those nodes; their outputs are the members used outside. A node
    for which ``stands_alone`` holds (a product with a weight that no rule
    covers) is a region of its own, so that what follows it sees a unit input.
    """
    members: set[Node] = set()
    for node in graph.nodes:
        if node.op not in ("call_function", "call_method") or is_covered(node):
            continue
        if values.kind(node) is Kind.DATA or any(
            p in members for p in node.all_input_nodes
        ):
            members.add(node)
    parent: dict[Node, Node] = {n: n for n in members}

    def find(n: Node) -> Node:
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    alone = {n for n in members if stands_alone(n)}
    for node in members:
        for p in node.all_input_nodes:
            if p in members and node not in alone and p not in alone:
                parent[find(p)] = find(node)
    groups: dict[Node, list[Node]] = {}
    for node in graph.nodes:  # graph order within each region
        if node in members:
            groups.setdefault(find(node), []).append(node)
    return [Region(nodes) for nodes in groups.values()]


def _valid_rms(t: Tensor) -> float | None:
    """RMS over the elements that are data rather than mask fill values."""
    x = t.detach().float()
    valid = torch.isfinite(x) & (x.abs() < _MASK_MAGNITUDE)
    count = int(valid.sum())
    if count == 0:
        return None
    return math.sqrt(float(torch.where(valid, x, 0.0).square().sum()) / count)


def _stand_in(info: TensorInfo, generator: torch.Generator) -> Tensor:
    return normal(info.shape, generator, info.device, info.dtype).requires_grad_()


@dataclasses.dataclass
class _Plan:
    """How to feed a region on stand-ins: ``leaves`` are the placeholders of the
    calibration graph (with their values), ``prefix`` maps region inputs to the
    producer nodes that are run in front of the region."""

    leaves: list[Node]
    leaf_values: list[Any]
    stand_ins: dict[Node, Tensor]
    prefix: dict[Node, Node]
    # Ops from a random draw to a constant input (a drop-path mask), run in front
    # of the region so that each calibration run draws anew.
    random: list[Node] = dataclasses.field(default_factory=list)


def _plan(
    region: Region,
    values: GraphValues,
    generator: torch.Generator,
    shapes_output: Callable[[Node], bool],
) -> _Plan | str:
    """Stand-ins for the region's inputs, or why they cannot be made.

    An activation input is a unit-normal stand-in, unless its producer is an op
    for which ``shapes_output`` holds (a softmax, a ReLU...): then the producer
    itself runs on unit-normal stand-ins in front of the region, so that the
    region sees probabilities or non-negative values as it would in the model.
    """
    plan = _Plan([], [], {}, {})

    def leaf(node: Node) -> str | None:
        if node in plan.leaves or node in plan.random:
            return None
        if values.is_data(node):
            info = values.tensor(node)
            assert info is not None
            plan.stand_ins[node] = _stand_in(info, generator)
            value: Any = plan.stand_ins[node]
        elif node in values.constants:
            value = values.constants[node]
        else:
            return f"the value of its input {node.name} is not known at trace time"
        plan.leaves.append(node)
        plan.leaf_values.append(value)
        return None

    for node in region.inputs:
        chain = _random_chain(node, values)
        if chain:
            plan.random += [n for n in chain if n not in plan.random]
            for n in chain:
                for p in n.all_input_nodes:
                    if p not in chain and (problem := leaf(p)) is not None:
                        return problem
            continue
        producer_inputs = node.all_input_nodes
        if (
            values.is_data(node)
            and shapes_output(node)
            and all(values.is_data(p) or p in values.constants for p in producer_inputs)
        ):
            plan.prefix[node] = node
            for p in producer_inputs:
                leaf(p)
            continue
        problem = leaf(node)
        if problem is not None:
            return problem
    return plan


def _random_chain(node: Node, values: GraphValues) -> list[Node]:
    """The constant ops from a random draw to ``node`` (in dependency order), if
    ``node`` is a constant computed from one; else empty."""
    if values.kind(node) is not Kind.CONST:
        return []
    order: list[Node] = []
    seen: set[Node] = set()

    def visit(n: Node) -> None:
        if n in seen or n.op not in ("call_function", "call_method"):
            return
        seen.add(n)
        for p in n.all_input_nodes:
            visit(p)
        order.append(n)

    visit(node)
    return order if any(_is_random(n) for n in order) else []


def subgraph(
    root: GraphModule, nodes: list[Node], inputs: list[Node], outputs: list[Node]
) -> GraphModule:
    """``nodes`` of ``root``'s graph as a module taking ``inputs`` and returning
    the tuple of ``outputs``."""
    graph = Graph()
    env: dict[Node, Node] = {}
    for i, node in enumerate(inputs):
        env[node] = graph.placeholder(f"input_{i}")
    for node in nodes:
        env[node] = graph.node_copy(node, lambda n: env[n])
    graph.output(tuple(env[n] for n in outputs))
    return GraphModule(root, graph)


def _subgraph(root: GraphModule, region: Region, plan: _Plan) -> GraphModule:
    """The region (and its prefix producers) as a module of its leaves, returning
    the region's outputs followed by the prefix producers' outputs."""
    return subgraph(
        root,
        [*plan.random, *plan.prefix.values(), *region.nodes],
        plan.leaves,
        [*region.outputs, *plan.prefix],
    )


def _float_outputs(outputs: Iterable[Any]) -> list[Tensor | None]:
    return [
        x if isinstance(x, Tensor) and x.is_floating_point() else None for x in outputs
    ]


def _is_random(node: Node) -> bool:
    """Whether ``node`` draws random numbers (a mask, noise)."""
    return node in _RANDOM


def _measure(
    module: GraphModule,
    plan: _Plan,
    region: Region,
    values: GraphValues,
    generator: torch.Generator,
) -> tuple[list[float | None], dict[Node, float]] | str:
    """One run of a region's subgraph on its stand-ins: the RMS of each output
    and of the gradient each input receives from unit-scaled output gradients."""
    region_outputs = region.outputs
    everything = _float_outputs(run_quietly(module, *plan.leaf_values))
    outputs = everything[: len(region_outputs)]
    fed = dict(zip(plan.prefix, everything[len(region_outputs) :], strict=True))
    for node, out in zip(region_outputs, outputs, strict=True):
        info = values.infos[node]
        if (
            out is not None
            and isinstance(info, TensorInfo)
            and tuple(out.shape) != info.shape
        ):
            return (
                f"its output {node.name} has a shape that depends on the data "
                f"({tuple(out.shape)} on stand-ins, {info.shape} traced)"
            )
    rms: list[float | None] = [
        _valid_rms(out) if out is not None and values.is_data(node) else None
        for node, out in zip(region_outputs, outputs, strict=True)
    ]
    differentiable = [
        (out, r)
        for out, r in zip(outputs, rms, strict=True)
        if out is not None and r is not None and out.requires_grad
    ]
    sources = {
        **plan.stand_ins,
        **{n: t for n, t in fed.items() if t is not None},
    }
    sources = {n: t for n, t in sources.items() if n in region.inputs}
    grads: dict[Node, float] = {}
    if differentiable and sources:
        incoming = [
            normal_like(out, generator) / max(r, 1e-30) for out, r in differentiable
        ]
        received = torch.autograd.grad(
            [out for out, _ in differentiable],
            list(sources.values()),
            incoming,
            allow_unused=True,
        )
        for node, grad in zip(sources, received, strict=True):
            measured = None if grad is None else _valid_rms(grad)
            if measured is not None:
                grads[node] = measured
    return rms, grads


def calibrate(
    root: GraphModule,
    region: Region,
    values: GraphValues,
    shapes_output: Callable[[Node], bool] = lambda node: False,
    seed: int = 0,
) -> Calibration | str:
    """Measure ``region`` on unit-normal stand-ins (see the module docstring and
    :func:`_plan` for ``shapes_output``).

    Returns the :class:`Calibration`, or a string saying why it cannot be done.
    The global random-number generators are left untouched.
    """
    if any(is_functorch_internal(n.target) for n in region.nodes):
        return "it contains functorch (vmap) internals, which run only whole-graph"
    region_outputs = region.outputs
    for node in region_outputs:
        if values.infos.get(node) is None:
            return f"the shape of {node.name} is not known at trace time"
    generator = seeded(seed)
    plan = _plan(region, values, generator, shapes_output)
    if isinstance(plan, str):
        return plan
    module = _subgraph(root, region, plan)
    devices = {x.device.index or 0 for x in plan.stand_ins.values() if x.is_cuda}
    random = plan.random or any(_is_random(n) for n in region.nodes)
    draws = RANDOM_DRAWS if random else 1
    squares: list[list[float | None]] = []
    grad_squares: dict[Node, list[float]] = {}
    try:
        with torch.random.fork_rng(devices=sorted(devices)), torch.enable_grad():
            for _ in range(draws):
                measured = _measure(module, plan, region, values, generator)
                if isinstance(measured, str):
                    return measured
                rms_once, grads_once = measured
                squares.append([None if r is None else r * r for r in rms_once])
                for node, g in grads_once.items():
                    grad_squares.setdefault(node, []).append(g * g)
    except Exception as error:
        return f"it fails on unit-normal stand-ins ({type(error).__name__}: {error})"
    # Over the draws of a region that draws random numbers (a drop-path's mask
    # over a batch of two keeps 0, 1 or 2 samples): the root mean square.
    rms = [
        None
        if any(d[i] is None for d in squares)
        else (sum(d[i] or 0.0 for d in squares) / len(squares)) ** 0.5
        for i in range(len(squares[0]))
    ]
    grads = {n: (sum(v) / len(v)) ** 0.5 for n, v in grad_squares.items()}
    return Calibration(rms, grads)


def apply_output_scales(
    graph: Graph, region: Region, values: GraphValues, keep: set[Node]
) -> list[tuple[Node, float]]:
    """Multiply each region output not at unit scale by ``1 / rms`` (its true
    gradient included), except outputs in ``keep``; returns the outputs scaled
    and their factors."""
    assert region.calibration is not None
    inside = set(region.nodes)
    applied = []
    for node, rms in zip(region.outputs, region.calibration.output_rms, strict=True):
        if rms is None or rms == 0 or 1 / UNIT_TOLERANCE <= rms <= UNIT_TOLERANCE:
            continue
        info = values.tensor(node)
        if node in keep or (info is not None and info.numel == 1):
            continue  # a scalar (a loss, a total) keeps the value the model defines
        factor = _round_scale(1 / rms)
        with graph.inserting_after(node):
            scaled = graph.call_function(calibrated_scale, (node, factor))
        values.record_like(scaled, node)
        for user in list(node.users):
            if user is not scaled and user not in inside:
                user.replace_input_with(node, scaled)
        applied.append((node, factor))
    return applied


# How far from unit scale the gradient a region passes back to an input may be
# before it gets a gradient scale of its own (see apply_input_gradient_scales).
GRADIENT_TOLERANCE = 1.5


def apply_input_gradient_scales(
    graph: Graph, region: Region, values: GraphValues, keep: set[Node]
) -> list[tuple[Node, float]]:
    """Give each activation input whose gradient the region passes back far
    from unit scale (an average pool's ``1/K``, a gather's sum over the tokens
    routed to an expert) the gradient scale ``1 / rms`` on its edges into the
    region, as the analytic rules give each op its natural gradient scale; the
    path factors (``consistency``) keep the gradients true up to one factor
    per node. Not for a region with an output left as it is (a scalar, a value
    frozen code reads): its gradient is the model's own. Returns the inputs
    scaled and their factors."""
    calibration = region.calibration
    assert calibration is not None
    for node, rms in zip(region.outputs, calibration.output_rms, strict=True):
        info = values.tensor(node)
        if rms is None or node in keep or (info is not None and info.numel == 1):
            return []
    inside = set(region.nodes)
    applied = []
    for source, rms in calibration.input_grad_rms.items():
        if rms == 0 or 1 / GRADIENT_TOLERANCE <= rms <= GRADIENT_TOLERANCE:
            continue
        if not values.is_data(source) or source.target in (
            scale_bwd,
            broadcast_gradient,
            repeated_gradient,
        ):
            continue  # (a broadcast operand has its analytic gradient scale)
        factor = _round_scale(1 / rms)
        users = [u for u in source.users if u in inside]
        if not users:
            continue
        with graph.inserting_before(users[0]):
            scaled = graph.call_function(scale_bwd, (source, factor))
        values.record_like(scaled, source)
        for user in users:
            user.replace_input_with(source, scaled)
        region.nodes.insert(region.nodes.index(users[0]), scaled)
        applied.append((source, factor))
    return applied


def _round_scale(scale: float) -> float:
    """Four significant figures: the measured factor has about that accuracy, and
    round numbers read better in logs and reports."""
    return float(f"{scale:.4g}")
