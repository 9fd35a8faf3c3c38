"""Calibrated gradient scales where the unit-scaling rules leave them free.

Unit scaling constrains an op's gradient scales to keep the backward pass the
true gradient (up to one factor), except on **cut edges**: a gradient that feeds
nothing but what lies upstream of it may be rescaled without changing any other
gradient's direction, only the common scale of everything upstream. Two kinds of
node are cut edges in every graph:

* **parameters**: a parameter's gradient feeds nothing; its scale is free.
* **cut vertices**: activations through which every path from their ancestors to
  the outputs passes (an encoder's output, the residual stream between layers,
  an embedding). Rescaling the gradient there rescales the gradient of the whole
  subgraph before it, uniformly.

The analytic rules assume a unit-scaled gradient arrives at each op. Where that
does not hold (an encoder output read by the cross-attention of every decoder
layer, a projection under a constraint, attention with near-uniform weights),
these free scales are set from one measurement: the rewritten graph is run on
unit-normal stand-ins for its activation inputs, unit-normal gradients are
backpropagated from the output a loss would use (see :func:`loss_outputs`; the
geometric mean over a few draws), and each cut vertex and then each parameter gets
the factor that brings its gradient to unit scale (see :class:`GradientSize`).

A loss computed inside the graph (``out.sum()``, a cross-entropy on the logits)
is backpropagated with its real gradient, and that gradient may be correlated: a
sum sends the same value to every element, and a weight's gradient then sums it
coherently over the batch, growing a large mean next to its spread. That mean is
the loss's and the data's, not the ops': a gradient counts as at unit scale when
unit lies between its spread and its RMS, so a correction never shrinks a unit
spread under a large mean.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from torch import Tensor, nn
from torch.fx import Graph, GraphModule, Node

from ... import functional as U
from ..._standins import normal_like, seeded
from ...scale import scale_bwd
from .._capture.dynamo import restore_functorch_levels
from .._capture.engine import CaptureContext
from .._capture.graph import run_quietly
from .._capture.targets import RESCALING
from .values import GraphValues, Kind, TensorInfo

__all__ = [
    "ZERO_GRADIENT",
    "GradientCalibration",
    "GradientSize",
    "calibrate_gradients",
    "compensate_parameters",
    "cut_vertices",
    "downstream_factor",
    "loss_outputs",
    "scale_gradient",
    "toward_loss",
]

# A gradient this far below unit scale, once the corrections downstream of it are
# applied, is zero by construction (a key bias, to which softmax is invariant; a
# bias before a batch norm): what is measured is rounding noise, and there is no
# scale to correct. (A real gradient a thousand times off would be a fault to
# report, not a scale to fold in.)
ZERO_GRADIENT = 1e-3
# Parameters are brought to unit RMS when outside this factor of it; cut
# vertices only when further off (each one costs an elementwise pass).
PARAMETER_TOLERANCE = 1.1
# Output-gradient draws a calibration averages over (see calibrate_gradients).
GRADIENT_DRAWS = 4
# Output elements from which one draw is enough.
MANY_ELEMENTS = 2**16
CUT_TOLERANCE = 1.5


def _carries_gradient(node: Node, values: GraphValues) -> bool:
    # Parameters are leaves: a parameter shared across a cut vertex (tied
    # embeddings) gets its uses compensated instead (see compensate_parameters).
    return values.kind(node) is Kind.DATA


def cut_vertices(
    graph: Graph, values: GraphValues
) -> tuple[list[Node], dict[Node, int]]:
    """The activations every path from their ancestors to the output passes
    through, in graph order, and each activation's ancestor set among
    activations (a bitset over graph positions, itself included).

    Computed with the post-dominator tree of the gradient-carrying nodes: ``v``
    is a cut vertex when it post-dominates every one of its ancestors, i.e. when
    its subtree in that tree holds as many nodes as its ancestor set.
    """
    order = list(graph.nodes)
    position = {n: i for i, n in enumerate(order)}
    exit_node = next(n for n in reversed(order) if n.op == "output")
    parent: dict[Node, Node | None] = {exit_node: None}
    depth = {exit_node: 0}

    def common(a: Node, b: Node) -> Node:
        while a is not b:
            if depth[a] < depth[b]:
                a, b = b, a
            up = parent[a]
            assert up is not None
            a = up
        return a

    for node in reversed(order):
        if node is exit_node or not _carries_gradient(node, values):
            continue
        users = [u for u in node.users if u in parent]
        if not users:
            continue  # reaches no output: no gradient flows here
        dominator = users[0]
        for user in users[1:]:
            dominator = common(dominator, user)
        parent[node] = dominator
        depth[node] = depth[dominator] + 1
    size = dict.fromkeys(parent, 1)
    ancestors: dict[Node, int] = {}
    for node in order:
        if node not in parent or node is exit_node:
            continue
        bits = 1 << position[node]
        for p in node.all_input_nodes:
            bits |= ancestors.get(p, 0)
        ancestors[node] = bits
        up = parent[node]
        if up is not None and up is not exit_node:
            size[up] += size[node]
    cuts = [
        n
        for n in order
        if n in ancestors
        and values.is_data(n)
        and size[n] == bin(ancestors[n]).count("1")
    ]
    return cuts, ancestors


@dataclasses.dataclass(frozen=True)
class GradientSize:
    """A measured gradient's RMS and its standard deviation about its mean.

    The two differ when the gradient has a mean far from zero: a norm's gain,
    or a weight under a loss that reduces its output (a sum) and so sends
    correlated gradients to every row of the batch. The gradient is at unit
    scale when unit lies between them (``std <= 1 <= rms``, within a
    tolerance); else :meth:`correction` brings the nearer end to unit.
    """

    rms: float
    std: float

    @property
    def finite(self) -> bool:
        """Whether both measures are finite numbers."""
        return math.isfinite(self.rms) and math.isfinite(self.std)

    def __mul__(self, factor: float) -> GradientSize:
        return GradientSize(self.rms * factor, self.std * factor)

    def correction(self, tolerance: float) -> float:
        """The factor that brings the gradient to unit scale (1 when it is
        within ``tolerance`` of it).

        Example:
            >>> GradientSize(rms=3.7, std=1.0).correction(1.1)  # a mean of 3.6
            1.0
            >>> GradientSize(rms=4.0, std=4.0).correction(1.1)
            0.25
        """
        if self.std > tolerance:
            return 1 / self.std
        if self.rms < 1 / tolerance:
            return 1 / self.rms
        return 1.0


@dataclasses.dataclass
class GradientCalibration:
    """Measured gradient size of each cut vertex and each trainable parameter."""

    vertices: dict[Node, GradientSize]
    parameters: dict[Node, GradientSize]


def _stand_in_inputs(
    placeholders: list[Node], context: CaptureContext, values: GraphValues, seed: int
) -> list[Any]:
    """Unit-normal stand-ins for activation inputs, copies of other tensors (so
    that in-place updates stay local) and the parameters themselves."""
    generator = seeded(seed)
    inputs: list[Any] = []
    for node, value in zip(placeholders, context.example_inputs, strict=False):
        if isinstance(value, nn.Parameter):
            inputs.append(value)
        elif values.is_data(node) and isinstance(value, Tensor):
            x = normal_like(value, generator)
            inputs.append(x.requires_grad_(value.requires_grad))
        elif isinstance(value, Tensor):
            inputs.append(value.detach().clone())
        else:
            inputs.append(value)
    return inputs


def _with_outputs(gm: GraphModule, extra: list[Node]) -> tuple[GraphModule, int]:
    """A copy of ``gm`` that also returns ``extra``; and how many outputs the
    original returns."""
    graph = Graph()
    env: dict[Node, Node] = {}
    original = graph.graph_copy(gm.graph, env)
    flat = list(original) if isinstance(original, (tuple, list)) else [original]
    graph.output((*flat, *(env[n] for n in extra)))
    return GraphModule(gm, graph), len(flat)


def _output_leaves(graph: Graph) -> list[Any]:
    """What the graph's output node returns, as a flat list."""
    exits = list(graph.find_nodes(op="output"))
    if not exits:
        return []
    returned = exits[0].args[0]
    return list(returned) if isinstance(returned, (tuple, list)) else [returned]


