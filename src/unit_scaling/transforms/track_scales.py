"""``track_scales``: record the scale of every tensor in the forward and backward pass.

Statistics are computed on the tensor's device as it is produced (and on its
gradient as backpropagation reaches it, through a tensor hook), kept as small
device tensors, and read back to the host in one transfer when
``scales_graph()`` is called. Tracking saves no tensor for the backward pass, so it
holds no activation longer than the untracked model does.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import operator
import re
import weakref
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, TypeVar

import torch
from torch import Tensor, nn
from torch.fx import Graph, GraphModule, Node
from torch.fx.node import Target, map_arg

from .. import functional as U
from .._kernels import CompiledKernels
from ..formats import FP8_E4M3, FP8_E5M2
from ._dynamo import (
    StatefulPass,
    TransformState,
    _Capture,
    apply_transform,
    bind_attribute,
    transform_state,
)
from ._graph import example_value
from .unit_scale import UNIT_SCALED_FUNCTIONS, _order_transforms

__all__ = [
    "Metrics",
    "prune_non_float_tensors",
    "prune_same_scale_tensors",
    "prune_selected_nodes",
    "track_scales",
]

logger = logging.getLogger(__name__)
M = TypeVar("M", bound=nn.Module)

# Rounding to nearest flushes to zero any magnitude up to half the smallest
# subnormal (the tie rounds to the even encoding, zero).
_E4M3_MAX, _E4M3_FLUSH = (
    FP8_E4M3.max_absolute_value,
    FP8_E4M3.min_absolute_subnormal / 2,
)
_E5M2_MAX, _E5M2_FLUSH = (
    FP8_E5M2.max_absolute_value,
    FP8_E5M2.min_absolute_subnormal / 2,
)


class Metrics:
    """Scale statistics of one tensor: ``fwd`` (its value), ``bwd`` (its gradient).

    ``bwd`` is ``None`` until a backward pass reaches the tensor.
    """

    @dataclasses.dataclass
    class Data:
        """Statistics of one tensor."""

        mean_abs: float
        abs_mean: float
        std: float
        abs_max: float
        abs_min: float
        numel: int
        e4m3_overflow: float = 0.0
        e4m3_underflow: float = 0.0
        e5m2_overflow: float = 0.0
        e5m2_underflow: float = 0.0

        @staticmethod
        def from_tensor(t: Tensor) -> Metrics.Data:
            """Compute the statistics of ``t`` (synchronises with the device)."""
            return Metrics.Data.from_values(_statistics(t).tolist(), t.numel())

        @staticmethod
        def from_values(values: list[float], numel: int) -> Metrics.Data:
            return Metrics.Data(
                values[0],
                values[1],
                values[2],
                values[3],
                values[4],
                numel,
                *values[5:9],
            )

    _FULL_NAMES: ClassVar[dict[str, str]] = {
        "mean_abs": "mean absolute value",
        "abs_mean": "absolute mean value",
        "std": "standard deviation",
        "abs_max": "absolute maximum",
        "abs_min": "absolute minimum",
        "numel": "number of elements",
        "e4m3_overflow": "fraction above the E4M3 maximum",
        "e4m3_underflow": "fraction flushed to zero in E4M3",
        "e5m2_overflow": "fraction above the E5M2 maximum",
        "e5m2_underflow": "fraction flushed to zero in E5M2",
    }

    def __init__(self, fwd: Metrics.Data, bwd: Metrics.Data | None = None) -> None:
        self.fwd = fwd
        self.bwd = bwd

    def __repr__(self) -> str:
        return f"Metrics(fwd={self.fwd}, bwd={self.bwd})"

    @staticmethod
    def names() -> list[str]:
        """Field names of :class:`Metrics.Data`."""
        return [f.name for f in dataclasses.fields(Metrics.Data)]

    @staticmethod
    def full_names() -> list[str]:
        """Readable names of :class:`Metrics.Data` fields."""
        return [Metrics._FULL_NAMES[n] for n in Metrics.names()]

    @staticmethod
    def get_full_name(name: str) -> str:
        """The readable name of one field, e.g. ``"mean_abs"``."""
        if name not in Metrics._FULL_NAMES:
            raise ValueError(
                f"unknown metric {name!r}; expected one of {Metrics.names()}"
            )
        return Metrics._FULL_NAMES[name]


_N_STATS = 9
_KERNELS = CompiledKernels("unit_scaling.transforms.track_scales")


def _statistics_kernel(x: Tensor, correction: int = 1) -> Tensor:
    """All nine statistics of a flat float32 tensor (compiled: one fused kernel).

    Means and the standard deviation are over the finite elements, so that a
    mask holding ``-inf`` still reports the scale of its finite part; the
    maximum shows infinities, and they count as FP8 overflow. NaN is ignored.
    A tensor with no finite element at all reports its means and standard
    deviation as ``inf`` (or NaN when it holds NaN), never a misleading 0.
    """
    finite = torch.isfinite(x)
    count = finite.sum()
    values = torch.where(finite, x, 0.0)
    mean = values.sum() / count.clamp_min(1)
    deviation = torch.where(finite, x - mean, 0.0)
    var = deviation.square().sum() / (count - correction).clamp_min(1)
    a = x.abs()
    is_nan = torch.isnan(x)
    nonzero = a > 0
    n = x.numel()
    none_finite = count == 0
    fill = a.amax()  # inf, or NaN if any element is NaN
    return torch.stack(
        [
            torch.where(none_finite, fill, values.abs().sum() / count.clamp_min(1)),
            torch.where(none_finite, fill, mean.abs()),
            torch.where(none_finite, fill, var.sqrt()),
            torch.where(is_nan, 0.0, a).amax(),
            torch.where(is_nan, torch.inf, a).amin(),
            (a > _E4M3_MAX).sum() / n,
            (nonzero & (a <= _E4M3_FLUSH)).sum() / n,
            (a > _E5M2_MAX).sum() / n,
            (nonzero & (a <= _E5M2_FLUSH)).sum() / n,
        ]
    )


@torch.no_grad()
def _statistics(t: Tensor) -> Tensor:
    """The nine statistics of ``t`` as one float32 tensor on ``t``'s device.

    Empty tensors give zeros; a one-element tensor has standard deviation 0.
    """
    x = t.detach().reshape(-1).float()
    if x.numel() == 0:
        return x.new_zeros(_N_STATS)
    if x.numel() == 1:
        return _statistics_kernel(x, correction=0)
    return _KERNELS.run(_statistics_kernel, _statistics_kernel, x.contiguous())


# Ops whose output holds exactly the input's elements (rearranged).
_VIEW_METHODS = {
    "view",
    "reshape",
    "transpose",
    "permute",
    "contiguous",
    "flatten",
    "unflatten",
    "squeeze",
    "unsqueeze",
    "t",
    "view_as",
    "reshape_as",
    "clone",
    "detach",
}
_VIEW_FUNCTIONS = {
    torch.reshape,
    torch.flatten,
    torch.transpose,
    torch.permute,
    torch.squeeze,
    torch.unsqueeze,
    torch.t,
    torch.clone,
}


def _value_source(node: Node) -> Node | None:
    """The input whose elements ``node`` holds, rearranged (views, copies and the
    two outputs of ``U.residual_split``); ``None`` for any other op."""
    is_view = (node.op == "call_method" and node.target in _VIEW_METHODS) or (
        node.op == "call_function" and node.target in _VIEW_FUNCTIONS
    )
    if node.op == "call_function" and node.target is operator.getitem:
        parent = node.args[0]
        is_view = isinstance(parent, Node) and parent.target is U.residual_split
        node = parent if is_view else node  # type: ignore[assignment]
    if not is_view or not node.args or not isinstance(node.args[0], Node):
        return None
    source = node.args[0]
    return source if _is_float(source) else None


def _is_float(node: Node) -> bool:
    value = example_value(node)
    return isinstance(value, Tensor) and value.is_floating_point()


@dataclasses.dataclass
class _TrackedGraph:
    """A snapshot of one transformed graph and where each node's statistics are."""

    graph: Graph
    # node name -> name of the node whose recorded statistics describe it
    fwd_source: dict[str, str]
    bwd_source: dict[str, str]


