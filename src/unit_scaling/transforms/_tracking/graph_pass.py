"""The tracking pass: observers after every floating-point node of a captured
graph, and the on-device statistics they record, forward and backward."""

from __future__ import annotations

import dataclasses
import logging
import operator
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.fx import Graph, GraphModule, Node

from ... import functional as U
from ..._kernels import in_memory
from ..._torch_internals import is_functorch_wrapped_tensor
from ...formats import BlockFormat
from ...formats._statistics import raw_quantisation_statistics
from ...scale import scale_bwd
from .._capture.engine import StatefulPass
from .._capture.graph import SAME_ELEMENTS, example_value
from .._capture.targets import broadcast_gradient, calibrated_scale, repeated_gradient
from .statistics import raw_statistics, row_layout

__all__ = ["Key", "Record", "TrackingPass", "is_tracked_value"]

logger = logging.getLogger("unit_scaling.transforms.track_scales")


def _value_source(node: Node) -> Node | None:
    """The input whose elements ``node`` holds, rearranged (views, copies and the
    two outputs of ``U.residual_split``); ``None`` for any other op."""
    is_view = node in SAME_ELEMENTS
    if node.op == "call_function" and node.target is operator.getitem:
        parent = node.args[0]
        is_view = isinstance(parent, Node) and parent.target is U.residual_split
        node = parent if is_view else node  # type: ignore[assignment]
    if not is_view or not node.args or not isinstance(node.args[0], Node):
        return None
    source = node.args[0]
    return source if _is_float(source) else None


def _is_float(node: Node) -> bool:
    return is_tracked_value(example_value(node))


def is_tracked_value(value: Any) -> bool:
    """A floating-point tensor of the program itself.

    Inside code that Dynamo traced under ``vmap`` (or ``torch.func.grad``),
    values are functorch wrappers holding one sample of a batch; their
    statistics are not those of any tensor of the program, and computing them
    would run (and record) batched tensors. The regions' outputs, plain tensors
    again, are tracked.
    """
    return (
        isinstance(value, Tensor)
        and value.is_floating_point()
        and not is_functorch_wrapped_tensor(value)
    )


@dataclasses.dataclass
class _TrackedGraph:
    """A snapshot of one transformed graph and where each node's statistics are."""

    graph: Graph
    # node name -> name of the node whose recorded statistics describe it
    fwd_source: dict[str, str]
    bwd_source: dict[str, str]


Key = tuple[int, str]  # (capture id, node name)
Record = tuple[Tensor | None, int]  # raw statistics (None if empty), numel


def _record(
    value: Tensor,
    rows: tuple[int, int, int] | None = None,
    block_format: BlockFormat | None = None,
) -> Record:
    numel = value.numel()
    if not numel:
        return None, numel
    raw = raw_statistics(value, rows)
    if block_format is not None:
        block = raw_quantisation_statistics(value, block_format)
        raw = torch.cat([raw.to(block.dtype), block])
    return raw, numel