def loss_outputs(graph: Graph, values: GraphValues) -> list[int]:
    """Positions, among the graph's flattened outputs, of those a loss would use.

    The scalar float activations if there are any (a loss computed inside the
    model). Else the largest float activation, preferring one that no op of the
    graph reads: logits rather than a key/value cache the model also returns
    (Dynamo may return such side outputs first), the last hidden state rather
    than a pooled summary of one of its tokens."""
    leaves = _output_leaves(graph)
    candidates = [
        (i, node, info)
        for i, node in enumerate(leaves)
        if values.is_data(node) and (info := values.tensor(node)) is not None
    ]
    losses = [i for i, _, info in candidates if info.numel == 1]
    if losses or not candidates:
        return losses

    def preference(candidate: tuple[int, Node, TensorInfo]) -> tuple[int, bool, int]:
        i, node, info = candidate
        while node.target in RESCALING and isinstance(node.args[0], Node):
            node = node.args[0]  # (the value a rewrite rescaled on its way out)
        return (info.numel, not _read(node), -i)

    return [max(candidates, key=preference)[0]]


def _read(node: Node) -> bool:
    """Whether an op of the graph reads ``node``, directly or through the
    gradient rescalings the rewrite inserted."""
    return any(
        u.op != "output" and (u.target not in RESCALING or _read(u)) for u in node.users
    )


