"""What each node of a captured graph holds: its kind, its shape, and for
constants their real value.

Unit scaling treats three kinds of tensors differently:

* **data**: activations, which depend on the model's floating-point inputs or
  on its parameters through computation. These are what unit scaling rescales.
* **parameters** (and what is computed from parameters alone, such as ``W.t()``):
  their gradients are rescaled, their values re-initialised.
* **constants**: everything computed from integer or boolean inputs, buffers,
  floating-point inputs that hold masks (only 0 and 1, or 0 and -inf), and
  sizes alone — attention masks, rotary sin/cos tables, position indices, ALiBi
  biases. They are not activations and are never rescaled.

Dynamo records fake tensors, which have shapes but no values (and, after a
recompilation with dynamic shapes, symbolic sizes). Calibrating an op needs real
constants and concrete shapes, so :func:`graph_values` runs the captured graph once
on the real example inputs, without gradients, on copies of every input that is not
a parameter (so that in-place updates such as batch-norm running statistics do not
reach the module), with the random-number generators restored afterwards.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import operator
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.fx import GraphModule, Interpreter, Node

from ..._torch_internals import pytree
from .._capture.dynamo import restore_functorch_levels
from .._capture.fallbacks import fell_back
from .._capture.graph import example_value
from .._capture.targets import RESCALING
from .rules import rule_for

__all__ = ["GraphValues", "Kind", "TensorInfo", "graph_values"]

logger = logging.getLogger("unit_scaling.transforms.unit_scale")


class Kind(enum.Enum):
    """What a node's value is, for unit scaling (see the module docstring)."""

    DATA = "data"
    PARAM = "parameter"
    CONST = "constant"


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """Concrete shape and dtype of a tensor a node produced."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device

    @property
    def is_float(self) -> bool:
        return self.dtype.is_floating_point

    @property
    def numel(self) -> int:
        n = 1
        for size in self.shape:
            n *= size
        return n


def _info(value: Any) -> Any:
    """``value`` with every tensor replaced by its :class:`TensorInfo`."""
    return pytree.tree_map(
        lambda x: (
            TensorInfo(tuple(x.shape), x.dtype, x.device)
            if isinstance(x, Tensor)
            else x
        ),
        value,
    )


@dataclasses.dataclass
class GraphValues:
    """Per node: its :class:`Kind`, its concrete output (tensors as
    :class:`TensorInfo`), and for constant and parameter nodes their real value
    (in ``constants``)."""

    kinds: dict[Node, Kind]
    infos: dict[Node, Any]
    constants: dict[Node, Any]

    def tensor(self, node: Any) -> TensorInfo | None:
        """The node's output if it is a single tensor, else ``None``. A node a
        rewrite inserted to scale a tensor (``scale_bwd``, ``calibrated_scale``)
        holds what its input holds."""
        if not isinstance(node, Node):
            return None
        info = self.infos.get(node)
        if info is None and node.target in RESCALING and node.args:
            return self.tensor(node.args[0])
        return info if isinstance(info, TensorInfo) else None

    def is_data(self, node: Any) -> bool:
        """A floating-point activation (see :class:`Kind`)."""
        info = self.tensor(node)
        return info is not None and info.is_float and self.kinds.get(node) is Kind.DATA

    def record_like(self, new: Any, like: Any) -> None:
        """Record a node inserted by a rewrite as holding what ``like`` holds."""
        if isinstance(new, Node) and isinstance(like, Node):
            self.kinds[new] = self.kind(like)
            if like in self.infos:
                self.infos[new] = self.infos[like]

    def kind(self, node: Any) -> Kind:
        """The node's :class:`Kind`; for a node inserted by a rewrite, derived
        from its inputs (an activation if any input is one)."""
        if not isinstance(node, Node):
            return Kind.CONST
        kind = self.kinds.get(node)
        if kind is None:
            inputs = [self.kind(p) for p in node.all_input_nodes]
            kind = next((k for k in (Kind.DATA, Kind.PARAM) if k in inputs), Kind.CONST)
            self.kinds[node] = kind
        return kind


def _is_mask(value: Tensor) -> bool:
    """A floating-point input that holds a mask: only 0 and 1, or only 0 and
    large negative values (an additive mask of -inf or ``finfo.min``)."""
    if value.numel() == 0 or value.requires_grad:
        return False
    with torch.no_grad():
        zero_one = (value == 0) | (value == 1)
        additive = (value == 0) | (value <= -1e4)
        return bool(zero_one.all() or additive.all())


def _placeholder_kind(value: Any, buffers: set[int]) -> Kind:
    if isinstance(value, nn.Parameter):
        return Kind.PARAM
    if (
        isinstance(value, Tensor)
        and value.is_floating_point()
        and id(value) not in buffers
        and not _is_mask(value)
    ):
        return Kind.DATA
    return Kind.CONST


def _holds_float_tensor(value: Any) -> bool:
    return any(
        isinstance(x, Tensor) and x.is_floating_point()
        for x in pytree.tree_leaves(value)
    )


def _derived_kind(node: Node, kinds: dict[Node, Kind]) -> Kind:
    """Activations beget activations. A parameter indexed or rearranged (``W.t()``,
    ``experts[i]``) or computed from parameters alone (``-exp(A_log)``) is still a
    parameter; a parameter combined with a constant tensor (an embedding lookup
    of token ids) or passed through a layer (DeBERTa's normalised relative
    position table, projected by each layer) is an activation."""
    inputs = [kinds[p] for p in node.all_input_nodes]
    if Kind.DATA in inputs:
        return Kind.DATA
    if Kind.PARAM not in inputs:
        return Kind.CONST
    if rule_for(node) is not None:
        return Kind.DATA  # a layer applied to a parameter table computes activations
    if node.target in _INDEXING or all(
        k is Kind.PARAM or not _holds_tensor(example_value(p))
        for k, p in zip(inputs, node.all_input_nodes, strict=True)
    ):
        return Kind.PARAM
    return Kind.DATA


def _holds_tensor(value: Any) -> bool:
    return any(isinstance(x, Tensor) for x in pytree.tree_leaves(value))


_INDEXING = frozenset({operator.getitem, "__getitem__", torch.select, "select"})


class _Recorder(Interpreter):
    """Runs the graph, recording every node's output info and constants."""

    def __init__(self, gm: GraphModule, values: GraphValues) -> None:
        super().__init__(gm, garbage_collect_values=True)
        self.values = values

    def run_node(self, n: Node) -> Any:
        result = super().run_node(n)
        self.values.infos[n] = _info(result)
        if self.values.kinds[n] is not Kind.DATA:
            # Detached: the same memory (a parameter re-initialised later shows
            # its new values) without a no-grad view's autograd history.
            self.values.constants[n] = pytree.tree_map(
                lambda x: x.detach() if isinstance(x, Tensor) else x, result
            )
        return result