class _TrackingPass(StatefulPass):
    """Inserts an observer after every floating-point node, and keeps what the
    observers record: on-device statistics per node, for forward and backward.

    A node that only rearranges another's elements shares that node's forward
    statistics; it also shares its gradient's statistics when it is that node's
    only user (otherwise their gradients differ).
    """

    def __init__(self) -> None:
        self.fwd: dict[tuple[int, str], tuple[Tensor, int]] = {}
        self.bwd: dict[tuple[int, str], tuple[Tensor, int]] = {}
        self.graphs: dict[int, _TrackedGraph] = {}
        # Leaf tensors (parameters) outlive a step: hook each one only once.
        self._hooked: dict[tuple[int, str], weakref.ref[Tensor]] = {}

    def fresh(self) -> _TrackingPass:
        return _TrackingPass()

    def _observer(self, capture_id: int) -> Callable[[Any, str, bool, bool], None]:
        def observe(value: Any, name: str, forward: bool, backward: bool) -> None:
            if not (isinstance(value, Tensor) and value.is_floating_point()):
                return
            key = (capture_id, name)
            if forward:
                self.fwd[key] = (_statistics(value), value.numel())
            if backward and value.requires_grad:
                self._hook(key, value)

        return observe

    def _hook(self, key: tuple[int, str], value: Tensor) -> None:
        if value.is_leaf:
            hooked = self._hooked.get(key)
            if hooked is not None and hooked() is value:
                return
            self._hooked[key] = weakref.ref(value)

        def record_grad(grad: Tensor) -> None:
            self.bwd[key] = (_statistics(grad), grad.numel())

        value.register_hook(record_grad)  # type: ignore[no-untyped-call]

    def __call__(self, gm: GraphModule) -> GraphModule:
        capture_id = len(self.graphs)
        snapshot = Graph()
        snapshot.output(snapshot.graph_copy(gm.graph, {}))
        fwd_source: dict[str, str] = {}
        bwd_source: dict[str, str] = {}
        observe = self._observer(capture_id)
        for node in list(gm.graph.nodes):
            if node.op == "output" or not _is_float(node):
                continue
            source = _value_source(node)
            forward = backward = True
            fwd_source[node.name] = bwd_source[node.name] = node.name
            if source is not None:
                forward = False
                fwd_source[node.name] = fwd_source.get(source.name, source.name)
                if len(source.users) == 1:
                    backward = False
                    bwd_source[node.name] = bwd_source.get(source.name, source.name)
            logger.info("adding tracking to node: %s", node)
            with gm.graph.inserting_after(node):
                gm.graph.call_function(observe, (node, node.name, forward, backward))
        self.graphs[capture_id] = _TrackedGraph(snapshot, fwd_source, bwd_source)
        return gm