def toward_loss(graph: Graph, values: GraphValues) -> set[Node]:
    """The nodes a loss's gradient reaches: the ancestors of the outputs
    :func:`loss_outputs` picks (themselves included)."""
    leaves = _output_leaves(graph)
    stack = [leaves[i] for i in loss_outputs(graph, values)]
    seen: set[Node] = set()
    while stack:
        node = stack.pop()
        if isinstance(node, Node) and node not in seen:
            seen.add(node)
            stack.extend(node.all_input_nodes)
    return seen


def calibrate_gradients(
    gm: GraphModule,
    context: CaptureContext,
    values: GraphValues,
    vertices: list[Node],
    seed: int = 0,
) -> GradientCalibration | str:
    """Measure the gradient RMS at ``vertices`` and at every trainable parameter
    (see the module docstring). Parameters' ``.grad`` and the global random
    state are left untouched. Returns why, if the graph cannot be run."""
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    params = {
        node: value
        for node, value in zip(placeholders, context.example_inputs, strict=False)
        if isinstance(value, nn.Parameter) and value.requires_grad
    }
    generator = seeded(seed + 1)
    try:
        with (
            torch.random.fork_rng(),
            torch.enable_grad(),
            restore_functorch_levels(),
        ):
            module, count = _with_outputs(gm, vertices)
            _as_whole_steps(module)
            stand_ins = _stand_in_inputs(placeholders, context, values, seed)
            results = run_quietly(module, *stand_ins)
            chosen = [results[i] for i in loss_outputs(gm.graph, values)]
            chosen = [t for t in chosen if isinstance(t, Tensor) and t.requires_grad]
            inner = {
                n: t
                for n, t in zip(vertices, results[count:], strict=True)
                if isinstance(t, Tensor) and t.requires_grad
            }
            if not chosen:
                return GradientCalibration({}, {})
            wrt = [*params.values(), *inner.values()]
            # The typical RMS over a few output-gradient draws (geometric mean):
            # one draw's RMS of a gradient that depends on few output elements (a
            # classifier's logits over a small batch, a gain read through the
            # attention scores) varies by 2x from draw to draw.
            # (A large output, such as a language model's logits, averages out
            # by itself: one draw, and no more backward passes than needed.)
            size = max(out.numel() for out in chosen)
            logs: list[tuple[float, float] | None] = [None] * len(wrt)
            draws = GRADIENT_DRAWS if 1 < size < MANY_ELEMENTS else 1
            for draw in range(draws):
                incoming = [
                    torch.ones_like(out)
                    if out.numel() == 1
                    else normal_like(out, generator)
                    for out in chosen
                ]
                received = torch.autograd.grad(
                    chosen,
                    wrt,
                    incoming,
                    allow_unused=True,
                    retain_graph=draw < draws - 1,
                )
                for i, g in enumerate(received):
                    if g is not None:
                        square, variance = _moments(g)
                        log_rms = math.log(max(square, 1e-300)) / (2 * draws)
                        log_std = math.log(max(variance, 1e-300)) / (2 * draws)
                        before = logs[i] or (0.0, 0.0)
                        logs[i] = (before[0] + log_rms, before[1] + log_std)
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    sizes = [
        None if log is None else GradientSize(math.exp(log[0]), math.exp(log[1]))
        for log in logs
    ]
    measured_params = {
        n: r for n, r in zip(params, sizes[: len(params)], strict=True) if r is not None
    }
    measured_vertices = {
        n: r for n, r in zip(inner, sizes[len(params) :], strict=True) if r is not None
    }
    return GradientCalibration(measured_vertices, measured_params)


