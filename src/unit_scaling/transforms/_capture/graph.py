"""FX graph helpers shared by the transforms (public torch.fx API only)."""

from __future__ import annotations

import heapq
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.fx import Graph, GraphModule, Node

__all__ = [
    "SAME_ELEMENTS",
    "OpSet",
    "ancestors_between",
    "example_value",
    "is_add",
    "is_float_tensor_node",
    "node_index",
    "retarget",
    "run_quietly",
]


@dataclass(frozen=True)
class OpSet:
    """Ops as a traced graph calls them: functions (``call_function`` targets)
    and tensor methods (``call_method`` names). ``node in ops`` tests a node."""

    functions: frozenset[Any] = frozenset()
    methods: frozenset[str] = frozenset()

    def __contains__(self, node: object) -> bool:
        if not isinstance(node, Node):
            return False
        if node.op == "call_function":
            return node.target in self.functions
        return node.op == "call_method" and node.target in self.methods

    def __or__(self, other: OpSet) -> OpSet:
        return OpSet(self.functions | other.functions, self.methods | other.methods)


_ADDS = OpSet(
    frozenset({operator.add, operator.iadd, torch.add}),
    frozenset({"add", "add_", "__add__", "__iadd__", "__radd__"}),
)
# Ops whose output holds exactly the elements of their first argument.
SAME_ELEMENTS = OpSet(
    frozenset(
        {
            torch.reshape,
            torch.flatten,
            torch.transpose,
            torch.permute,
            torch.squeeze,
            torch.unsqueeze,
            torch.t,
            torch.clone,
        }
    ),
    frozenset(
        {
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
    ),
)


def example_value(node: Any) -> Any:
    """The (fake) value Dynamo recorded for ``node``, if any."""
    return node.meta.get("example_value") if isinstance(node, Node) else None


def is_float_tensor_node(node: Any) -> bool:
    """True for a node whose recorded value is a floating-point tensor."""
    value = example_value(node)
    return isinstance(value, Tensor) and value.is_floating_point()


def is_add(node: Node) -> bool:
    """True for ``a + b``, ``torch.add(a, b)``, ``a.add(b)`` (and in-place forms)."""
    return node in _ADDS


def retarget(
    node: Node,
    target: Callable[..., Any],
    args: tuple[Any, ...] | None = None,
    kwargs: dict[str, Any] | None = None,
) -> None:
    """Turn ``node`` into a ``call_function`` of ``target`` (keeping its users)."""
    node.op = "call_function"
    node.target = target
    if args is not None:
        node.args = args
    if kwargs is not None:
        node.kwargs = kwargs


def node_index(graph: Graph) -> dict[Node, int]:
    """Each node's position in the graph's (topological) order."""
    return {node: i for i, node in enumerate(graph.nodes)}


def ancestors_between(
    start: Node, stop: Node, index: dict[Node, int]
) -> set[Node] | None:
    """Nodes on paths from ``stop`` to ``start`` (both included), or ``None``
    when ``stop`` is not an ancestor of ``start``.

    Walks up from ``start`` but never below ``stop``'s position in the graph, so
    the cost is bounded by the size of the region between the two nodes; over
    all the residual adds of a model this is linear in the graph size.
    """
    floor = index[stop]
    seen: set[Node] = set()
    frontier = [start]
    while frontier:
        node = frontier.pop()
        if node in seen or index[node] < floor:
            continue
        seen.add(node)
        frontier.extend(node.all_input_nodes)
    if stop not in seen:
        return None
    # Keep only nodes that also descend from `stop`.
    between = {stop}
    for node in sorted(seen, key=index.__getitem__):
        if node is not stop and any(p in between for p in node.all_input_nodes):
            between.add(node)
    return between


def all_ancestors(nodes: Iterable[Node]) -> set[Node]:
    """Every node that ``nodes`` depend on, and ``nodes`` themselves."""
    seen: set[Node] = set()
    frontier = list(nodes)
    while frontier:
        node = frontier.pop()
        if node not in seen:
            seen.add(node)
            frontier.extend(node.all_input_nodes)
    return seen


def have_common_ancestor(
    a: Node, b: Node, index: dict[Node, int], follow: Callable[[Node], bool]
) -> bool:
    """True if ``a`` and ``b`` both depend on some node (walking only through
    nodes for which ``follow`` holds).

    Walks up from both in decreasing graph order, so the search stops at their
    nearest common ancestor; operands with none explore only their own ancestry.
    """
    heap = [(-index[a], 0, a), (-index[b], 1, b)]
    reached: dict[Node, int] = {}
    while heap:
        _, side, node = heapq.heappop(heap)
        mask = 1 << side
        previous = reached.get(node, 0)
        if previous & mask:
            continue
        reached[node] = previous | mask
        if reached[node] == 3:
            return True
        for parent in node.all_input_nodes:
            if follow(parent):
                heapq.heappush(heap, (-index[parent], side, parent))
    return False


# Ops whose result may share memory with their first argument.
_VIEWS = OpSet(
    frozenset(
        {
            torch.reshape,
            torch.transpose,
            torch.permute,
            torch.t,
            torch.squeeze,
            torch.unsqueeze,
            torch.flatten,
            torch.narrow,
            torch.select,
            torch.split,
            torch.chunk,
            torch.unbind,
            torch.movedim,
            torch.swapaxes,
            torch.diagonal,
            torch.detach,
        }
    ),
    frozenset(
        [
            "view",
            "view_as",
            "reshape",
            "reshape_as",
            "transpose",
            "permute",
            "t",
            "expand",
            "expand_as",
            "squeeze",
            "unsqueeze",
            "flatten",
            "unflatten",
            "narrow",
            "select",
            "split",
            "chunk",
            "unbind",
            "diagonal",
            "unfold",
            "as_strided",
            "movedim",
            "swapaxes",
            "contiguous",
            "detach",
        ]
    ),
)


def is_view_node(node: Node) -> bool:
    """True if ``node``'s value may alias (share memory with) its first argument:
    views, reshapes, slicing, splitting (conservatively, also ops that only
    sometimes return a view, such as ``reshape`` and ``contiguous``)."""
    if node.op == "call_function" and node.target is operator.getitem:
        # Slicing a tensor, or taking a piece of split/chunk/unbind, is a view;
        # taking an output of topk, sort or max is not.
        source = node.args[0]
        return isinstance(example_value(source), Tensor) or (
            isinstance(source, Node) and is_view_node(source)
        )
    return node in _VIEWS


def run_quietly(gm: GraphModule, *args: Any) -> Any:
    """Run a graph module the library built for its own measurement (a region on
    stand-ins, a copy of a graph with extra outputs).

    An error propagates to the caller, which falls back and records why; but
    ``GraphModule.__call__`` would first print the generated code around the
    failing line to stderr, a traceback the user can do nothing with. Calling
    ``forward`` runs the same code without that wrapper (and without module
    hooks, which such a module has none of).

    Example:
        >>> graph = Graph()
        >>> x = graph.placeholder("x")
        >>> _ = graph.output(graph.call_function(torch.neg, (x,)))
        >>> run_quietly(GraphModule(torch.nn.Module(), graph), torch.ones(2))
        tensor([-1., -1.])
    """
    return gm.forward(*args)
