"""Solving for the ratios ``R = log(plain value / unit-scaled value)``.

Every op of a unit-scaled graph relates the log-ratios of its inputs, outputs
and parameters by a linear equation (``R_y = R_x + R_W - log alpha`` for a
linear layer, ``R_a = R_b`` for an addition, ``R_x = 0`` where both models must
agree exactly). Most equations relate two values by a difference; a weighted
union-find merges those into classes, each a root plus known offsets. The few
that relate three or more (products: ``R_y = R_x + R_W - log alpha``) or two by
a sum (the query and key of an attention) are then solved over the class roots
by weighted least squares, which picks, among the many solutions (a norm's gain
against the next layer's weight), the one that changes activations least and
parameters most. An equation that contradicts the others is set aside and
reported with the factor it could not absorb.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Hashable

import torch

__all__ = ["ONE", "Conflict", "RatioSystem"]

ONE: Hashable = "ONE"
"""The variable fixed at ``R = 0``: values both models compute identically."""

# Two log-ratios closer than this are equal: measured scales carry float64
# rounding from float32 data, far below what an exported model can resolve.
_TOL = 1e-6


@dataclasses.dataclass(frozen=True)
class Conflict:
    """An equation the others leave no room for: in the plain model, the input
    (``at_input``) or the output of the op ``origin`` would need multiplying
    by ``factor``."""

    origin: str
    factor: float
    at_input: bool


@dataclasses.dataclass
class _Equation:
    terms: dict[Hashable, float]
    const: float
    origin: str
    at_input: bool


class RatioSystem:
    """Linear equations over log-ratios, solved by union-find and least squares.

    Example::

        >>> system = RatioSystem()
        >>> system.relate({"y": 1, "x": -1, "W": -1}, -math.log(0.5), "linear")
        >>> system.anchor("x", 0.0, "input")
        >>> system.anchor("y", 0.0, "output")
        >>> values, conflicts = system.solve(lambda v: 1.0)
        >>> round(math.exp(values["W"]), 6), conflicts
        (0.5, [])
    """

    def __init__(self) -> None:
        self._parent: dict[Hashable, Hashable] = {ONE: ONE}
        self._offset: dict[Hashable, float] = {ONE: 0.0}  # R_v - R_parent(v)
        self._multi: list[_Equation] = []
        self.conflicts: list[Conflict] = []

    def add(self, v: Hashable) -> None:
        """Declare ``v`` (a variable no equation mentions stays at 0)."""
        if v not in self._parent:
            self._parent[v], self._offset[v] = v, 0.0

    def _find(self, v: Hashable) -> tuple[Hashable, float]:
        """``v``'s root and ``R_v - R_root``, compressing the path."""
        self.add(v)
        path = []
        while self._parent[v] != v:
            path.append(v)
            v = self._parent[v]
        root, total = v, 0.0
        for u in reversed(path):  # nearest the root first
            total += self._offset[u]
            self._parent[u], self._offset[u] = root, total
        return root, (self._offset[path[0]] if path else 0.0)

    def equal(
        self, u: Hashable, v: Hashable, k: float, origin: str, at_input: bool = False
    ) -> None:
        """``R_u - R_v = k``, stated by the op ``origin`` of which ``u`` is an
        input (``at_input``) or the output."""
        (ru, ou), (rv, ov) = self._find(u), self._find(v)
        if ru == rv:
            miss = k - (ou - ov)
            if abs(miss) > _TOL:
                factor = math.exp(miss if at_input else -miss)
                self.conflicts.append(Conflict(origin, factor, at_input))
            return
        if ru == ONE:  # ONE stays a root, at 0
            self._parent[rv], self._offset[rv] = ru, ou - ov - k
        else:
            self._parent[ru], self._offset[ru] = rv, k - ou + ov

    def anchor(
        self, v: Hashable, value: float, origin: str, at_input: bool = False
    ) -> None:
        """``R_v = value``."""
        self.equal(v, ONE, value, origin, at_input)

    def relate(
        self,
        terms: dict[Hashable, float],
        const: float,
        origin: str,
        at_input: bool = False,
    ) -> None:
        """``sum(c * R_v for v, c in terms.items()) = const`` (an op's output
        first, with coefficient 1, unless ``at_input``)."""
        terms = {v: c for v, c in terms.items() if c != 0}
        for v in terms:
            self.add(v)
        pair = list(terms.items())
        if len(pair) == 1 and abs(pair[0][1]) == 1:
            self.anchor(pair[0][0], const * pair[0][1], origin, at_input)
        elif len(pair) == 2 and pair[0][1] == -pair[1][1] and abs(pair[0][1]) == 1:
            (u, c), (v, _) = pair
            self.equal(u, v, const * c, origin, at_input)
        else:
            self._multi.append(_Equation(terms, const, origin, at_input))

    def solve(
        self, cost: Callable[[Hashable], float]
    ) -> tuple[dict[Hashable, float], list[Conflict]]:
        """Every variable's ``R`` and the equations that had to be set aside.

        ``cost(v)`` weighs how much changing ``v`` matters: the solution
        minimises ``sum(cost(v) * R_v**2)`` over the solutions of the equations.
        """
        members: dict[Hashable, list[tuple[Hashable, float]]] = {}
        for v in list(self._parent):
            root, offset = self._find(v)
            members.setdefault(root, []).append((v, offset))
        roots = [r for r in members if r != ONE]
        index = {r: i for i, r in enumerate(roots)}
        weight = torch.zeros(len(roots), dtype=torch.float64, device="cpu")
        centre = torch.zeros(len(roots), dtype=torch.float64, device="cpu")
        for r in roots:
            w = [max(cost(v), 1e-12) for v, _ in members[r]]
            weight[index[r]] = sum(w)
            # the root value minimising sum(w * (R_root + offset)^2)
            centre[index[r]] = -sum(
                wi * o for wi, (_, o) in zip(w, members[r], strict=True)
            ) / sum(w)
        rows = []
        for eq in self._multi:
            row = torch.zeros(len(roots), dtype=torch.float64, device="cpu")
            rhs = eq.const
            for v, c in eq.terms.items():
                root, offset = self._find(v)
                rhs -= c * offset
                if root != ONE:
                    row[index[root]] += c
            rows.append((row, rhs, eq.origin, eq.at_input))
        kept = _consistent(rows, weight, centre, self.conflicts)
        solution = _least_change(kept, weight, centre)
        values = {
            v: (0.0 if root == ONE else float(solution[index[root]])) + offset
            for root, group in members.items()
            for v, offset in group
        }
        return values, list(self.conflicts)


