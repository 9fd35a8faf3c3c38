"""How an op's output scales with its inputs, found by running it.

An op ``f`` is (positively) homogeneous of degree ``d`` in an input ``x`` when
``f(λx) = λ^d f(x)``: views and additions of degree 1, products of degree 1 in
each factor, a normalisation of degree 0 in its input. Ratio propagation only
needs that: if the plain model's ``x`` is ``r`` times the unit-scaled one's,
its output is ``r^d`` times. :func:`probe` measures it on the real values of a
call, for each input alone (``λ = 2`` and ``1/2``, exact in floating point),
then for the inputs that fail alone, together (``x + y``, ``where``, ``cat``).
What fails both is *anchored*: both models must feed it the same values.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch
from torch import Tensor

from .._standins import normal_like, seeded
from .._torch_internals import pytree
from ._solver import RatioSystem

__all__ = [
    "Unit",
    "flatten_call",
    "output_units",
    "pick",
    "probe",
    "proportion",
    "unflatten_call",
    "with_stand_ins",
]

# An input of the call: (index among the flattened arguments, index inside a
# tuple-valued argument or None), and the ratio variable it stands for.
Unit = tuple[int, int | None]

_LAMBDAS = (2.0, 0.5)
# Relative (2-norm) error allowed when testing proportionality: normalisations
# are scale-invariant only up to their eps, float32 sums only up to rounding.
_TOL = 1e-4
# Larger magnitudes are masks (models fill with finfo(float32).min), not data.
_MASKED = 1e30


def _is_float(x: Any) -> bool:
    return isinstance(x, Tensor) and x.is_floating_point()


def proportion(scaled: Any, base: Any) -> float | None:
    """``c`` with ``scaled == c * base`` (``c > 0``, to within 1e-4 of the norm),
    else ``None``; ``1.0`` for equal non-float tensors. Masked entries (beyond
    1e30 in magnitude) must stay masked and are left out.

    Example::

        >>> x = torch.tensor([1.0, -2.0, -3e38])
        >>> proportion(x * torch.tensor([3.0, 3.0, 1.0]), x)
        3.0
        >>> proportion(x.exp(), x) is None
        True
    """
    if not isinstance(scaled, Tensor) or not isinstance(base, Tensor):
        return None
    if scaled.shape != base.shape:
        return None
    if not base.is_floating_point():
        return 1.0 if torch.equal(scaled, base) else None
    s, b = scaled.detach().double(), base.detach().double()
    # Masked entries (±inf, or ±finfo.max of a float mask) say nothing of the
    # scale: they must stay masked, with their sign, and are left out.
    masked = ~torch.isfinite(b) | (b.abs() > _MASKED)
    if not torch.equal(masked, ~torch.isfinite(s) | (s.abs() > _MASKED)):
        return None
    if not torch.equal(s[masked].sign(), b[masked].sign()):
        return None
    s, b = s[~masked], b[~masked]
    bb = float((b * b).sum())
    if bb == 0:
        return None
    c = float((s * b).sum()) / bb
    if not c > 0 or float((s - c * b).norm()) > _TOL * float(s.norm()):
        return None
    return c


def output_units(value: Any) -> list[tuple[int | None, Tensor]]:
    """The tensors of a call's result: itself, or each tensor of a tuple."""
    if isinstance(value, Tensor):
        return [(None, value)]
    if isinstance(value, (tuple, list)):
        return [(j, v) for j, v in enumerate(value) if isinstance(v, Tensor)]
    return []


def pick(value: Any, j: int | None) -> Any:
    """Output ``j`` of a call's result (``None``: the result itself)."""
    return value if j is None else value[j]


def _scaled(leaves: Sequence[Any], units: Sequence[Unit], lam: float) -> list[Any]:
    """Fresh copies of ``leaves`` (calls may write into them) with ``units``
    multiplied by ``lam``."""

    def copy(x: Any) -> Any:
        if isinstance(x, Tensor):
            return x.clone()
        if isinstance(x, (tuple, list)):
            return type(x)(copy(v) for v in x)
        return x

    out = [copy(x) for x in leaves]
    for i, j in units:
        if j is None:
            out[i] = out[i] * lam
        else:
            items = list(out[i])
            items[j] = items[j] * lam
            out[i] = type(out[i])(items)
    return out