def _clean_name(name: str) -> str:
    """``l_self_modules_h_modules_0_parameters_weight_`` -> ``h.0.weight``."""
    name = re.sub(r"^[lL]_+(self_+)?", "", name).strip("_")
    name = re.sub(r"(^|_)(modules|parameters|buffers)_", ".", name)
    return name.strip(".")


def _read_statistics(
    recorded: dict[tuple[int, str], tuple[Tensor, int]],
) -> dict[tuple[int, str], Metrics.Data]:
    """All recorded statistics, copied to the host in one transfer."""
    if not recorded:
        return {}
    values = torch.stack([stats.cpu() for stats, _ in recorded.values()]).tolist()
    return {
        key: Metrics.Data.from_values(v, numel)
        for (key, (_, numel)), v in zip(recorded.items(), values, strict=True)
    }


def _scales_graph(
    recorder: _TrackingPass, captures: list[_Capture], all_captures: list[_Capture]
) -> Graph:
    """One graph holding every tracked tensor of the last forward pass."""
    fwd, bwd = _read_statistics(recorder.fwd), _read_statistics(recorder.bwd)
    merged = Graph()
    outputs: list[Any] = []
    for capture in captures:
        capture_id = all_captures.index(capture)
        tracked = recorder.graphs[capture_id]
        value_map: dict[Node, Node] = {}
        out = merged.graph_copy(tracked.graph, value_map)
        outputs.append(out)
        for old, new in value_map.items():
            value = example_value(old)
            is_float = isinstance(value, Tensor) and value.is_floating_point()
            new.meta["clean_name"] = old.meta.get("source_name") or _clean_name(
                old.name
            )
            new.meta["outputs_float_tensor"] = is_float
            new.meta["requires_grad"] = (
                isinstance(value, nn.Parameter) and value.requires_grad
            )
            fwd_key = (capture_id, tracked.fwd_source.get(old.name, old.name))
            bwd_key = (capture_id, tracked.bwd_source.get(old.name, old.name))
            if is_float and fwd_key in fwd:
                new.meta["metrics"] = Metrics(fwd[fwd_key], bwd.get(bwd_key))
    merged.output(tuple(outputs) if len(outputs) != 1 else outputs[0])
    return merged