class TrackingPass(StatefulPass):
    """Inserts an observer after every floating-point node, and keeps what the
    observers record: on-device statistics per node, for forward and backward.

    Work is never repeated for values that are provably the same. In the graph:
    a node that only rearranges another's elements shares that node's forward
    statistics, and its gradient's when it is that node's only user (otherwise
    their gradients differ). At run time: a tensor (or gradient) with the same
    memory, layout and version as one already measured, and still alive, shares
    its statistics, e.g. both outputs of ``U.residual_split``, ``dropout(p=0)``,
    a parameter that no optimizer step has changed, or the one gradient that
    ``U.residual_add`` passes to both its inputs; a tensor object that is
    already hooked shares its gradient's.
    """

    def __init__(self, block_format: BlockFormat | None = None) -> None:
        self.block_format = block_format
        self.fwd: dict[Key, Record] = {}
        self.bwd: dict[Key, Record] = {}
        self.bwd_alias: dict[Key, Key] = {}
        self.graphs: dict[int, _TrackedGraph] = {}
        # Leaf tensors (parameters) outlive a step: hook each one only once.
        self._hooked: dict[Key, weakref.ref[Tensor]] = {}
        # Live tensors measured or hooked, for sharing (entries die with them).
        self._measured: dict[tuple[Any, ...], tuple[weakref.ref[Tensor], Record]] = {}
        self._hooked_by_id: dict[int, tuple[weakref.ref[Tensor], Key]] = {}

    def fresh(self) -> TrackingPass:
        return TrackingPass(self.block_format)

    def _observer(self, capture_id: int) -> Callable[[Any, str, bool, bool], None]:
        def observe(value: Any, name: str, forward: bool, backward: bool) -> None:
            if not is_tracked_value(value):
                return
            key = (capture_id, name)
            if forward:
                self.fwd[key] = self._measure(value)
            if backward and value.requires_grad:
                self._hook(key, value)

        return observe

    def _measure(self, value: Tensor) -> Record:
        # Tensors hold the same elements while the first is alive if they have
        # the same memory, element layout (views reordering them have the same
        # rows) and type, and no in-place change since (the version counter,
        # shared by views).
        if value.is_inference() or not in_memory(value):
            return _record(value, None, self.block_format)
        rows = row_layout(value)
        layout = rows or (value.shape, value.stride())
        memory = value.data_ptr(), value.dtype, layout, value._version
        seen = self._measured.get(memory)
        if seen is not None and seen[0]() is not None:
            return seen[1]
        record = _record(value, rows, self.block_format)
        self._measured[memory] = (_forget(self._measured, memory, value), record)
        return record

    def _hook(self, key: Key, value: Tensor) -> None:
        if value.is_leaf:
            hooked = self._hooked.get(key)
            if hooked is not None and hooked() is value:
                return
            self._hooked[key] = weakref.ref(value)
        same = self._hooked_by_id.get(id(value))
        if same is not None and same[0]() is value and same[1] != key:
            self.bwd_alias[key] = same[1]  # the same tensor: the same gradient
            return
        self.bwd_alias.pop(key, None)
        self._hooked_by_id[id(value)] = (
            _forget(self._hooked_by_id, id(value), value),
            key,
        )

        def record_grad(grad: Tensor | None) -> None:
            # (None: an output of a custom autograd function that got no grad.)
            if grad is not None:
                self.bwd[key] = self._measure(grad)

        value.register_hook(record_grad)  # type: ignore[no-untyped-call]

    def __call__(self, gm: GraphModule) -> GraphModule:
        capture_id = len(self.graphs)
        internal = _internal_values(gm.graph)
        snapshot = Graph()
        snapshot.output(snapshot.graph_copy(gm.graph, {}))
        fwd_source: dict[str, str] = {}
        bwd_source: dict[str, str] = {}
        observe = self._observer(capture_id)
        for node in list(gm.graph.nodes):
            if node.op == "output" or not _may_be_float(node):
                continue
            alias = internal.get(node)
            if alias is not None:
                fwd_source[node.name] = fwd_source.get(alias.name, alias.name)
                bwd_source[node.name] = bwd_source.get(alias.name, alias.name)
                continue
            source = _value_source(node)
            forward = backward = True
            fwd_source[node.name] = bwd_source[node.name] = node.name
            if source is not None:
                forward = False
                fwd_source[node.name] = fwd_source.get(source.name, source.name)
                users = [u for u in source.users if u.target is not observe]
                # (The outputs of residual_split have gradients of their own.)
                if users == [node]:
                    backward = False
                    bwd_source[node.name] = bwd_source.get(source.name, source.name)
            logger.info("adding tracking to node: %s", node)
            with gm.graph.inserting_after(node):
                gm.graph.call_function(observe, (node, node.name, forward, backward))
        self.graphs[capture_id] = _TrackedGraph(snapshot, fwd_source, bwd_source)
        return gm


def _internal_values(graph: Graph) -> dict[Node, Node]:
    """Values that ``unit_scale`` made, not the model, each with the node whose
    statistics it reports: the output of a ``scale_bwd`` reports its input (it
    holds the same value; only the gradient passed back differs, by the static
    factor folded into the backward), and a region's output before its
    calibrated scale reports the scaled output (what the model's tensor is now).
    Neither is observed; ``prune_same_scale_tensors`` then keeps one node each."""
    internal: dict[Node, Node] = {}
    for node in graph.nodes:
        if node.op != "call_function" or not node.args:
            continue
        source = node.args[0]
        if not isinstance(source, Node):
            continue
        if node.target in (scale_bwd, broadcast_gradient, repeated_gradient):
            internal[node] = source
        elif (
            node.target is calibrated_scale
            and len(source.users) == 1
            and source.op == "call_function"
        ):
            internal[source] = node
    return internal


def _forget(table: dict[Any, Any], key: Any, value: Tensor) -> weakref.ref[Tensor]:
    """A weak reference to ``value`` that removes ``table[key]`` when ``value``
    dies (unless the entry has been replaced since)."""

    def remove(ref: weakref.ref[Tensor]) -> None:
        entry = table.get(key)
        if entry is not None and entry[0] is ref:
            del table[key]

    return weakref.ref(value, remove)


def _may_be_float(node: Node) -> bool:
    """A node to observe: its recorded value is a float tensor of the program, or
    it has no recorded value (a node added by a transform: checked at run time)."""
    if node.op != "placeholder" and "example_value" not in node.meta:
        return True
    return _is_float(node)
