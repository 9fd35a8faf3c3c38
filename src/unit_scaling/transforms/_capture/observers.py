"""Functions that only observe a tensor (a monitor's), kept out of the passes.

A module hook that runs while TorchDynamo captures a transformed model's forward
is traced into the captured graph. A function registered here (by a package
above the transforms: ``unit_scaling.monitor``) is recorded there as one node,
kept although it returns nothing, and runs when the graph runs. The passes must
not see it: to them it would be one more op (rewritten, reported, calibrated,
matched into a pattern). So the engine takes these nodes out of the graph before
the passes (:func:`detach`), follows the value each observes while the passes
rewrite the graph (:meth:`Detached.watching`, :meth:`Detached.follow`) and puts
each back after the node that holds that value in the transformed graph
(:meth:`Detached.reattach`): the transforms behave exactly as without them.

The value an observer saw moves to another node when a pass replaces its node
(a recognised pattern computed by a new node) or scales it for every later use
(a region's calibrated output scale): what the rest of the graph uses, as
``track_scales`` reports it. A scale of the gradient alone (``scale_bwd``)
does not move it: the node the scale reads keeps the value, and its gradient
is the one the scale has brought to unit scale. Where a pass erases the node
and keeps a view of it, or what it is a view of, the observer goes there (the
same elements, and the same gradient). An observer whose value is gone is
dropped, with a warning.
"""

from __future__ import annotations

import contextlib
import dataclasses
import operator
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor
from torch.fx import Graph, GraphModule, Node

from ..._fx_names import module_path
from ..._torch_internals import node_replacements
from ...scale import scale_fwd
from .fallbacks import fell_back
from .graph import SAME_ELEMENTS, example_value
from .targets import calibrated_scale

__all__ = ["OBSERVERS", "Detached", "detach", "register_observer"]

OBSERVERS: list[Callable[..., None]] = []
"""The observing functions: every transform records each call as one node."""

# Targets whose output is their first argument rescaled, in value: the value
# the rest of the graph uses from there on.
_VALUE_RESCALING = frozenset({calibrated_scale, scale_fwd})


def register_observer(function: Callable[..., None]) -> Callable[..., None]:
    """Make ``function(tensor, *constants)`` an observer: kept whole by every
    transform, kept by dead-code elimination, out of every pass's sight. It is
    called once more while TorchDynamo traces, on FakeTensors: it must do
    nothing then."""
    if function not in OBSERVERS:
        torch.fx.node.has_side_effect(function)
        OBSERVERS.append(function)
    return function


@dataclasses.dataclass
class _Observer:
    """An observer node taken out of a graph: its call, and the node holding
    the value it observes (``None`` once lost)."""

    target: Callable[..., None]
    constants: tuple[Any, ...]
    kwargs: dict[str, Any]
    node: Node | None
    where: str


@dataclasses.dataclass
class Detached:
    """The observers taken out of one graph, following their values."""

    observers: list[_Observer]
    # While a pass runs: the nodes a pass gave the users of a watched node in
    # its place, and the nodes holding each observed node's elements.
    _moves: dict[Node, list[Node]] = dataclasses.field(default_factory=dict)
    _same: dict[Node, list[Node]] = dataclasses.field(default_factory=dict)

    @contextlib.contextmanager
    def watching(self, gm: GraphModule) -> Iterator[None]:
        """Note, while a pass runs, each node given to the users of an observed
        node (or of a view holding its elements) in its place."""
        observed = {o.node for o in self.observers if o.node is not None}
        self._same = {node: _same_elements(node) for node in observed}
        watched = observed.union(*self._same.values())
        if not watched:
            yield
            return
        graph = gm.graph

        def replaced(old: Node, new: str, user: Node) -> None:
            if old in watched:
                found = next((n for n in graph.nodes if n.name == new), None)
                if found is not None and found is not old:
                    self._moves.setdefault(old, []).append(found)

        with node_replacements(gm, replaced):
            yield

    def follow(self, gm: GraphModule) -> None:
        """After a pass: move each observer to the node that now holds its
        value (see the module docstring), or drop it, with a warning, if the
        pass removed its value."""
        alive = set(gm.graph.nodes)
        for observer in self.observers:
            if observer.node is not None:
                observer.node = _holder(observer.node, alive, self._moves, self._same)
                if observer.node is None:
                    fell_back(
                        "monitor observer",
                        observer.where,
                        "a transform removed the value it observes",
                    )
        self._moves.clear()
        self._same.clear()

    def reattach(self, graph: Graph) -> None:
        """Put each observer back, after the node holding its value."""
        for observer in reversed(self.observers):  # (each inserted first)
            if observer.node is not None:
                with graph.inserting_after(observer.node):
                    graph.call_function(
                        observer.target,
                        (observer.node, *observer.constants),
                        observer.kwargs,
                    )

    def drop(self, why: str) -> None:
        """Leave the observers out of the graph, with one warning."""
        if self.observers:
            where = ", ".join(dict.fromkeys(o.where for o in self.observers))
            fell_back("monitor observer", where, why)


