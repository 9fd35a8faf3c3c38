"""Low-rank adapters (LoRA and its kind): the update an adapter adds to a
layer's output, unit-scaled as the merged weight it stands for.

An adapter of rank ``r`` on a linear layer ``W`` (``d_out x d_in``) adds
``s B A x`` to the layer's output (``A``: ``r x d_in``, ``B``: ``d_out x r``,
``s`` the adapter's scaling): it is the layer with the weight ``W + s B A``.
Unit-scaled, that layer computes

.. math::
    d_{in}^{-1/2}\\, x (W + s B A)^T
    = d_{in}^{-1/2}\\, x W^T + s \\cdot d_{in}^{-1/2}\\, x A^T B^T

so the adapter's first product takes the layer's scale (``U.linear(x, A)``,
``d_in^-1/2``, as the rules give it), its second product none of its own
(``U.linear`` with ``scale_power=(0, 0, 1/2)``: output and input gradient
unscaled, the weight gradient scaled as a linear layer's), and the update
joins the layer's output by a plain sum (:func:`low_rank_update`). With ``B``
at zero, as LoRA starts it, the adapted model computes exactly the unit-scaled
model's function, and merging a trained adapter into the weight (PEFT's
``merge_and_unload``) keeps it. Any other rule changes the function at the
start: the sum of two activations is otherwise ``U.add`` (``2^-1/2``) or, as
the two terms share their input, a residual add weighted by ``tau`` (which
would also count as one more residual branch in u-μP's depth rule).

The structure is recognised from the traced ops, whichever library wrote them:
an add of

* the output of a linear layer (through rearrangements such as GPT-2's
  ``Conv1D`` reshapes), and
* a product ``x Aᵀ Bᵀ`` of two parameters of rank ``r`` below both of the
  layer's sizes, of the layer's own input (through rearrangements, casts and
  dropout), possibly multiplied by a number (the scaling).

Several adapters on one layer sum one after the other, each recognised the
same way. Runs before residuals are found, so that none of these adds is one.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx import Graph, Node

from ... import functional as U
from .._capture.graph import is_add, retarget
from .._capture.targets import low_rank_update
from .analytic import record_op
from .regions import is_rearrangement
from .report import UnitScaleReport
from .rules import get_argument, set_argument
from .values import GraphValues, Kind

__all__ = ["LowRankUpdate", "rewrite_low_rank_updates"]

logger = logging.getLogger("unit_scaling.transforms.unit_scale")

# The second factor's U.linear: no output or input-gradient scale (the first
# factor carries the layer's), its weight gradient scaled as any linear's.
UNSCALED_PRODUCT = (0.0, 0.0, 0.5)

_MULTIPLY = frozenset({operator.mul, torch.mul, "mul"})
_DROPOUT = frozenset({F.dropout, torch.dropout, U.dropout})


@dataclass(frozen=True)
class LowRankUpdate:
    """An add (``root``) of a linear layer's output (``output``) and an
    adapter's update (``term``: ``update``, the product by ``B``, times
    ``scaling``) of rank ``rank``."""

    root: Node
    output: Node
    term: Node
    update: Node
    scaling: float
    rank: int


def _through(node: Any, skip: Callable[[Node], bool]) -> Any:
    """``node``, or what it rearranges (or otherwise passes on, per ``skip``)."""
    while (
        isinstance(node, Node)
        and node.op in ("call_function", "call_method")
        and node.args
        and isinstance(node.args[0], Node)
        and skip(node)
    ):
        node = node.args[0]
    return node


def _source(node: Any) -> Any:
    """The tensor ``node`` is made of by rearranging, casting or dropping out."""
    return _through(node, lambda n: is_rearrangement(n) or n.target in _DROPOUT)


def _unbiased_linear(node: Any, values: GraphValues) -> tuple[Node, Node] | None:
    """``(input, weight)`` of a bias-free ``U.linear`` at its default scales
    whose weight is a parameter (through rearrangements), else ``None``."""
    if not (isinstance(node, Node) and node.target is U.linear):
        return None
    weight, source = get_argument(node, "weight"), get_argument(node, "input")
    if get_argument(node, "bias") is not None:
        return None
    if get_argument(node, "scale_power") not in (None, (0.5, 0.5, 0.5)):
        return None
    if not (isinstance(weight, Node) and isinstance(source, Node)):
        return None
    if values.kind(_through(weight, is_rearrangement)) is not Kind.PARAM:
        return None
    return source, weight


def _layer(node: Any) -> Node | None:
    """The linear layer whose output ``node`` is (through rearrangements and
    the updates of adapters already on it)."""
    node = _through(node, is_rearrangement)
    while isinstance(node, Node) and node.target is low_rank_update:
        node = _through(node.args[0], is_rearrangement)
    return node if isinstance(node, Node) and node.target is U.linear else None


def _scaled(term: Node) -> tuple[Node, float]:
    """``(update, s)`` for ``update * s`` or ``s * update`` with a number ``s``;
    ``(term, 1)`` otherwise."""
    if term.target in _MULTIPLY and len(term.args) == 2 and len(term.users) == 1:
        a, b = term.args
        for tensor, number in ((a, b), (b, a)):
            if (
                isinstance(tensor, Node)
                and isinstance(number, (int, float))
                and not isinstance(number, bool)
            ):
                return tensor, float(number)
    return term, 1.0


def _shape(values: GraphValues, node: Node) -> tuple[int, ...] | None:
    info = values.tensor(node)
    return None if info is None else tuple(info.shape)


def _match(
    root: Node, output: Node, term: Node, values: GraphValues
) -> LowRankUpdate | None:
    layer = _layer(output)
    if layer is None or len(term.users) != 1:
        return None
    update, scaling = _scaled(term)
    second = _unbiased_linear(update, values)
    if second is None or len(update.users) != 1:
        return None
    projected, weight_b = second
    first = _unbiased_linear(projected, values)
    if first is None or len(projected.users) != 1:
        return None
    source, weight_a = first
    base_input, base_weight = (
        get_argument(layer, "input"),
        get_argument(layer, "weight"),
    )
    if not isinstance(base_weight, Node) or _source(source) is not _source(base_input):
        return None
    shapes = [_shape(values, w) for w in (base_weight, weight_a, weight_b)]
    if any(s is None or len(s) != 2 for s in shapes):
        return None
    (d_out, d_in), (rank, a_in), (b_out, b_rank) = shapes  # type: ignore[misc]
    if (a_in, b_out, b_rank) != (d_in, d_out, rank) or rank >= min(d_in, d_out):
        return None
    assert isinstance(update, Node)
    return LowRankUpdate(root, output, term, update, scaling, rank)


def rewrite_low_rank_updates(
    graph: Graph, values: GraphValues, report: UnitScaleReport
) -> int:
    """Give every low-rank adapter's update the merged weight's scales (see the
    module docstring); returns how many were found."""
    count = 0
    # In graph order: a second adapter on a layer adds its update to the first
    # one's, rewritten by then.
    for node in list(graph.nodes):
        if not (
            is_add(node)
            and len(node.args) == 2
            and node.kwargs.get("alpha", 1) == 1
            and values.is_data(node)
        ):
            continue
        left, right = node.args
        if not (isinstance(left, Node) and isinstance(right, Node)) or left is right:
            continue
        found = _match(node, left, right, values) or _match(node, right, left, values)
        if found is not None:
            _rewrite(graph, found, report)
            count += 1
    return count


def _rewrite(graph: Graph, found: LowRankUpdate, report: UnitScaleReport) -> None:
    set_argument(found.update, "scale_power", UNSCALED_PRODUCT)
    set_argument(found.update, "constraint", None)
    retarget(
        found.root,
        low_rank_update,
        args=(found.output, found.update, found.scaling),
        kwargs={},
    )
    if found.term is not found.update and not found.term.users:
        graph.erase_node(found.term)  # the multiplication by the scaling
    logger.info(
        "unit scaling function: %s (low-rank adapter of rank %d, scaling %g: "
        "the merged weight's scales)",
        found.root,
        found.rank,
        found.scaling,
    )
    record_op(
        report,
        found.root,
        "analytic",
        f"low-rank adapter (rank {found.rank}, scaling {found.scaling:g}): "
        "the merged weight's function",
    )
