"""Every unit-scaled function accepts its torch counterpart's arguments as torch does.

Models call ``F.*``/``torch.*`` functions positionally and by keyword, and the
``unit_scale`` transform replaces the call target but keeps the arguments, so
each torch parameter must be accepted under its torch name, at its torch
position when torch takes it positionally, and with torch's default; our own
extras (``constraint``, ``mult``, ...) come after all of torch's positional
parameters. The pairs checked are every ``torch_map`` entry and every public
``U`` function whose name ``torch.nn.functional`` or ``torch`` also has, so a new
function is checked without being listed here.

Torch's signature is read with :func:`inspect.signature` where it is concrete,
and otherwise (C builtins, ``boolean_dispatch`` wrappers, ``*args`` functions)
from the signature line that opens its docstring. ``out=`` is not required: it
writes into a preallocated tensor, which autograd does not support.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import unit_scaling.functional as U
from unit_scaling._torch_internals import torch_version
from unit_scaling.functional import torch_map

P = inspect.Parameter
_POSITIONAL = (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)
_NO_DEFAULT = object()


def _from_docstring(fn: Callable[..., Any]) -> list[P] | None:
    doc = (fn.__doc__ or "").strip()
    name = getattr(fn, "__name__", "")
    if not doc.startswith(name + "("):
        return None
    depth, end = 0, -1
    for i, char in enumerate(doc):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and char == ")":
            end = i
            break
    args = " ".join(doc[len(name) + 1 : end].split())
    node = ast.parse(f"def f({args}): pass").body[0]
    assert isinstance(node, ast.FunctionDef)
    a = node.args
    params: list[P] = []
    positional = [*a.posonlyargs, *a.args]
    defaults = [_NO_DEFAULT] * (len(positional) - len(a.defaults)) + list(a.defaults)
    for i, (arg, default) in enumerate(zip(positional, defaults, strict=True)):
        kind = P.POSITIONAL_ONLY if i < len(a.posonlyargs) else P.POSITIONAL_OR_KEYWORD
        params.append(P(arg.arg, kind, default=_literal(default)))
    if a.vararg is not None:
        params.append(P(a.vararg.arg, P.VAR_POSITIONAL))
    for arg, kw_default in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        default = _NO_DEFAULT if kw_default is None else _literal(kw_default)
        params.append(P(arg.arg, P.KEYWORD_ONLY, default=default))
    return params


def _literal(node: Any) -> Any:
    if node is _NO_DEFAULT:
        return P.empty
    try:
        return ast.literal_eval(node)
    except ValueError:
        return _NO_DEFAULT  # a default we cannot compare (a name, a call)


def torch_parameters(fn: Callable[..., Any]) -> list[P] | None:
    """Torch's parameters of ``fn``, without ``out``; ``None`` if unknown."""
    params: list[P] | None = None
    try:
        found = list(inspect.signature(fn).parameters.values())
        if not any(p.kind in (P.VAR_POSITIONAL, P.VAR_KEYWORD) for p in found):
            params = found
    except (TypeError, ValueError):
        pass
    if params is None:
        params = _from_docstring(fn)
    return None if params is None else [p for p in params if p.name != "out"]


Pair = tuple[Callable[..., Any], Callable[..., Any]]


def _pairs() -> list[Pair]:
    """``torch_map``, and each ``U`` name's ``F`` function (else ``torch``'s)."""
    pairs = list(torch_map.items())
    for name in U.__all__:
        torch_fn = getattr(F, name, None) or getattr(torch, name, None)
        if callable(torch_fn) and not isinstance(torch_fn, type):
            pairs.append((torch_fn, getattr(U, name)))
    unique = {(id(t), u.__name__): (t, u) for t, u in pairs}
    return list(unique.values())


def _id(pair: Pair) -> str:
    torch_fn, unit_fn = pair
    module = getattr(torch_fn, "__module__", None) or "torch"
    return f"{module.split('.')[-1]}.{torch_fn.__name__}->U.{unit_fn.__name__}"


# Deliberate differences, each with its reason; strict, so that a change makes
# this list fail until it is updated.
KNOWN_MISMATCHES = {
    "torch.matmul->U.matmul": "the SPEC (§1.4) names U.matmul's operands left/right",
}
if torch_version() < (2, 13):
    KNOWN_MISMATCHES["torch.bmm->U.bmm"] = (
        "torch 2.11 and 2.12's bmm takes out_dtype third (gone in 2.13); U.bmm's "
        "third is constraint, which refuses a dtype with a ValueError"
    )


