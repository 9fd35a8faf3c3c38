"""Annotated-code view of a module's scales: :func:`analyse_module`.

Needs no plotting dependencies (see :mod:`unit_scaling.analysis` for plots and
data frames).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.fx import Graph, Node
from torch.utils import _pytree as pytree

from .transforms import track_scales

__all__ = ["analyse_module"]

# Operators rendered as Python syntax rather than as calls.
_BINARY_OPERATORS: dict[Callable[..., Any], str] = {
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


def _target_name(node: Node) -> str:
    """A short readable name of what ``node`` computes, e.g. ``"U.linear"``."""
    target = node.target
    if node.op in ("placeholder", "output"):
        return node.op
    if node.op == "call_method" or isinstance(target, str):
        return str(target)
    if target in _BINARY_OPERATORS or target is operator.getitem:
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


def _reference_names(graph: Graph) -> dict[Node, str]:
    """How each node is referred to in the code: parameters as ``self.<path>``."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    counts: dict[str, int] = {}
    for node in placeholders:
        clean = node.meta.get("clean_name", node.name)
        counts[clean] = counts.get(clean, 0) + 1
    names = {}
    for node in graph.nodes:
        clean = node.meta.get("clean_name", node.name)
        if node.op == "placeholder" and node.meta.get("requires_grad", False):
            names[node] = f"self.{clean}"
        elif node.op == "placeholder" and counts[clean] == 1 and clean.isidentifier():
            names[node] = clean
        else:
            names[node] = node.name
    return names


def _format_arg(value: Any, names: dict[Node, str]) -> str:
    if isinstance(value, Node):
        return names[value]
    if isinstance(value, tuple):
        inner = ", ".join(_format_arg(v, names) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        return "[" + ", ".join(_format_arg(v, names) for v in value) + "]"
    if isinstance(value, dict):
        items = (f"{k!r}: {_format_arg(v, names)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    if isinstance(value, slice):
        parts = (value.start, value.stop, value.step)
        text = ":".join("" if p is None else _format_arg(p, names) for p in parts)
        return text[:-1] if text.endswith(":") and value.step is None else text
    if value is Ellipsis:
        return "..."
    if isinstance(value, torch.dtype):
        return str(value)
    return repr(value)


def _expression(node: Node, names: dict[Node, str]) -> str:
    """The right-hand side of ``node``'s line of code."""
    args = [_format_arg(a, names) for a in node.args]
    args += [f"{k}={_format_arg(v, names)}" for k, v in node.kwargs.items()]
    target = node.target
    if node.op == "call_function" and target in _BINARY_OPERATORS and len(args) == 2:
        return f"{args[0]} {_BINARY_OPERATORS[target]} {args[1]}"
    if node.op == "call_function" and target is operator.getitem and len(args) == 2:
        index = node.args[1]
        inner = args[1][1:-1] if isinstance(index, tuple) and index else args[1]
        return f"{args[0]}[{inner}]"
    if node.op == "call_method":
        return f"{args[0]}.{target}({', '.join(args[1:])})"
    if node.op == "call_module":
        return f"self.{target}({', '.join(args)})"
    if node.op == "get_attr":
        return f"self.{target}"
    return f"{_target_name(node)}({', '.join(args)})"


def _annotation(node: Node) -> str:
    metrics = node.meta.get("metrics")
    if metrics is None:
        return ""
    text = f"(-> {metrics.fwd.std:.3g}"
    if metrics.bwd is not None:
        text += f", <- {metrics.bwd.std:.3g}"
    return text + ")"


def _is_shape_symbol(node: Node) -> bool:
    """A size that Dynamo lifted into an input (dynamic shapes), not a user input."""
    value = node.meta.get("example_value")
    return node.op == "placeholder" and isinstance(value, (int, torch.SymInt))


def _annotated_code(graph: Graph) -> str:
    names = _reference_names(graph)
    inputs = [
        names[n]
        for n in graph.nodes
        if n.op == "placeholder"
        and not n.meta.get("requires_grad", False)
        and not _is_shape_symbol(n)
    ]
    lines: list[tuple[str, str]] = []
    for node in graph.nodes:
        if _is_shape_symbol(node):
            continue
        if node.op == "output":
            # Graphs without a recorded output value end without a return line.
            if node.args and node.args[0] is not None:
                lines.append((f"return {_format_arg(node.args[0], names)}", ""))
        elif node.op == "placeholder":
            lines.append((names[node], _annotation(node)))
        else:
            lines.append(
                (f"{names[node]} = {_expression(node, names)}", _annotation(node))
            )
    width = max((len(code) for code, note in lines if note), default=0)
    body = [
        f"    {code.ljust(width)}  {note}".rstrip() if note else f"    {code}"
        for code, note in lines
    ]
    return "\n".join([f"def forward({', '.join(inputs)}):", *body])


def _default_gradients(outputs: list[Tensor]) -> list[Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [
        torch.ones_like(t)
        if t.numel() == 1
        else torch.randn(t.shape, generator=generator, dtype=t.dtype).to(t.device)
        for t in outputs
    ]


def analyse_module(
    module: nn.Module,
    inputs: Tensor | tuple[Any, ...],
    backward: Tensor | tuple[Tensor, ...] | None = None,
) -> str:
    """The module's traced code, each line annotated with the scale it produces.

    Runs ``module`` once under :func:`unit_scaling.transforms.track_scales` (on a
    copy: ``module`` itself is not changed), backpropagates a gradient, and
    renders the captured graph as Python-like code. Every line that produces a
    floating-point tensor ends with ``(-> fwd_std, <- bwd_std)``: the standard
    deviation of the tensor and of its gradient. Parameters appear as
    ``self.<name>``; graph breaks show as consecutive graphs in one listing.

    Args:
        module: the module to analyse (unit-scaled or not).
        inputs: a tensor, or a tuple of positional arguments for ``forward``.
            Floating-point inputs get ``requires_grad_()`` so their gradients show.
        backward: the gradient of the output (a tensor, or a tuple matching the
            floating-point tensors of the output). Default: a unit-normal gradient
            (fixed seed), or ``1`` for a one-element output such as a loss; no
            backward pass when the output does not require grad.

    Returns:
        The annotated code, one line per graph node.

    Example (arguments abridged)::

        >>> print(analyse_module(uu.Linear(16, 32), torch.randn(64, 16)))
        def forward(input):
            self.weight                                 (-> 0.98, <- 0.975)
            input                                       (-> 1.01, <- 1.43)
            linear = U.linear(input, self.weight, ...)  (-> 0.997, <- 1.02)
    """
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    tracked = track_scales(module)
    output = tracked(*args)
    outputs = [
        t
        for t in pytree.tree_leaves(output)
        if isinstance(t, Tensor) and t.is_floating_point() and t.requires_grad
    ]
    if outputs:
        if backward is None:
            grads = _default_gradients(outputs)
        else:
            grads = list(backward) if isinstance(backward, tuple) else [backward]
        if len(grads) != len(outputs):
            raise ValueError(
                f"analyse_module: backward holds {len(grads)} gradient(s) but the "
                f"output has {len(outputs)} floating-point tensor(s) requiring grad; "
                "pass one gradient per tensor, in output order"
            )
        torch.autograd.backward(outputs, grads)
    elif backward is not None:
        raise ValueError(
            "analyse_module: backward was given but the module's output does not "
            "require grad (no float inputs or parameters feed it)"
        )
    graph: Graph = tracked.scales_graph()  # type: ignore[operator]
    return _annotated_code(graph)