def with_stand_ins(leaves: Sequence[Any], units: Sequence[Unit]) -> list[Any]:
    """``leaves`` with each all-zero input tensor among ``units`` (a bias at
    zero, say) replaced by a fixed random one: a zero tensor scales by anything,
    so it would say nothing of how the op scales."""
    generator = seeded(0)
    out = list(leaves)
    for i, j in units:
        x = pick(out[i], j)
        if _is_float(x) and x.numel() and not bool(x.any()):
            stand_in = normal_like(x, generator)
            if j is None:
                out[i] = stand_in
            else:
                items = list(out[i])
                items[j] = stand_in
                out[i] = type(out[i])(items)
    return out


def _degree(
    call: Callable[[list[Any]], Any],
    leaves: Sequence[Any],
    units: Sequence[Unit],
    base: Any,
    j: int | None,
) -> float | None:
    """The degree of output ``j`` in ``units`` scaled together, or ``None``."""
    degrees = []
    for lam in _LAMBDAS:
        try:
            c = proportion(pick(call(_scaled(leaves, units, lam)), j), pick(base, j))
        except Exception:  # e.g. an op that rejects scaled inputs: not homogeneous
            return None
        if c is None:
            return None
        degrees.append(math.log(c) / math.log(lam))
    if abs(degrees[0] - degrees[1]) > 1e-3:
        return None
    d = degrees[0]
    return round(2 * d) / 2 if abs(2 * d - round(2 * d)) < 1e-3 else d


def probe(
    system: RatioSystem,
    call: Callable[[list[Any]], Any],
    leaves: Sequence[Any],
    units: dict[Unit, Hashable],
    outputs: dict[int | None, Hashable],
    offsets: dict[int | None, float],
    origin: str,
) -> bool:
    """Add to ``system`` how each output of ``call(leaves)`` (its variable in
    ``outputs``) scales with the inputs ``units`` (their variables), plus the
    constant ``offsets[j]``: ``R_out = sum(d * R_in) + offsets[j]``. Returns
    whether some input had to be anchored."""
    leaves = with_stand_ins(leaves, list(units))
    base = call(_scaled(leaves, (), 1.0))
    anchored = False
    for j, out_var in outputs.items():
        degrees = {u: _degree(call, leaves, [u], base, j) for u in units}
        failing = [u for u, d in degrees.items() if d is None]
        float_out = _is_float(pick(base, j))
        if not float_out:
            # a mask or index computed from data: it must not move
            for u in failing:
                system.anchor(units[u], 0.0, origin, at_input=True)
            anchored |= bool(failing)
            continue
        terms: dict[Hashable, float] = {out_var: 1.0}
        for u, d in degrees.items():
            if d:
                terms[units[u]] = terms.get(units[u], 0.0) - d
        if failing:
            joint = _degree(call, leaves, failing, base, j)
            if joint is None:
                for u in failing:
                    system.anchor(units[u], 0.0, origin, at_input=True)
                anchored = True
            else:
                first = units[failing[0]]
                for u in failing[1:]:
                    system.equal(units[u], first, 0.0, origin, at_input=True)
                terms[first] = terms.get(first, 0.0) - joint
        system.relate(terms, offsets.get(j, 0.0), origin)
    return anchored


def flatten_call(args: Any, kwargs: Any) -> tuple[list[Any], Any]:
    """The leaves of ``(args, kwargs)`` and how to rebuild them."""
    return pytree.tree_flatten((args, kwargs))


def unflatten_call(leaves: list[Any], spec: Any) -> tuple[Any, Any]:
    """``(args, kwargs)`` rebuilt from ``leaves``."""
    args, kwargs = pytree.tree_unflatten(leaves, spec)
    return args, kwargs