Row = tuple[torch.Tensor, float, str, bool]


def _least_change(
    rows: list[Row], weight: torch.Tensor, centre: torch.Tensor
) -> torch.Tensor:
    """The roots minimising ``sum(weight * (R - centre)^2)`` subject to ``rows``."""
    if not rows:
        return centre
    a = torch.stack([r[0] for r in rows])
    b = torch.tensor([r[1] for r in rows], dtype=torch.float64, device="cpu")
    spread = weight.rsqrt()
    z: torch.Tensor = torch.linalg.pinv(a * spread) @ (b - a @ centre)
    return centre + spread * z


def _consistent(
    rows: list[Row],
    weight: torch.Tensor,
    centre: torch.Tensor,
    conflicts: list[Conflict],
) -> list[Row]:
    """``rows`` less those that contradict earlier ones (each a conflict)."""

    def misses(kept: list[Row], solution: torch.Tensor) -> list[float]:
        return [float(r[0] @ solution) - r[1] for r in kept]

    if all(abs(m) <= _TOL for m in misses(rows, _least_change(rows, weight, centre))):
        return rows
    kept: list[Row] = []
    for row in rows:
        trial = [*kept, row]
        if all(
            abs(m) <= _TOL for m in misses(trial, _least_change(trial, weight, centre))
        ):
            kept.append(row)
        else:
            # the factor the row's op would need, given the rows kept so far
            miss = misses([row], _least_change(kept, weight, centre))[0]
            at_input = row[3]
            factor = math.exp(-miss if at_input else miss)
            conflicts.append(Conflict(row[2], factor, at_input))
    return kept
