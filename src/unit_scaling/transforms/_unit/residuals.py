"""Residual connections, found by dependency analysis of the traced graph.

A residual add sums a **skip** term and one or more **branch** terms computed
from it through at least one weighted op (a linear layer, convolution, matmul,
attention or embedding). The patterns real models use all reduce to that:

* ``x + f(x)``, in either order, pre- or post-norm, with ``f`` scaled by a layer
  scale or gated (``x + gamma * f(x)``, adaLN's ``x + g * f(x)``);
* parallel branches, ``x + attn(x) + mlp(x)`` in any order and nesting: the adds
  form a tree whose leaves are the skip and the branches;
* a projection shortcut, ``shortcut(x) + f(x)`` (ResNets, U-Net blocks): neither
  term contains the other, both come from a common input ``x``, and the term with
  fewer weighted ops is the skip;
* encoder-decoder streams: a cross-attention branch ``y + xattn(y, enc)`` depends
  on the encoder output too, but its skip is ``y``.

Each becomes ``U.residual_split`` at the skip's source and ``U.residual_add``
(``tau = 0.01`` when a branch contains attention, else ``0.5``, the seed's rule);
several branches are summed and divided by ``sqrt(k)`` first. Adds that are not
residuals (a position bias, a mask, a timestep or class embedding added to the
stream) have no weighted path from one term to the other, or a term broadcast
into the sum (after a U-Net's first block the stream depends on the timestep
embedding it adds again in every block), and are left to the other rules.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import operator
from collections.abc import Callable
from typing import Any

from torch.fx import Graph, Node

from ... import functional as U
from .._capture.graph import ancestors_between, is_add
from .._capture.targets import sum_branches
from .rules import ATTENTION_PRODUCTS, WEIGHTED
from .values import GraphValues

__all__ = ["Residual", "find_residuals", "rewrite_residual"]

logger = logging.getLogger("unit_scaling.transforms.unit_scale")

ATTENTION_TAU = 0.01
DEFAULT_TAU = 0.5
# How far past a softmax to look for the product that makes it attention.
_ATTENTION_DEPTH = 6


@dataclasses.dataclass
class Residual:
    """A residual add: its root node, the skip term, the branch terms with the
    nodes of each branch, and the node where the skip and branches diverge (the
    skip itself, or the common input of a projection shortcut)."""

    root: Node
    source: Node
    skip: Node
    branches: list[Node]
    branch_nodes: set[Node]
    skip_nodes: set[Node]
    tree: list[Node]  # the add nodes summing the terms, root last
    tau: float

    @property
    def shortcut(self) -> bool:
        return self.source is not self.skip


def _is_plain_add(node: Node, values: GraphValues) -> bool:
    return bool(
        is_add(node)
        and len(node.args) >= 2
        and node.kwargs.get("alpha", 1) == 1
        and values.is_data(node)
    )


def _terms(root: Node, values: GraphValues) -> tuple[list[Any], list[Node]]:
    """The terms summed by the tree of adds under ``root``, and the add nodes."""
    terms: list[Any] = []
    tree: list[Node] = []

    def expand(node: Node) -> None:
        tree.append(node)
        for arg in node.args[:2]:
            if (
                isinstance(arg, Node)
                and _is_plain_add(arg, values)
                and len(arg.users) == 1
            ):
                expand(arg)
            else:
                terms.append(arg)

    expand(root)
    tree.reverse()
    return terms, tree


def _same_shapes(root: Node, terms: list[Any], values: GraphValues) -> bool:
    """Whether every term has the sum's shape: a residual stream and its
    branches do; a term broadcast into the sum (a U-Net's timestep embedding
    added to every pixel, a position table added to every sequence) does not."""
    out = values.tensor(root)
    if out is None:
        return False
    for term in terms:
        info = values.tensor(term)
        if info is None or info.shape != out.shape:
            return False
    return True


def _weighted(nodes: set[Node]) -> int:
    return sum(1 for n in nodes if n.op == "call_function" and n.target in WEIGHTED)


def _is_attention(nodes: set[Node]) -> bool:
    """Whether the branch contains attention: SDPA, or a softmax whose output is
    multiplied with another activation (``probs @ v``) within the branch."""
    for node in nodes:
        if node.target is U.scaled_dot_product_attention:
            return True
        if node.target is not U.softmax:
            continue
        frontier, seen = [node], {node}
        for _ in range(_ATTENTION_DEPTH):
            frontier = [u for n in frontier for u in n.users if u in nodes]
            if any(u.target in ATTENTION_PRODUCTS for u in frontier):
                return True
            frontier = [u for u in frontier if u not in seen]
            seen.update(frontier)
    return False


def nearest_common_ancestor(
    a: Node, b: Node, index: dict[Node, int], follow: Callable[[Node], bool]
) -> Node | None:
    """The latest node (in graph order) that both ``a`` and ``b`` depend on,
    walking only through nodes for which ``follow`` holds."""
    heap = [(-index[a], 0, a), (-index[b], 1, b)]
    reached: dict[Node, int] = {}
    while heap:
        _, side, node = heapq.heappop(heap)
        previous = reached.get(node, 0)
        if previous & (1 << side):
            continue
        reached[node] = previous | (1 << side)
        if reached[node] == 3:
            return node
        for parent in node.all_input_nodes:
            if follow(parent) and parent in index:
                heapq.heappush(heap, (-index[parent], side, parent))
    return None


def _with_skip(
    root: Node,
    terms: list[Node],
    tree: list[Node],
    index: dict[Node, int],
) -> Residual | None:
    """Terms where one (the skip) feeds the others through weighted ops."""
    best: tuple[Node, list[Node], set[Node]] | None = None
    for skip in terms:
        branches, nodes = [], set()
        for term in terms:
            if term is skip:
                continue
            between = ancestors_between(term, skip, index)
            if between is not None and _weighted(between - {skip}):
                branches.append(term)
                nodes |= between - {skip}
        if branches and (best is None or len(branches) > len(best[1])):
            best = (skip, branches, nodes)
    if best is None:
        return None
    skip, branches, nodes = best
    if len(branches) != len(terms) - 1:
        return None  # another term joins the sum: not a residual add
    tau = ATTENTION_TAU if _is_attention(nodes) else DEFAULT_TAU
    return Residual(root, skip, skip, branches, nodes, set(), tree, tau)


def _with_shortcut(
    root: Node,
    terms: list[Node],
    tree: list[Node],
    index: dict[Node, int],
    values: GraphValues,
) -> Residual | None:
    """Two terms computed from a common input, the lighter one a shortcut."""
    if len(terms) != 2:
        return None
    source = nearest_common_ancestor(terms[0], terms[1], index, values.is_data)
    if source is None:
        return None
    found = [ancestors_between(term, source, index) for term in terms]
    paths = [p for p in found if p is not None]
    if len(paths) != 2:
        return None
    weights = [_weighted(p - {source}) for p in paths]
    if min(weights) == 0 or weights[0] == weights[1]:
        return None
    skip_index = 0 if weights[0] < weights[1] else 1
    skip, branch = terms[skip_index], terms[1 - skip_index]
    skip_nodes = paths[skip_index] - {source}
    branch_nodes = paths[1 - skip_index] - {source}
    if skip_nodes & branch_nodes:
        return None  # the paths share work: not two separate branches
    tau = ATTENTION_TAU if _is_attention(branch_nodes) else DEFAULT_TAU
    return Residual(root, source, skip, [branch], branch_nodes, skip_nodes, tree, tau)


def find_residuals(graph: Graph, values: GraphValues) -> list[Residual]:
    """Every residual add of ``graph`` (see the module docstring)."""
    index = {node: i for i, node in enumerate(graph.nodes)}
    found: list[Residual] = []
    inside_tree: set[Node] = set()
    for node in reversed(list(graph.nodes)):  # roots before the adds they contain
        if node in inside_tree or not _is_plain_add(node, values):
            continue
        terms, tree = _terms(node, values)
        if len(terms) < 2 or not all(values.is_data(t) for t in terms):
            continue
        if not _same_shapes(node, terms, values):
            continue  # a broadcast term (a timestep embedding) is no stream
        residual = _with_skip(node, terms, tree, index) or _with_shortcut(
            node, terms, tree, index, values
        )
        if residual is not None:
            found.append(residual)
            inside_tree.update(tree)
    found.reverse()
    return found


def rewrite_residual(graph: Graph, residual: Residual, values: GraphValues) -> None:
    """Replace the residual's adds with ``residual_split``/``residual_add``
    (recording the new activations in ``values``)."""
    source, tau = residual.source, residual.tau
    with graph.inserting_after(source):
        split = graph.call_function(U.residual_split, (source, tau))
    with graph.inserting_after(split):
        branch_input = graph.call_function(operator.getitem, (split, 0))
    with graph.inserting_after(branch_input):
        skip_input = graph.call_function(operator.getitem, (split, 1))
    for user in list(source.users):
        if user in residual.branch_nodes:
            user.replace_input_with(source, branch_input)
        elif user in residual.skip_nodes:
            user.replace_input_with(source, skip_input)
    skip = skip_input if residual.skip is source else residual.skip
    root = residual.root
    branches = residual.branches
    combined = branches[0]
    if len(branches) > 1:
        with graph.inserting_before(root):
            combined = graph.call_function(sum_branches, tuple(branches))
    for new, like in ((branch_input, source), (skip_input, source)):
        values.record_like(new, like)
    if combined is not branches[0]:
        values.record_like(combined, root)
    root.op = "call_function"
    root.target = U.residual_add
    root.args = (combined, skip, tau)
    root.kwargs = {}
    for add in reversed(residual.tree[:-1]):  # outer adds first
        if not add.users:
            graph.erase_node(add)
    logger.info(
        "unit scaling function: %s (residual-add, tau=%s)%s",
        root,
        tau,
        f" of {len(branches)} parallel branches" if len(branches) > 1 else "",
    )
