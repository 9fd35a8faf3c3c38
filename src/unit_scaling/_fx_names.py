"""Readable names of FX graph nodes' targets, shared by the code view
(:mod:`unit_scaling.utils`) and the data frames of :mod:`unit_scaling.analysis`."""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from typing import Any

import torch
from torch.fx import Node

__all__ = ["BINARY_OPERATORS", "module_path", "target_name"]

# Operators rendered as Python syntax rather than as calls.
BINARY_OPERATORS: dict[Callable[..., Any], str] = {
    operator.add: "+",
    operator.iadd: "+",
    operator.sub: "-",
    operator.mul: "*",
    operator.truediv: "/",
    operator.floordiv: "//",
    operator.pow: "**",
    operator.matmul: "@",
}
# Prefixes under which users usually import these modules.
_MODULE_ALIASES = {
    "torch.nn.functional": "F",
    "torch._C._nn": "F",
    "unit_scaling.functional": "U",
    "unit_scaling.core.functional": "U",
}


def target_name(node: Node) -> str:
    """A short readable name of what ``node`` computes, e.g. ``"U.linear"``."""
    target = node.target
    if node.op in ("placeholder", "output"):
        return node.op
    if node.op == "call_method" or isinstance(target, str):
        return str(target)
    if target in BINARY_OPERATORS or target is operator.getitem:
        return getattr(target, "__name__", str(target))
    name = getattr(target, "__name__", None)
    if name is None:
        return str(target)
    module = getattr(target, "__module__", None) or ""
    if module.startswith("unit_scaling.functional"):
        module = "unit_scaling.functional"
    if module in _MODULE_ALIASES:
        return f"{_MODULE_ALIASES[module]}.{name}"
    if module.startswith("torch") or getattr(target, "__self__", None) is torch:
        return f"torch.{name}"
    return str(name)


def module_path(node: Node) -> str:
    """The dotted path of the innermost module whose forward made ``node``,
    e.g. ``"layers.0.mhsa.linear_qkv"``; ``""`` outside any submodule."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    path = str(list(stack.values())[-1][0])
    # Dynamo writes paths from the captured frame's locals: L['self'].h[0].attn,
    # L['fn'].__self__.layers._modules['0'] (our forward is a bound method), or
    # L['args'][0].model (a forward wrapped by a ``*args`` decorator), or
    # L['__nested_frame_values'][0][1].lm_head (an outer frame's ``self``, in a
    # frame Dynamo resumed after a graph break in a nested call).
    path = re.sub(
        r"^L\['__nested_frame_values'\](\[\d+\])*"
        r"|^L\['args'\]\[0\]|^L\['[^']*'\](\.__self__)?",
        "",
        path,
    )
    path = re.sub(r"_modules\['([^']*)'\]", r"\1", path)
    return re.sub(r"\[['\"]?([^'\"\]]*)['\"]?\]", r".\1", path).strip(".")
