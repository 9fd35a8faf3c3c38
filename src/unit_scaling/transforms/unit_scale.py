"""``unit_scale``: turn an existing ``nn.Module`` into a unit-scaled one."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import operator
import warnings
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.fx import Graph, GraphModule, Node

from .. import functional as U
from .._fx_names import module_path
from .._torch_internals import fsdp_unsharded_parameters, pytree
from ..core.functional import transformer_residual_scaling_rule
from ..scale import scale_bwd
from ._checkpoint import (
    KEY,
    Record,
    decode,
    encode,
    key_to_text,
    record_in_config,
    write_to_config,
)
from ._consistency import scale_broadcast_gradients, unconstrain_consistently
from ._dynamo import functorch_sections, is_functorch_internal
from ._engine import (
    CaptureContext,
    CapturePass,
    Place,
    Transform,
    apply_transform,
    recapture,
    transform_state,
)
from ._gradients import (
    CUT_TOLERANCE,
    PARAMETER_TOLERANCE,
    ZERO_GRADIENT,
    calibrate_gradients,
    compensate_parameters,
    cut_vertices,
    downstream_factor,
    rounded,
    scale_gradient,
)
from ._graph import have_common_ancestor, is_add, retarget
from ._inplace import functionalize_inplace
from ._library import (
    opaque_library_functions,
    opaque_rewrite_functions,
    rewrite_library_modules,
)
from ._params import (
    graph_roles,
    initialise,
    scale_direct_parameter_gradients,
    unit_init_layers,
)
from ._patterns import rewrite_patterns
from ._recognise import recognise, recognise_within, replace_region
from ._regions import (
    Calibration,
    Region,
    apply_input_gradient_scales,
    apply_output_scales,
    calibrate,
    find_regions,
    is_rearrangement,
)
from ._report import OpRecord, ParameterRecord, UnitScaleReport
from ._residuals import find_residuals, rewrite_residual
from ._rules import (
    CONSTRAINED,
    ELEMENTWISE,
    UNIT_SCALED_FUNCTIONS,
    accepts,
    get_argument,
    rule_for,
    set_argument,
)
from ._tags import TagRecord, tag_from_graph, tag_structure
from ._targets import calibrated_scale, sum_branches
from ._values import GraphValues, Kind, graph_values

__all__ = [
    "UNIT_SCALED_FUNCTIONS",
    "UnitScaleReport",
    "checkpoint_record",
    "load_checkpoint_record",
    "unit_scale",
    "unit_scale_report",
]

logger = logging.getLogger(__name__)
M = TypeVar("M", bound=nn.Module)
# u-μP types whose learning rates follow one rule (bias and norm gains share one).
_LR_GROUP = {"weight": "weight", "output": "output", "bias": "vector", "norm": "vector"}

# Our own graph targets, which the other stages leave alone.
_OURS = frozenset({*UNIT_SCALED_FUNCTIONS, scale_bwd, calibrated_scale, sum_branches})


def _name(node: Node) -> str:
    target = node.target
    if isinstance(target, str):
        return target
    return str(getattr(target, "__name__", target)).strip("_")


def _record(report: UnitScaleReport, node: Node, how: Any, detail: str = "") -> None:
    report.ops.append(OpRecord(_name(node), how, module_path(node), detail))


# --------------------------------------------------------------------------- #
# Stages.
# --------------------------------------------------------------------------- #


def _replace_functions(
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


def _rebind(node: Node, original: Any, target: Callable[..., Any]) -> None:
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


def _replace_with_unit_scaled(
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
        _record(report, node, "analytic")
        original = node.target
        if node.op == "call_function":
            _rebind(node, original, target)
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
        node.op == "placeholder" or node.target in _ZERO_MEAN or node.target in _OURS
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


def _unit_scale_adds(
    graph: Graph, values: GraphValues, report: UnitScaleReport
) -> None:
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
        _record(report, node, "analytic")
        retarget(node, U.add, args=(left, right), kwargs={})


# Unit-scaled ops whose outputs are far from a zero-mean normal for normal inputs
# (probabilities, non-negative values): calibration runs them in front of the ops
# they feed, rather than feeding those ops unit-normal stand-ins.
_SHAPING = frozenset({U.softmax, U.relu, U.gelu, U.silu, U.sigmoid, U.silu_glu})


def _shapes_output(node: Node) -> bool:
    return node.op == "call_function" and node.target in _SHAPING


def _zero_padding(node: Node) -> bool:
    """``F.pad`` with zeros: a border around the data, like a convolution's own
    padding, which unit scaling does not count (calibrating it would count the
    zeros, and scale the data up by as much as the border is wide)."""
    if node.target not in (F.pad, torch.constant_pad_nd):
        return False
    mode = node.kwargs.get("mode", node.args[2] if len(node.args) > 2 else "constant")
    value = node.kwargs.get("value", node.args[3] if len(node.args) > 3 else None)
    return mode == "constant" and not value


# Products no rule covers; like any op with a weight, each is calibrated alone.
_UNCOVERED_PRODUCTS = frozenset(
    {torch.mm, torch.addmm, torch.baddbmm, torch.addbmm, "mm", "addmm", "baddbmm"}
)


def _stands_alone(values: GraphValues) -> Callable[[Node], bool]:
    def alone(node: Node) -> bool:
        if node.target in _UNCOVERED_PRODUCTS:
            return True
        inputs = node.all_input_nodes
        weight = any(
            values.kind(a) is Kind.PARAM
            and (info := values.tensor(a)) is not None
            and sum(size > 1 for size in info.shape) >= 2
            for a in inputs
        )
        return (
            weight
            and any(values.is_data(a) for a in inputs)
            and node.target not in _ELEMENTWISE_ARITHMETIC
        )

    return alone


_ELEMENTWISE_ARITHMETIC = frozenset(
    {
        operator.mul,
        operator.truediv,
        operator.add,
        operator.sub,
        torch.mul,
        torch.div,
        torch.add,
        torch.sub,
        torch.cat,
        "mul",
        "div",
        "add",
        "sub",
    }
)


# A region's calibration in a form another capture of it can take: the RMS of
# each output, and of each input's gradient by the input's position.
_Measured = tuple[list[float | None], dict[int, float]]


def _calibrate_once(
    gm: GraphModule,
    region: Region,
    values: GraphValues,
    key: tuple[Any, ...],
    measured: dict[tuple[Any, ...], _Measured],
) -> Calibration | str:
    """``calibrate(region)``, measured at the first capture of the region and
    taken again by later captures with the same ``key`` (see
    :func:`_capture_key`): one function whatever the batch, instead of
    stand-in draws that differ by a few percent from one batch size to another."""
    inputs = region.inputs
    known = measured.get(key)
    if known is not None and len(known[0]) == len(region.outputs):
        rms, grads = known
        if all(i < len(inputs) for i in grads):
            return Calibration(list(rms), {inputs[i]: g for i, g in grads.items()})
    result = calibrate(gm, region, values, _shapes_output)
    if isinstance(result, Calibration):
        position = {node: i for i, node in enumerate(inputs)}
        measured[key] = (
            list(result.output_rms),
            {position[n]: g for n, g in result.input_grad_rms.items() if n in position},
        )
    return result


def _capture_key(
    where: str, op: str, nodes: list[Node], values: GraphValues, seen: Counter[Any]
) -> tuple[Any, ...]:
    """What identifies a calibrated region across captures: its module, its
    ops, the shapes of its inputs ``nodes`` beyond the leading (batch) dimension,
    which data parallelism and evaluation change, and which occurrence of all
    that in this capture it is. (A region's scales depend on its inputs alone:
    it is measured on stand-ins with unit output gradients.)"""
    shapes = tuple(
        info.shape[1:] if (info := values.tensor(n)) is not None else None
        for n in nodes
    )
    base = (where, op, shapes)
    seen[base] += 1
    return (*base, seen[base])


def _calibrate_regions(
    gm: GraphModule,
    values: GraphValues,
    report: UnitScaleReport,
    frozen: set[Node],
    measured: dict[tuple[Any, ...], _Measured],
) -> list[Region]:
    """Calibrate every region of ops no rule covers (see ``_regions``). Outputs
    that feed frozen code keep their scale: there, the value itself may matter
    (a scan's decay factor). ``measured`` holds earlier captures' calibrations."""
    graph = gm.graph
    seen: Counter[Any] = Counter()

    def covered(node: Node) -> bool:
        if node in frozen or node.op != "call_function":
            return node in frozen
        if _zero_padding(node):
            return True  # keeps its input's scale (borders are not data)
        if node.target is operator.getitem and isinstance(node.args[0], Node):
            return covered(node.args[0])  # an output of U.residual_split, say
        return node.target in _OURS

    regions = find_regions(graph, values, covered, _stands_alone(values))
    keep = {p for node in frozen for p in node.all_input_nodes if p not in frozen}
    for region in regions:
        if region.rearranges_only:
            continue
        value_ops = [n for n in region.nodes if values.kind(n) is Kind.DATA]
        if len(region.nodes) == 1:
            node = region.nodes[0]
            target = rule_for(node)
            if target in ELEMENTWISE:
                assert target is not None
                logger.info("unit scaling function: %s", node)
                _record(report, node, "analytic")
                if node.op == "call_function":
                    _rebind(node, node.target, target)
                else:
                    retarget(node, target)
                continue
        anchor = value_ops[-1] if value_ops else region.nodes[-1]
        names = region.op_names()
        op = "+".join(
            names if len(names) <= 4 else [*names[:3], f"{len(names) - 3} more"]
        )
        found = recognise(gm, region, values)
        if found is not None:
            replaced = region.outputs[0]
            new = replace_region(graph, region, found)
            values.record_like(new, replaced)
            logger.info("recognised %s as %s: %s", op, found.name, new)
            report.ops.append(
                OpRecord(
                    found.name, "analytic", module_path(anchor), f"recognised: {op}"
                )
            )
            continue
        while (part := recognise_within(gm, region, values)) is not None:
            # recognise that part; calibrate the rest
            sub, found = part
            sub_names = sub.op_names()
            replaced = sub.outputs[0]
            where = module_path(replaced)
            new = replace_region(graph, sub, found)
            values.record_like(new, replaced)  # what the rest sees
            done = set(sub.nodes)
            logger.info("recognised %s as %s: %s", "+".join(sub_names), found.name, new)
            report.ops.append(
                OpRecord(
                    found.name,
                    "analytic",
                    where,
                    f"recognised: {'+'.join(sub_names)}",
                )
            )
            region.nodes = [n for n in region.nodes if n not in done]
            if not region.nodes or region.rearranges_only:
                break
            value_ops = [n for n in region.nodes if values.kind(n) is Kind.DATA]
            anchor = value_ops[-1] if value_ops else region.nodes[-1]
            names = region.op_names()
            op = "+".join(
                names if len(names) <= 4 else [*names[:3], f"{len(names) - 3} more"]
            )
        if not region.nodes or region.rearranges_only:
            continue
        key = _capture_key(module_path(anchor), op, region.inputs, values, seen)
        result = _calibrate_once(gm, region, values, key, measured)
        if isinstance(result, str):
            region.skipped = result
            logger.info("leaving ops as is: %s (%s): %s", anchor, op, result)
            report.ops.append(OpRecord(op, "left as is", module_path(anchor), result))
            continue
        region.calibration = result
        applied = apply_output_scales(graph, region, values, keep)
        for source, factor in apply_input_gradient_scales(graph, region, values, keep):
            logger.info(
                "unit scaling gradient: %s -> %s (calibrated: x%g)",
                anchor,
                source,
                factor,
            )
        if applied:
            factors = ", ".join(f"{n.name} x{f:g}" for n, f in applied)
            logger.info("unit scaling function: %s (calibrated: %s)", anchor, factors)
            detail = ", ".join(f"x{f:g}" for _, f in applied)
            report.ops.append(OpRecord(op, "calibrated", module_path(anchor), detail))
        else:
            report.ops.append(OpRecord(op, "unit already", module_path(anchor)))
    return regions


def _unconstrain_inputs(graph: Graph, inputs: set[Node]) -> None:
    """An op that alone reads the model's own ``inputs`` gets independent
    gradient scales (``constraint=None``): those gradients feed nothing else, so
    their scale is free. (Every other op's gradient scales are set consistently
    by ``_consistency``; an input that several ops read keeps the true gradient,
    since its gradient is their sum.)"""
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in CONSTRAINED:
            continue
        read = [a for a in node.all_input_nodes if a in inputs]
        if read and all(len(a.users) == 1 for a in read):
            logger.info("unconstraining node: %s", node)
            set_argument(node, "constraint", None)


# --------------------------------------------------------------------------- #
# The pass.
# --------------------------------------------------------------------------- #


class _UnitScalingPass(CapturePass):
    """The ``unit_scale`` graph pass, with what it learns across captures: the
    report, and which parameters have been initialised (by name, so that copies
    of a transformed module keep their parameters' values)."""

    def __init__(
        self,
        replace: dict[Callable[..., Any], Any],
        residual_scaling: Callable[[int, int], float] | None = None,
        initialised: set[str] | None = None,
        grad_scales: dict[str, float] | None = None,
        tags: dict[str, TagRecord] | None = None,
        branches: int | None = None,
        measured: dict[tuple[Any, ...], _Measured] | None = None,
        cut_scales: dict[str, float] | None = None,
        residual_name: str = "fixed",
    ) -> None:
        self.replace = replace
        self.residual_scaling = residual_scaling
        self.residual_name = residual_name
        self.found: set[Any] = set()
        self.initialised: set[str] = set(initialised or ())
        # Calibrated parameter-gradient scales, by parameter name: measured at the
        # first capture that uses a parameter and reused by later ones.
        self.grad_scales: dict[str, float] = dict(grad_scales or {})
        # u-μP tags by parameter name (every alias of a tied parameter).
        self.report = UnitScaleReport(tags=dict(tags or {}))
        # The residual branches of the whole forward, counted over the graphs of
        # the first call (graph breaks split it); until then, those seen so far.
        self.branches = branches
        # Per captured graph (by id): its residual branches, and the positions
        # of its outputs that are constants (rotary tables, masks), so that a
        # graph captured after it in the same call keeps them constants.
        self.residual_counts: dict[int, int] = {}
        # Region calibrations by what identifies them across captures.
        self.measured: dict[tuple[Any, ...], _Measured] = dict(measured or {})
        # Gradient corrections at cut vertices, by what identifies a vertex
        # across captures (as a region's calibration): measured once, so that a
        # capture after a reload (or of another batch size) runs the same
        # backward pass.
        self.cut_scales: dict[str, float] = dict(cut_scales or {})

        self.constant_outputs: dict[int, frozenset[int]] = {}

    def fresh(self) -> _UnitScalingPass:
        return _UnitScalingPass(
            self.replace,
            self.residual_scaling,
            self.initialised,
            self.grad_scales,
            self.report.tags,
            self.branches,
            self.measured,
            self.cut_scales,
            self.residual_name,
        )

    def record(self) -> Record:
        """What this pass learned, as a checkpoint keeps it."""
        return Record(
            residual_scaling=self.residual_name,
            initialised=set(self.initialised),
            grad_scales=dict(self.grad_scales),
            measured=dict(self.measured),
            cut_scales=dict(self.cut_scales),
        )

    def restore(self, record: Record, where: str) -> None:
        """Take ``record`` (of the weights the model now holds): every parameter
        counts as initialised, and measured scales are reused, not measured."""
        if record.residual_scaling != self.residual_name:
            raise ValueError(
                f"{where} was trained with unit_scale(residual_scaling="
                f"{record.residual_scaling!r}), but this model was made with "
                f"residual_scaling={self.residual_name!r}: the residual weights, "
                "and so the function, would differ. Pass the same residual_scaling"
            )
        self.initialised.update(record.initialised)
        self.grad_scales.update(record.grad_scales)
        self.measured.update(record.measured)
        self.cut_scales.update(record.cut_scales)

    def count_branches(self, state: Any) -> None:
        """After the first call: the residual branches of every graph it ran."""
        self.branches = sum(
            self.residual_counts.get(id(c.graph_module), 0)
            for c in state.graphs_run_in_call
        )

    def check_shared_graphs(self, state: Any, output: Any) -> None:
        """After each call: u-μP's residual weights depend on a branch's depth,
        so a graph with residual branches must not run for several blocks (as
        TorchDynamo shares one graph between the identical blocks of a model
        that graph breaks split, e.g. at FSDP2's hooks)."""
        if self.residual_scaling is None:
            return
        runs = Counter(
            id(c.graph_module)
            for c in state.graphs_run_in_call
            if self.residual_counts.get(id(c.graph_module))
        )
        if any(n > 1 for n in runs.values()):
            raise RuntimeError(
                "unit_scale(residual_scaling=...): TorchDynamo ran one captured "
                "graph for several blocks of this model (it shares a graph "
                "between identical blocks when graph breaks, such as FSDP2's "
                "hooks, split the forward at block boundaries), but the "
                "depth-dependent residual weights differ from block to block. Use "
                'residual_scaling="fixed" for a model split like this'
            )

    def _constants_before(self, context: CaptureContext) -> set[int]:
        """Ids of the constants that earlier graphs of this call passed on."""
        found = set()
        for gm, outputs in context.graphs_before:
            for i in self.constant_outputs.get(id(gm), ()):
                if i < len(outputs) and outputs[i] is not None:
                    found.add(id(outputs[i]))
        return found

    def _calibrate_gradients(
        self,
        gm: GraphModule,
        values: GraphValues,
        context: CaptureContext,
        readable: dict[Node, str],
    ) -> None:
        """Bring gradients to unit scale where the rules leave their scale free
        (see ``_gradients``): cut vertices, measured at every capture, and
        parameters, measured at the first capture that uses them and reused."""
        graph = gm.graph
        for node, name in readable.items():
            factor = self.grad_scales.get(name, 1.0)
            if factor != 1:
                scale_gradient(graph, node, factor)
        new = [n for n in readable if readable[n] not in self.grad_scales]
        cuts, ancestors = cut_vertices(graph, values)
        # Only where an op with a rule or a calibrated region hands over a tensor:
        # inside a region, a correction would fight the region's own scale.
        cuts = [
            n
            for n in cuts
            if n.op == "call_function"
            and n.target in _OURS
            and n.target is not scale_bwd
        ]
        # A vertex's gradient depends on what is summed downstream of it (the
        # tokens of a broadcast conditioning vector): keyed by the shapes of
        # the graph's data inputs too, beyond their batch dimension.
        inputs = [
            n for n in graph.find_nodes(op="placeholder") if values.kind(n) is Kind.DATA
        ]
        seen: Counter[Any] = Counter()
        keys = {
            vertex: key_to_text(
                _capture_key(
                    module_path(vertex), _name(vertex), [vertex, *inputs], values, seen
                )
            )
            for vertex in cuts
        }
        if not new and all(key in self.cut_scales for key in keys.values()):
            # All measured at an earlier capture (or read from a checkpoint).
            known = {
                v: factor for v in cuts if (factor := self.cut_scales[keys[v]]) != 1
            }
            self._correct_cuts(graph, values, known)
            self._report_grad_scales()
            return
        measured = calibrate_gradients(gm, context, values, cuts)
        if isinstance(measured, str):
            logger.info("cannot calibrate gradients: %s", measured)
            self.grad_scales.update((readable[n], 1.0) for n in new)
            return
        position = {n: i for i, n in enumerate(graph.nodes)}
        corrections: dict[Node, float] = {}
        for vertex in reversed(cuts):
            stored = self.cut_scales.get(keys[vertex])
            if stored is not None:
                if stored != 1:
                    corrections[vertex] = stored
                continue
            rms = measured.vertices.get(vertex)
            if rms is None:
                continue
            # (judged after the corrections downstream: a gradient zero by
            # construction is tiny next to the unit-scaled ones around it)
            rms *= downstream_factor(corrections, ancestors, position[vertex])
            if rms < ZERO_GRADIENT:
                continue
            if not 1 / CUT_TOLERANCE <= rms <= CUT_TOLERANCE:
                corrections[vertex] = rounded(1 / rms)
        for vertex in cuts:
            self.cut_scales.setdefault(keys[vertex], corrections.get(vertex, 1.0))
        self._correct_cuts(graph, values, corrections)
        carried = compensate_parameters(
            graph, list(readable), corrections, ancestors, position
        )
        for node in new:
            factor = 1.0
            rms = measured.parameters.get(node)
            if rms is not None:
                rms *= carried.get(node, 1.0)
            if (
                rms is not None
                and rms > ZERO_GRADIENT
                and not (1 / PARAMETER_TOLERANCE <= rms <= PARAMETER_TOLERANCE)
            ):
                factor = rounded(1 / rms)
                scale_gradient(graph, node, factor)
                logger.info(
                    "unit scaling parameter gradient: %s (calibrated: x%g)",
                    readable[node],
                    factor,
                )
            self.grad_scales[readable[node]] = factor
        self._report_grad_scales()

    def _report_grad_scales(self) -> None:
        records = self.report.parameters
        for i, record in enumerate(records):
            if record.name in self.grad_scales:
                records[i] = dataclasses.replace(
                    record, grad_scale=self.grad_scales[record.name]
                )

    def _correct_cuts(
        self, graph: Graph, values: GraphValues, corrections: dict[Node, float]
    ) -> None:
        for vertex, factor in corrections.items():
            values.record_like(scale_gradient(graph, vertex, factor), vertex)
            logger.info(
                "unit scaling gradient: %s (calibrated at a cut vertex: x%g)",
                vertex,
                factor,
            )
            self.report.ops.append(
                OpRecord("gradient", "calibrated", module_path(vertex), f"x{factor:g}")
            )

    def _initialise_parameters(
        self, graph: Graph, values: GraphValues, context: CaptureContext
    ) -> dict[Node, str]:
        names = context.parameter_names
        stand_ins = fsdp_unsharded_parameters(context.module)
        placeholders = list(graph.find_nodes(op="placeholder"))
        params = {
            node: value
            for node, value in zip(placeholders, context.example_inputs, strict=False)
            if isinstance(value, nn.Parameter)
        }
        readable = {
            node: (names.get(id(p)) or [node.meta.get("source_name", node.name)])[0]
            for node, p in params.items()
        }
        roles = graph_roles(graph, values, readable)
        retagged = []
        for node, role in roles.items():
            aliases = names.get(id(params[node]), [readable[node]])
            record = self.report.tags.get(aliases[0])
            param = stand_ins.get(id(params[node]), params[node])
            if record is not None:
                new = tag_from_graph(param, record, role)
                if _LR_GROUP[new.mup_type] != _LR_GROUP[record.mup_type]:
                    retagged.append(f"{new.name} ({new.mup_type})")
                self.report.tags.update(dict.fromkeys(aliases, new))
            if any(a in self.initialised for a in aliases):
                done = "initialised before"
            elif param is not params[node]:
                raise RuntimeError(
                    f"unit_scale initialises {aliases[0]} at the model's first call, "
                    "but FSDP2 (fully_shard) sharded it before that call: what "
                    "the first call would write lands in a gathered copy and is "
                    "lost. Call the transformed model once on an example batch, "
                    "then shard it"
                )
            else:
                done = initialise(params[node], role)
                self.initialised.update(aliases)
                if done != "kept":
                    logger.info(
                        "initialising parameter: %s (%s, %s)",
                        readable[node],
                        role,
                        done,
                    )
            self.report.parameters.append(ParameterRecord(readable[node], role, done))
        if retagged:
            logger.warning(
                "unit_scale: the first call showed the u-μP type of %d parameters "
                "no layer declares: %s. An optimizer built before this call gave "
                "them the learning rate of their generic type; build it again",
                len(retagged),
                ", ".join(retagged),
            )
        return readable

    def _freeze_functorch_sections(
        self, graph: Graph, values: GraphValues
    ) -> set[Node]:
        """Code traced under ``vmap`` is left exactly as it is (its tensors carry
        batch levels a rewrite would break): its nodes become constants to every
        later stage, and the section is reported. Returns its nodes."""
        frozen: set[Node] = set()
        for section in functorch_sections(graph):
            frozen.update(section)
            ops = [n for n in section if not is_functorch_internal(n.target)]
            names = "+".join(dict.fromkeys(_name(n) for n in ops)) or "vmap"
            for node in section:
                values.kinds[node] = Kind.CONST
            anchor = ops[-1] if ops else section[-1]
            self.report.ops.append(
                OpRecord(
                    names,
                    "left as is",
                    module_path(anchor),
                    "code traced under vmap (e.g. associative_scan) is not rewritten",
                )
            )
        return frozen

    def __call__(self, gm: GraphModule, context: CaptureContext) -> GraphModule:
        graph = gm.graph
        report = self.report
        before = len(report.ops)
        functionalize_inplace(graph)
        _replace_functions(graph, self.replace, self.found)
        values = graph_values(
            gm,
            context.example_inputs,
            set(context.buffers) | self._constants_before(context),
        )
        frozen = self._freeze_functorch_sections(graph, values)
        for rule, node in rewrite_patterns(graph, values):
            _record(report, node, "analytic", f"recognised: {rule}")
        _replace_with_unit_scaled(graph, values, report)
        residuals = find_residuals(graph, values)
        self.residual_counts[id(gm)] = len(residuals)
        if self.residual_scaling is not None:
            # Branch i of this graph is branch ``before + i`` of the forward.
            before = sum(
                self.residual_counts.get(id(g), 0) for g, _ in context.graphs_before
            )
            total = max(self.branches or 0, before + len(residuals))
            tau = self.residual_scaling
            residuals = [
                dataclasses.replace(r, tau=tau(before + i, total))
                for i, r in enumerate(residuals)
            ]
        for residual in residuals:
            rewrite_residual(graph, residual, values)
            _record(report, residual.root, "residual", f"tau={residual.tau}")
        _unit_scale_adds(graph, values, report)
        readable = self._initialise_parameters(graph, values, context)
        scale_broadcast_gradients(graph, values)
        _calibrate_regions(gm, values, report, frozen, self.measured)
        placeholders = zip(
            graph.find_nodes(op="placeholder"), context.example_inputs, strict=False
        )
        model_inputs = {
            node
            for node, value in placeholders
            if id(value) in context.call_inputs and values.is_data(node)
        }
        unconstrain_consistently(graph, values)
        _unconstrain_inputs(graph, model_inputs)
        scale_direct_parameter_gradients(graph, values)
        self._calibrate_gradients(gm, values, context, readable)
        self.constant_outputs[id(gm)] = _constant_outputs(graph, values)
        write_to_config(context.module, encode(self.record()))
        left = [r for r in report.ops[before:] if r.how == "left as is"]
        if left:
            logger.warning(
                "unit_scale left %d op(s) of %s as they are, with neither a "
                "unit-scaling rule nor a calibrated scale: %s. Pass "
                "replace={op: unit_scaled_op} for these, or see "
                "model.unit_scale_report().",
                len(left),
                type(context.module).__name__,
                report.warning_text(left),
            )
        return gm


def _constant_outputs(graph: Graph, values: GraphValues) -> frozenset[int]:
    """Positions of the graph's outputs that are floating-point constants."""
    output = next(iter(graph.find_nodes(op="output")))
    returned = output.args[0] if isinstance(output.args[0], (tuple, list)) else ()
    return frozenset(
        i
        for i, node in enumerate(returned)
        if isinstance(node, Node)
        and values.kind(node) is Kind.CONST
        and (info := values.tensor(node)) is not None
        and info.is_float
    )


def unit_scale(
    module: M,
    replace: dict[Callable[..., Any], Any] | None = None,
    *,
    residual_scaling: str | Callable[[int, int], float] = "fixed",
    init_weights: bool | None = None,
) -> M:
    """Return a unit-scaled copy of ``module``.

    Traces ``module`` with TorchDynamo (recursing into submodules and functional
    calls) and rewrites each captured graph:

    #. **In-place ops** (``h += f(x)``, ``x.mul_(c)``, ``inplace=True``) become
       out-of-place, keeping torch's semantics (see ``transforms._inplace``).
    #. **User replacements**: calls to each key of ``replace`` become calls to its
       value (keys are kept opaque while tracing, so they appear as single calls).
    #. **Analytic rules**: every op with an equivalent in
       :mod:`unit_scaling.functional` is replaced by it.
    #. **Residual adds**: found by dependency analysis, including parallel
       branches and projection shortcuts, and replaced by ``U.residual_split`` /
       ``U.residual_add`` (``tau = 0.01`` if a branch contains attention, else
       ``0.5``; or u-μP's depth-dependent rule, see ``residual_scaling``). Other
       adds of two independent activations become ``U.add``.
    #. **Parameters** whose role only the graph shows (expert weights used
       through ``F.linear``, layer-scale gains, position tables) are initialised
       for unit scale, once, at the first capture.
    #. **Calibration**: connected ops with no rule (soft-capping, rotary
       embeddings, hand-written activations, selective scans...) are run on
       unit-normal stand-ins and their outputs rescaled by the measured factor.
    #. **Unconstraining**: every op after the last residual add gets independent
       gradient scales (``constraint=None``).
    #. **Parameter gradients** of parameters used directly in activation ops are
       scaled by their broadcast expansion.

    ``Linear``, ``Embedding``, convolution and ``MultiheadAttention`` weights are
    rescaled to unit standard deviation and their biases zeroed when
    ``unit_scale`` is called — unless the weights were trained unit-scaled (see
    ``init_weights``).

    **Checkpoints.** The result's ``state_dict()`` carries a record of what
    ``unit_scale`` measured (calibrated scales, gradient corrections, which
    parameters it initialised) in its metadata, under ``"unit_scaling"``; a
    Hugging Face model also carries it in ``config.unit_scaling``, which
    ``save_pretrained`` writes to ``config.json``. Loading such a state dict into
    a ``unit_scale`` output (``load_state_dict``, or ``torch.load(...,
    weights_only=True)`` first: the metadata survives), or calling
    ``unit_scale`` on a model loaded by ``from_pretrained``, gives back the same
    function: the trained weights are kept and the recorded scales reused. For
    ``torch.distributed.checkpoint``, which keeps no metadata, save
    :func:`checkpoint_record` beside the tensors and give it to
    :func:`load_checkpoint_record` after loading them.

    Every parameter of the result carries **u-μP tags** (``mup_type``,
    ``mup_scaling_depth``), so ``uu.optim`` optimizers take its parameters as
    they take a native ``uu`` model's: from the layer that owns it (weights,
    biases, norm gains, embeddings, the readout after the repeated blocks; a
    depth for parameters inside them), else from its use in the graph at the
    first call, else by rank (matrix: weight, vector: bias), listed in
    ``unit_scale_report().tags`` (see ``unit_scaling.transforms._tags``).

    Known library constructs are first rewritten into the torch functions they
    compute (Hugging Face's ``Conv1D``, tanh GELU and RMSNorm classes), validated
    numerically.

    What was done to every op and parameter is in ``model.unit_scale_report()``
    (a :class:`UnitScaleReport`); one WARNING names the ops left as they are.
    The input module is never modified; the result has independent parameters.
    Decisions are logged at INFO on this module's logger. Composes with the other
    transforms in any order (unit scaling always runs before quantisation), and
    the result also runs under plain ``torch.compile``.

    Args:
        module: the module to unit-scale.
        replace: functions to substitute, ``{original: replacement}``. A key may
            also be an ``nn.Module`` subclass, whose instances then call the
            replacement (with the module's forward arguments) instead.
        residual_scaling: the weight ``tau`` of each residual branch: ``"fixed"``
            (the default: 0.01 for attention branches, else 0.5), ``"u-μP"``
            (:func:`unit_scaling.transformer_residual_scaling_rule`'s
            depth-dependent weights) or a rule ``tau(index, branches)`` as
            :class:`unit_scaling.TransformerStack` takes. Branches are counted in
            each captured graph, in order.
        init_weights: whether to initialise the weights for unit scale.
            ``None`` (the default): yes, except for a model that records it was
            trained unit-scaled (a Hugging Face config with a ``unit_scaling``
            record: a checkpoint of a ``unit_scale`` output), whose weights and
            recorded scales are kept, and parameters that already carry u-μP tags
            (those of ``uu`` modules), which are unit-scaled by construction.
            ``True``: initialise every weight (a record's scales are ignored).
            ``False``: keep every weight as it is. The choice is logged.

    Example::

        >>> model = unit_scale(nn.Sequential(nn.Linear(64, 64), nn.GELU()))
        >>> model(torch.randn(8, 64)).shape
        torch.Size([8, 64])
    """
    replace = dict(replace or {})
    if not isinstance(module, nn.Module):
        raise TypeError(f"unit_scale expects an nn.Module, got {type(module).__name__}")
    rule = _residual_rule(residual_scaling)
    if init_weights is not None and not isinstance(init_weights, bool):
        raise TypeError(
            "unit_scale: init_weights must be None, True or False, got "
            f"{init_weights!r}"
        )
    found = record_in_config(module)
    where = f"{type(module).__name__}.config.{KEY}"
    record = (
        decode(found, where) if found is not None and init_weights is not True else None
    )
    for key, value in replace.items():
        if not callable(key) or not callable(value):
            raise TypeError(
                f"replace must map callables to callables, got {key!r}: {value!r}"
            )
    module_replacements = {
        k: v
        for k, v in replace.items()
        if isinstance(k, type) and issubclass(k, nn.Module)
    }
    function_replacements = {
        k: v for k, v in replace.items() if k not in module_replacements
    }

    def check_replacements(state: Any) -> None:
        unit_pass = state.pass_of(_UnitScalingPass)
        for key in function_replacements.keys() - unit_pass.found:
            warnings.warn(
                f"unit_scale: replace key {getattr(key, '__qualname__', key)!r} was "
                "never called in the traced forward pass, so nothing was replaced "
                "(is it the function the model calls, e.g. the same object?)",
                UserWarning,
                stacklevel=2,
            )

    transform = Transform(
        name="unit_scale",
        place=Place.REWRITE,
        graph_pass=_UnitScalingPass(
            function_replacements, rule, residual_name=_residual_name(residual_scaling)
        ),
        non_recurse=(
            *UNIT_SCALED_FUNCTIONS,
            *function_replacements,
            *opaque_library_functions(module),
            *opaque_rewrite_functions(),
        ),
        after_first_call=(
            check_replacements,
            lambda state: state.pass_of(_UnitScalingPass).count_branches(state),
        ),
        after_call=(
            functools.partial(_watch_output_gradient, name=type(module).__name__),
            lambda state, output: state.pass_of(_UnitScalingPass).check_shared_graphs(
                state, output
            ),
        ),
        attributes=(("unit_scale_report", _ReportOf),),
    )
    result = apply_transform(module, transform)
    state = transform_state(result)
    assert state is not None
    matched = rewrite_library_modules(result, module_replacements)
    for cls in module_replacements.keys() - matched:
        warnings.warn(
            f"unit_scale: replace key {cls.__qualname__} matched no submodule",
            UserWarning,
            stacklevel=2,
        )
    own_pass = state.pass_of(_UnitScalingPass)
    params = list(result.named_parameters(remove_duplicate=False))
    if record is not None:
        own_pass.restore(record, where)
    keep = _weights_to_keep(params, init_weights, record, type(module).__name__)
    done = unit_init_layers(result, skip=keep)
    records = tag_structure(result)
    for name, p in params:
        own_pass.report.tags[name] = records[id(p)]
    own_pass.initialised.update(
        name for name, p in params if id(p) in done or id(p) in keep
    )
    result.register_state_dict_post_hook(_save_record)  # type: ignore[no-untyped-call]
    result.register_load_state_dict_pre_hook(_load_record)  # type: ignore[no-untyped-call]
    return result


def _weights_to_keep(
    params: list[tuple[str, nn.Parameter]],
    init_weights: bool | None,
    record: Record | None,
    model: str,
) -> set[int]:
    """Ids of the parameters ``unit_scale`` leaves as they are (see its
    ``init_weights``), with the choice logged."""
    if init_weights is True:
        logger.info("unit_scale: initialising every weight (init_weights=True)")
        return set()
    if init_weights is False or record is not None:
        if record is not None:
            logger.warning(
                "unit_scale: %s records that it was trained unit-scaled (its "
                "config's %r): keeping its weights and the recorded scales (pass "
                "init_weights=True to initialise it again)",
                model,
                KEY,
            )
        else:
            logger.info("unit_scale: keeping every weight (init_weights=False)")
        return {id(p) for _, p in params}
    tagged = {id(p) for _, p in params if getattr(p, "mup_type", None) is not None}
    if tagged:
        logger.info(
            "unit_scale: keeping %d parameter(s) that carry u-μP tags (unit-scaled "
            "by construction)",
            len(tagged),
        )
    return tagged


def _save_record(
    module: nn.Module, state_dict: dict[str, Any], prefix: str, metadata: Any
) -> None:
    """State-dict hook: the record of what ``unit_scale`` measured, in the
    state dict's metadata."""
    state = transform_state(module)
    unit_pass = state.pass_of(_UnitScalingPass) if state is not None else None
    if unit_pass is not None:
        metadata[KEY] = encode(unit_pass.record())


def _load_record(
    module: nn.Module,
    state_dict: dict[str, Any],
    prefix: str,
    metadata: Any,
    *args: Any,
) -> None:
    """Load-state-dict hook: take the record of the state dict being loaded
    (which says which of its parameters were initialised, and what was
    measured), and capture again at the next call if this model has run
    already. A state dict without one (``torch.distributed.checkpoint`` drops
    the metadata) holds deliberate weights all the same: none of them is
    initialised again."""
    found = metadata.get(KEY) if isinstance(metadata, dict) else None
    if found is not None:
        load_checkpoint_record(module, found)
        return
    state = transform_state(module)
    unit_pass = state.pass_of(_UnitScalingPass) if state is not None else None
    if unit_pass is not None:
        unit_pass.initialised.update(
            key[len(prefix) :] for key in state_dict if key.startswith(prefix)
        )


def _unit_pass(module: nn.Module, op: str) -> _UnitScalingPass:
    if not isinstance(module, nn.Module):
        raise TypeError(f"{op}: expected an nn.Module, got {type(module).__name__}")
    state = transform_state(module)
    unit_pass = state.pass_of(_UnitScalingPass) if state is not None else None
    if unit_pass is None:
        raise ValueError(
            f"{op}: {type(module).__name__} was not made by unit_scale (a native "
            "uu model needs no record: its state dict is all there is)"
        )
    assert isinstance(unit_pass, _UnitScalingPass)
    return unit_pass


def checkpoint_record(module: nn.Module) -> dict[str, Any]:
    """What ``unit_scale`` measured for ``module``, as plain JSON data.

    ``module.state_dict()`` carries it in its metadata already (and a Hugging
    Face model in ``config.unit_scaling``); this is for checkpoints that keep
    no metadata, such as ``torch.distributed.checkpoint``: save it beside the
    state dict (as JSON text there: ``json.dumps(checkpoint_record(model))``,
    which DCP stores as one object) and give it to :func:`load_checkpoint_record`
    after loading.

    Example::

        >>> model = unit_scale(nn.Sequential(nn.Linear(16, 16), nn.GELU()))
        >>> _ = model(torch.randn(4, 16))
        >>> checkpoint_record(model)["format"]
        1
    """
    return encode(_unit_pass(module, "checkpoint_record").record())


def load_checkpoint_record(module: nn.Module, record: dict[str, Any]) -> None:
    """Give ``module`` (a ``unit_scale`` output holding trained weights) the
    ``record`` :func:`checkpoint_record` made: its parameters are not
    initialised again and the recorded scales are reused, so it computes the
    function the checkpointed model computed. A model that has run already
    captures its graphs again at its next call.

    Raises:
        ValueError: if ``module`` is not a ``unit_scale`` output, if ``record``
            is not a record, or if it was made with another ``residual_scaling``.

    Example::

        >>> trained = unit_scale(nn.Sequential(nn.Linear(16, 16), nn.GELU()))
        >>> x = torch.randn(4, 16)
        >>> y = trained(x)
        >>> again = unit_scale(nn.Sequential(nn.Linear(16, 16), nn.GELU()))
        >>> _ = again.load_state_dict(dict(trained.state_dict()))  # no metadata
        >>> load_checkpoint_record(again, checkpoint_record(trained))
        >>> torch.equal(again(x), y)
        True
    """
    unit_pass = _unit_pass(module, "load_checkpoint_record")
    unit_pass.restore(decode(record, "load_checkpoint_record"), "the record")
    state = transform_state(module)
    if state is not None and state.calls:
        recapture(module)


def _residual_name(residual_scaling: str | Callable[[int, int], float]) -> str:
    """How a checkpoint's record names ``residual_scaling``."""
    if callable(residual_scaling):
        return "custom"
    return "u-μP" if residual_scaling == "u-muP" else residual_scaling


def _residual_rule(
    residual_scaling: str | Callable[[int, int], float],
) -> Callable[[int, int], float] | None:
    """The ``tau(index, branches)`` rule of ``residual_scaling``; ``None`` for
    the fixed weights."""
    if callable(residual_scaling):
        return residual_scaling
    if residual_scaling == "fixed":
        return None
    if residual_scaling in ("u-μP", "u-muP"):
        return transformer_residual_scaling_rule()
    raise ValueError(
        "unit_scale: residual_scaling must be 'fixed', 'u-μP' or a function "
        f"tau(index, branches), got {residual_scaling!r}"
    )


# How far from unit RMS the gradient arriving at the model's output may be
# before unit_scale warns (see _watch_output_gradient).
OUTPUT_GRADIENT_TOLERANCE = 8.0


def _watch_output_gradient(state: Any, output: Any, name: str = "model") -> None:
    """Check, once, the gradient that reaches the model's output in the first
    backward pass: a unit-scaled model assumes it is unit-scaled too. The usual
    culprit is a loss computed outside the model: a mean-reduced cross-entropy
    over N tokens divides every gradient by about N, pushing the whole backward
    pass below FP8's range. One check, one host sync, on the first gradient
    that arrives."""
    if state.flags.get("output_gradient_watched"):
        return
    tensors = [
        t
        for t in pytree.tree_leaves(output)
        if isinstance(t, Tensor) and t.is_floating_point() and t.requires_grad
    ]
    if not tensors:
        return
    state.flags["output_gradient_watched"] = True
    handles: list[Any] = []

    def check(grad: Tensor) -> None:
        if state.flags.get("output_gradient_checked"):
            return
        state.flags["output_gradient_checked"] = True
        for handle in handles:
            handle.remove()
        rms = float(grad.detach().float().square().mean().sqrt())
        if (
            rms == 0
            or 1 / OUTPUT_GRADIENT_TOLERANCE <= rms <= OUTPUT_GRADIENT_TOLERANCE
        ):
            return
        factor, where = (1 / rms, "below") if rms < 1 else (rms, "above")
        logger.warning(
            "The gradient reaching the output of the unit-scaled %s in its first "
            "backward pass has RMS %.3g, %.3gx %s unit scale, and every gradient "
            "inside the model inherits that factor (far enough off, they leave FP8's "
            "range). A loss computed outside the model is the usual cause: a "
            "mean-reduced cross-entropy over N tokens divides the gradient by about "
            "N. Compute the loss inside the model (for a Hugging Face model, pass "
            "labels=...), or use the unit-scaled loss "
            "unit_scaling.functional.cross_entropy(logits, targets), whose gradient "
            "is unit-scaled.",
            name,
            rms,
            factor,
            where,
        )

    handles.extend(
        t.register_hook(check)  # type: ignore[no-untyped-call]
        for t in tensors
    )


class _ReportOf:
    """``module.unit_scale_report()``: bound to the module's own transform state."""

    def __init__(self, state: Any) -> None:
        self._state = state

    def __call__(self) -> UnitScaleReport:
        """What ``unit_scale`` did to each op and parameter of the graphs captured
        so far (empty before the first call)."""
        unit_pass = self._state.pass_of(_UnitScalingPass)
        assert unit_pass is not None
        report: UnitScaleReport = unit_pass.report
        return report

    def __deepcopy__(self, memo: dict[int, Any]) -> _ReportOf:
        import copy

        return _ReportOf(copy.deepcopy(self._state, memo))


def unit_scale_report(module: nn.Module) -> UnitScaleReport:
    """The :class:`UnitScaleReport` of a module returned by :func:`unit_scale`.

    Raises:
        TypeError: if ``module`` was not transformed by :func:`unit_scale`.

    Example::

        >>> model = unit_scale(nn.Linear(8, 8))
        >>> _ = model(torch.randn(2, 8))
        >>> unit_scale_report(model).counts()
        {'analytic': 1}
    """
    state = transform_state(module) if isinstance(module, nn.Module) else None
    unit_pass = state.pass_of(_UnitScalingPass) if state is not None else None
    if unit_pass is None:
        raise TypeError(
            "unit_scale_report expects a module returned by unit_scale(...), got "
            f"{type(module).__name__}"
        )
    report: UnitScaleReport = unit_pass.report
    return report