def _copy_unless_parameter(value: Any) -> Any:
    if isinstance(value, Tensor) and not isinstance(value, nn.Parameter):
        return value.detach().clone()
    return value


def graph_values(
    gm: GraphModule, example_inputs: Sequence[Any], buffers: set[int]
) -> GraphValues:
    """Classify every node of ``gm`` and record concrete outputs (see the module
    docstring). ``buffers`` holds the ids of the module's buffers, which are
    constants even when floating point.

    If running the graph fails, infos fall back to Dynamo's recorded shapes where
    they are concrete, and no constant values are known.
    """
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    kinds: dict[Node, Kind] = {}
    for node, value in zip(placeholders, example_inputs, strict=False):
        kinds[node] = _placeholder_kind(value, buffers)
    for node in gm.graph.nodes:
        if node in kinds:
            continue
        if _holds_float_tensor(example_value(node)):
            kinds[node] = _derived_kind(node, kinds)
        else:  # sizes, indices, masks: never activations, whatever they came from
            kinds[node] = Kind.CONST
    values = GraphValues(kinds, {}, {})
    inputs = [_copy_unless_parameter(x) for x in example_inputs]
    devices = [x.device for x in inputs if isinstance(x, Tensor) and x.is_cuda]
    try:
        with (
            torch.random.fork_rng(devices=sorted({d.index or 0 for d in devices})),
            torch.no_grad(),
            restore_functorch_levels(),
        ):
            _Recorder(gm, values).run(*inputs)
    except Exception as error:  # calibration degrades; the transform still works
        fell_back("evaluate the captured graph", "the example inputs", error)
        values.constants.clear()
        for node in gm.graph.nodes:
            fake = example_value(node)
            if node not in values.infos and fake is not None:
                try:
                    values.infos[node] = _info(
                        pytree.tree_map(
                            lambda x: (
                                torch.empty(
                                    [int(s) for s in x.shape],
                                    dtype=x.dtype,
                                    device="meta",
                                )
                                if isinstance(x, Tensor)
                                else x
                            ),
                            fake,
                        )
                    )
                except Exception:
                    continue
    return values