def detach(graph: Graph) -> Detached:
    """Take every observer node out of ``graph``."""
    observers = []
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in OBSERVERS:
            continue
        observed, *constants = node.args
        if isinstance(observed, Node):
            observers.append(
                _Observer(
                    node.target,
                    tuple(constants),
                    dict(node.kwargs),
                    observed,
                    module_path(observed) or observed.name,
                )
            )
        graph.erase_node(node)
    return Detached(observers)


def _same_elements(node: Node) -> list[Node]:
    """The nodes holding ``node``'s elements, and its gradient: its views (each
    the one user of the last), then what it is a view of (where it is that
    node's one user). A pass may erase ``node`` and keep one of them: GPT-2's
    GELU, recognised from ``h.view(...)``, its ops and ``.view(...)``, is
    computed from ``h``, and the outputs of ``c_fc`` (the first view) and of
    the activation (before the last) are gone."""
    found = []
    down = node
    while len(down.users) == 1:
        user = next(iter(down.users))
        if not _view_of(user, down):
            break
        found.append(user)
        down = user
    up = node
    while up.args and isinstance(up.args[0], Node) and _view_of(up, up.args[0]):
        if len(up.args[0].users) != 1:
            break
        up = up.args[0]
        found.append(up)
    return found


def _view_of(node: Node, source: Node) -> bool:
    """Whether ``node`` holds exactly the elements of ``source``: a view, a
    copy, or an index that takes every element (``x[:, 0:]``)."""
    if node.args[:1] != (source,):
        return False
    if node in SAME_ELEMENTS:
        return True
    if node.op != "call_function" or node.target is not operator.getitem:
        return False
    index = node.args[1] if len(node.args) > 1 else None
    parts = index if isinstance(index, tuple) else (index,)
    return isinstance(example_value(source), Tensor) and all(
        part is Ellipsis
        or (
            isinstance(part, slice)
            and part.start in (None, 0)
            and part.stop is None
            and part.step in (None, 1)
        )
        for part in parts
    )


def _holder(
    node: Node,
    alive: set[Node],
    moves: dict[Node, list[Node]],
    same: dict[Node, list[Node]],
) -> Node | None:
    """The node holding ``node``'s value after a pass: ``node`` itself, unless
    the pass replaced it (every user given one new node, ``node`` erased; or,
    erased, a node holding its elements is left) or scaled it for every user
    (its one user is a value rescaling of it)."""
    seen: set[Node] = set()
    alternatives = same.get(node, [])
    while node not in seen:
        seen.add(node)
        if node not in alive:
            given = {n for n in moves.get(node, ()) if n in alive or n in moves}
            if len(given) != 1:
                given = {
                    next(
                        (
                            n
                            for n in alternatives
                            if n not in seen and (n in alive or n in moves)
                        ),
                        node,
                    )
                }
            node = given.pop()
            continue
        users = list(node.users)
        if (
            len(users) == 1
            and users[0].target in _VALUE_RESCALING
            and users[0].args[:1] == (node,)
        ):
            node = users[0]
            continue
        return node
    return None