def _make_inputs_require_grad(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, Tensor) and value.is_floating_point() and value.is_leaf:
            value.requires_grad_()


def track_scales(module: M) -> M:
    """Return a copy of ``module`` that records the scale of every tensor it uses.

    After a forward (and optionally backward) pass, ``model.scales_graph()``
    returns a :class:`torch.fx.Graph` whose floating-point nodes carry
    ``meta["metrics"]`` (:class:`Metrics`, with ``.fwd`` and ``.bwd``
    statistics), ``meta["clean_name"]``, ``meta["outputs_float_tensor"]`` and
    ``meta["requires_grad"]``. Beyond the scale statistics, each
    :class:`Metrics.Data` holds the fractions of elements that would overflow or
    flush to zero in FP8 E4M3 and E5M2. Where TorchDynamo breaks the forward into
    several graphs, all of them are tracked and merged.

    Floating-point tensor inputs get ``requires_grad_()`` so that their gradients
    are tracked too. Statistics stay on the device until ``scales_graph()`` reads
    them in one transfer. Tracking is always applied last, and runs eagerly.

    Example::

        >>> model = track_scales(nn.Sequential(nn.Linear(8, 8), nn.ReLU()))
        >>> model(torch.randn(4, 8)).sum().backward()
        >>> graph = model.scales_graph()
        >>> [n.meta["clean_name"] for n in graph.nodes if "metrics" in n.meta][:1]
        ['input']
    """
    previous = transform_state(module) if isinstance(module, nn.Module) else None
    tracked = apply_transform(
        module,
        "track_scales",
        _TrackingPass(),
        non_recurse=UNIT_SCALED_FUNCTIONS,
        order=_order_transforms,
    )
    state = transform_state(tracked)
    assert state is not None
    if previous is not None and previous.executor is not None:
        logger.info(
            "track_scales runs the model eagerly: dropping %s", previous.executor_name
        )
    state.executor = None
    state.before_call.append(_make_inputs_require_grad)
    bind_attribute(tracked, "scales_graph", _ScalesGraph)
    return tracked