def signature_problems(torch_params: list[P], ours: list[P]) -> list[str]:
    """What stops ``ours`` from accepting every call ``torch_params`` accepts.

    A torch positional parameter must be ours at the same position (same name,
    unless torch's is positional-only), which also keeps our extras after them.
    """
    problems: list[str] = []
    by_name = {p.name: p for p in ours}
    ours_positional = [p for p in ours if p.kind in _POSITIONAL]
    torch_positional = [p for p in torch_params if p.kind in _POSITIONAL]
    for i, theirs in enumerate(torch_positional):
        if i >= len(ours_positional):
            if not any(p.kind is P.VAR_POSITIONAL for p in ours):
                problems.append(f"positional {theirs.name!r} (#{i}) not accepted")
            continue
        mine = ours_positional[i]
        if theirs.kind is P.POSITIONAL_OR_KEYWORD and mine.name != theirs.name:
            problems.append(
                f"position {i} is {mine.name!r}, torch's is {theirs.name!r}"
            )
        elif theirs.kind is P.POSITIONAL_OR_KEYWORD and mine.kind is P.POSITIONAL_ONLY:
            problems.append(f"{theirs.name!r} must also be accepted by keyword")
    for theirs in torch_params:
        if theirs.kind is P.VAR_POSITIONAL:
            if not any(p.kind is P.VAR_POSITIONAL for p in ours):
                problems.append(f"*{theirs.name} not accepted")
            continue
        if theirs.kind is not P.KEYWORD_ONLY:
            continue
        mine = by_name.get(theirs.name)
        if mine is None or mine.kind not in (P.KEYWORD_ONLY, P.POSITIONAL_OR_KEYWORD):
            problems.append(f"keyword {theirs.name!r} not accepted")
    for theirs in torch_params:
        mine = by_name.get(theirs.name)
        if mine is None or theirs.default is _NO_DEFAULT:
            continue
        if theirs.default is P.empty:
            continue  # a default where torch requires the argument accepts more
        if mine.default is P.empty:
            problems.append(f"{theirs.name!r} has no default; torch's is optional")
        elif mine.default != theirs.default:
            problems.append(
                f"{theirs.name!r} defaults to {mine.default!r}, torch's to "
                f"{theirs.default!r}"
            )
    return problems


@pytest.mark.parametrize(
    "pair",
    [
        pytest.param(
            pair,
            id=_id(pair),
            marks=[pytest.mark.xfail(reason=KNOWN_MISMATCHES[_id(pair)], strict=True)]
            if _id(pair) in KNOWN_MISMATCHES
            else [],
        )
        for pair in _pairs()
    ],
)
def test_unit_function_accepts_torch_signature(pair: Pair) -> None:
    torch_fn, unit_fn = pair
    torch_params = torch_parameters(torch_fn)
    if torch_params is None:
        pytest.skip(f"torch publishes no signature for {torch_fn!r}")
    ours = list(inspect.signature(unit_fn).parameters.values())
    assert signature_problems(torch_params, ours) == []


def test_every_torch_map_key_has_a_readable_signature() -> None:
    unreadable = [
        _id((t, u))
        for t, u in torch_map.items()
        if torch_parameters(t) is None
        # (a private builtin such as torch._grouped_mm is read from its F alias)
        and torch_parameters(getattr(F, t.__name__.lstrip("_"), t)) is None
    ]
    assert unreadable == []


def test_the_checker_catches_the_mistakes_it_is_for() -> None:
    def torch_like(input: Any, inplace: bool = False) -> None: ...

    def extra_first(input: Any, mult: float = 1.0, inplace: bool = False) -> None: ...

    def missing(input: Any, mult: float = 1.0) -> None: ...

    def good(input: Any, inplace: bool = False, mult: float = 1.0) -> None: ...

    theirs = list(inspect.signature(torch_like).parameters.values())
    for fn, expected in [(extra_first, "position 1"), (missing, "position 1")]:
        problems = signature_problems(
            theirs, list(inspect.signature(fn).parameters.values())
        )
        assert any(expected in p for p in problems), problems
    assert (
        signature_problems(theirs, list(inspect.signature(good).parameters.values()))
        == []
    )
    keyword_only = _from_docstring(torch.gather)
    assert keyword_only is not None
    assert [(p.name, p.kind) for p in keyword_only][-2:] == [
        ("sparse_grad", P.KEYWORD_ONLY),
        ("out", P.KEYWORD_ONLY),
    ]


def test_softmax_takes_dtype_where_torch_softmax_does() -> None:
    x = torch.randn(4, 8)
    y = U.softmax(x, -1, torch.float64, constraint=None)  # torch.softmax's order
    assert y.dtype == torch.float64
    torch.testing.assert_close(
        y, U.softmax(x, -1, dtype=torch.float64, constraint=None)
    )