def _as_whole_steps(gm: GraphModule) -> None:
    """Make every ``U.step_mean`` of ``gm`` (a copy) the mean of its own
    elements: its share of a step (``sqrt(n / N)`` on the gradient) is the
    training loop's business, not a scale for the ops upstream to correct."""
    changed = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is U.step_mean:
            loss, count, _ = node.args
            node.args = (loss, count, count)
            changed = True
    if changed:
        gm.recompile()


def _moments(gradient: Tensor) -> tuple[float, float]:
    """The mean square of ``gradient`` and its variance about its mean (both
    from one pass in float64 over the float32 values; a single element has no
    spread of its own, so its variance is its square)."""
    g = gradient.detach().float()
    square = float(g.square().mean(dtype=torch.float64))
    if g.numel() < 2:
        return square, square
    mean = float(g.mean(dtype=torch.float64))
    return square, max(square - mean * mean, 0.0)


def scale_gradient(graph: Graph, node: Node, factor: float) -> Node:
    """Scale the gradient arriving at ``node`` by ``factor`` (a ``scale_bwd``
    that every user of ``node`` reads instead); returns the new node."""
    with graph.inserting_after(node):
        scaled = graph.call_function(scale_bwd, (node, factor))
    for user in list(node.users):
        if user is not scaled:
            user.replace_input_with(node, scaled)
    return scaled


def rounded(factor: float) -> float:
    """Four significant figures, as the measurement warrants."""
    return float(f"{factor:.4g}")


def downstream_factor(
    corrections: dict[Node, float], ancestors: dict[Node, int], at: int
) -> float:
    """The product of the corrections at cut vertices downstream of graph
    position ``at`` (the vertex itself included): the gradient there has been
    rescaled by each of them."""
    product = 1.0
    for vertex, factor in corrections.items():
        if ancestors[vertex] >> at & 1:
            product *= factor
    return product


def _activation_uses(param: Node, ancestors: dict[Node, int]) -> list[Node]:
    """The activations that read ``param``, directly or through views of it
    (``gamma[:, None, None]``, a transposed weight)."""
    uses: list[Node] = []
    seen: set[Node] = set()
    stack = list(param.users)
    while stack:
        user = stack.pop()
        if user in seen:
            continue
        seen.add(user)
        if user in ancestors:
            uses.append(user)
        else:
            stack.extend(user.users)
    return uses


def compensate_parameters(
    graph: Graph,
    parameters: list[Node],
    corrections: dict[Node, float],
    ancestors: dict[Node, int],
    position: dict[Node, int],
) -> dict[Node, float]:
    """Keep every parameter's gradient the true one (up to its own factor)
    after cut-vertex corrections: a parameter used on both sides of a corrected
    cut vertex (a tied embedding) has the gradient of each use rescaled back.
    Returns the factor each parameter's gradient carries. ``position`` holds the
    graph positions ``ancestors`` was computed with."""
    carried: dict[Node, float] = {}
    for param in parameters:
        uses = _activation_uses(param, ancestors)
        factors = {
            u: downstream_factor(corrections, ancestors, position[u]) for u in uses
        }
        distinct = {float(f"{f:.6g}") for f in factors.values()}
        if len(distinct) <= 1 or any(u not in param.users for u in uses):
            # (Reached through a view of the parameter: the first factor.)
            carried[param] = next(iter(factors.values()), 1.0)
            continue
        carried[param] = 1.0
        for use, factor in factors.items():
            if factor != 1:
                with graph.inserting_before(use):
                    scaled = graph.call_function(scale_bwd, (param, 1 / factor))
                use.replace_input_with(param, scaled)
    return carried