class _ScalesGraph:
    """``module.scales_graph()``: bound to the module's own transform state."""

    def __init__(self, state: TransformState) -> None:
        self._state = state

    def __call__(self) -> Graph:
        """The graph of the last forward pass, every tracked tensor annotated."""
        state = self._state
        if not state.graphs_run_in_call:
            raise RuntimeError(
                "scales_graph() needs a forward pass of the tracked module first"
            )
        tracking = state.pass_of(_TrackingPass)
        return _scales_graph(tracking, state.graphs_run_in_call, state.captures)

    def __deepcopy__(self, memo: dict[int, Any]) -> _ScalesGraph:
        # The module's state is copied first (it is set before this attribute).
        return _ScalesGraph(copy.deepcopy(self._state, memo))


def _float_args(args: Iterable[Any]) -> list[Node]:
    return [
        a
        for a in args
        if isinstance(a, Node) and a.meta.get("outputs_float_tensor", False)
    ]


def _require_tracked(graph: Graph) -> None:
    if not any("clean_name" in n.meta for n in graph.nodes):
        raise ValueError(
            "the graph must come from `model.scales_graph()` of a module wrapped "
            "with unit_scaling.transforms.track_scales; other FX graphs lack the "
            "metadata that pruning relies on"
        )


def _remove(graph: Graph, node: Node, replacement: Node | None) -> None:
    """Erase ``node``, pointing its users at ``replacement`` (possibly ``None``)."""
    for user in list(node.users):
        user.args = map_arg(user.args, lambda n: replacement if n is node else n)
        user.kwargs = map_arg(user.kwargs, lambda n: replacement if n is node else n)
    graph.erase_node(node)


def prune_non_float_tensors(graph: Graph) -> Graph:
    """A copy of ``graph`` without the nodes that don't output floating-point tensors.

    Users of a removed node are rewired to its only floating-point input, if it
    has exactly one (else to ``None``).
    """
    _require_tracked(graph)
    graph = _copy(graph)
    for node in list(graph.nodes):
        if node.op == "output" or node.meta.get("outputs_float_tensor", False):
            continue
        inputs = _float_args(node.all_input_nodes)
        logger.info("pruning non-float node: %s", node)
        _remove(graph, node, inputs[0] if len(inputs) == 1 else None)
    return graph


def _same_scale(a: Metrics, b: Metrics, rtol: float) -> bool:
    def close(x: Metrics.Data | None, y: Metrics.Data | None) -> bool:
        if x is None or y is None:
            return x is None and y is None
        return math.isclose(x.mean_abs, y.mean_abs, rel_tol=rtol)

    return close(a.fwd, b.fwd) and close(a.bwd, b.bwd)


def prune_same_scale_tensors(graph: Graph, rtol: float = 2**-16) -> Graph:
    """A copy of ``graph`` without nodes that keep the scale of their only float input.

    Removes uninformative nodes such as reshapes. A node with several
    floating-point inputs is never removed. ``rtol`` is the relative change of
    ``mean_abs`` (forward and backward) below which the scale counts as the same.
    """
    _require_tracked(graph)
    graph = _copy(graph)
    for node in list(graph.nodes):
        metrics = node.meta.get("metrics")
        inputs = _float_args(node.all_input_nodes)
        if metrics is None or len(inputs) != 1:
            continue
        source = inputs[0].meta.get("metrics")
        if source is not None and _same_scale(metrics, source, rtol):
            logger.info("pruning same-scale node: %s", node)
            _remove(graph, node, inputs[0])
    return graph


def prune_selected_nodes(graph: Graph, targets: Iterable[Target]) -> Graph:
    """A copy of ``graph`` without the nodes calling any of ``targets``."""
    targets = set(targets)
    graph = _copy(graph)
    for node in list(graph.nodes):
        if node.op != "output" and node.target in targets:
            logger.info("pruning node: %s", node)
            inputs = _float_args(node.all_input_nodes)
            _remove(graph, node, inputs[0] if len(inputs) == 1 else None)
    return graph


def _copy(graph: Graph) -> Graph:
    new = Graph()
    value_map: dict[Node, Node] = {}
    out = new.graph_copy(graph, value_map)
    new.output(out)
    return new
