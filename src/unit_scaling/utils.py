"""Annotated-code view of a module's scales: :func:`analyse_module`.

Needs no plotting dependencies (see :mod:`unit_scaling.analysis` for plots and
data frames).
"""

from __future__ import annotations

import itertools
import operator
import re
import warnings
from typing import Any

import torch
from torch import Tensor, nn
from torch.fx import Graph, Node

from ._fx_names import BINARY_OPERATORS, target_name
from ._standins import normal_like, seeded
from ._torch_internals import pytree
from .transforms import track_scales

__all__ = ["analyse_module"]


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
    if node.op == "call_function" and target in BINARY_OPERATORS and len(args) == 2:
        return f"{args[0]} {BINARY_OPERATORS[target]} {args[1]}"
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
    return f"{target_name(node)}({', '.join(args)})"


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


_ROOT = re.compile(r"^L\['[^']+'\]\.")


def _module_call(node: Node) -> tuple[str, str] | None:
    """``(call key, module path)`` of the outermost submodule call that produced
    ``node``, from Dynamo's ``nn_module_stack`` (``None`` at the top level)."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    key, (path, _) = next(iter(stack.items()))
    path = str(path)
    if not _ROOT.match(path):
        return None
    return str(key), _ROOT.sub("", path)


def _module_ref(path: str) -> str:
    """``layers.0.mlp`` -> ``self.layers[0].mlp``."""
    ref = "self"
    for part in path.split("."):
        if part.isidentifier():
            ref += f".{part}"
        elif part.isdigit():
            ref += f"[{part}]"
        else:
            ref += f"[{part!r}]"
    return ref


def _calls(graph: Graph) -> list[list[Node]]:
    """The graph's operations in order, consecutive ones from the same submodule
    call grouped. An operation with no module of its own (e.g. one inserted by
    a transform) joins the call around it, if the operations on both sides
    belong to the same call."""
    ops = [n for n in graph.nodes if n.op not in ("placeholder", "output")]
    keys = [_module_call(n) for n in ops]
    known = [i for i, k in enumerate(keys) if k is not None]
    for before, after in itertools.pairwise(known):
        if keys[before] == keys[after]:
            keys[before + 1 : after] = [keys[before]] * (after - before - 1)
    groups: list[list[Node]] = []
    for i, node in enumerate(ops):
        if keys[i] is not None and i > 0 and keys[i] == keys[i - 1]:
            groups[-1].append(node)
        else:
            groups.append([node])
    return groups


def _call_line(nodes: list[Node], names: dict[Node, str]) -> tuple[str, str]:
    """One line calling the submodule that computed ``nodes``: its outputs are
    the values used outside the call, its arguments the values it reads."""
    inside = set(nodes)
    call = _module_call(nodes[0]) or _module_call(nodes[-1])
    assert call is not None
    path = call[1]
    args: list[Node] = []
    for node in nodes:
        for arg in node.all_input_nodes:
            owned = arg.op == "placeholder" and _is_under(arg, path)
            if arg not in inside and arg not in args and not owned:
                args.append(arg)
    outputs = [n for n in nodes if any(u not in inside for u in n.users)]
    outputs = outputs or nodes[-1:]
    targets = ", ".join(names[n] for n in outputs)
    code = f"{targets} = {_module_ref(path)}({', '.join(names[a] for a in args)})"
    note = " ".join(filter(None, (_annotation(n) for n in outputs)))
    return code, note


def _with_parameter_ops(nodes: list[Node], path: str) -> list[Node]:
    """``nodes`` of one call, plus the operations outside it that only prepare
    its own parameters (e.g. a transform's scaling of a weight)."""
    inside = set(nodes)
    added: list[Node] = []
    grown = True
    while grown:
        grown = False
        for read in {r for n in inside for r in n.all_input_nodes} - inside:
            if (
                read.op != "placeholder"
                and _module_call(read) is None
                and all(u in inside for u in read.users)
                and all(r in inside or _is_under(r, path) for r in read.all_input_nodes)
            ):
                inside.add(read)
                added.append(read)
                grown = True
    return added + nodes


def _is_under(node: Node, path: str) -> bool:
    """Whether a placeholder is a parameter or buffer of the module at ``path``."""
    return str(node.meta.get("clean_name", "")).startswith(f"{path}.")


def _annotated_code(graph: Graph, recurse_modules: bool = True) -> str:
    names = _reference_names(graph)
    call_lines: dict[Node, tuple[str, str]] = {}  # at the last node of a call
    inside_calls: set[Node] = set()
    collapsed: list[str] = []
    for nodes in [] if recurse_modules else _calls(graph):
        call = _module_call(nodes[0])
        if call is not None:
            nodes = _with_parameter_ops(nodes, call[1])
            call_lines[nodes[-1]] = _call_line(nodes, names)
            inside_calls.update(nodes)
            collapsed.append(call[1])

    def hidden(node: Node) -> bool:
        """A shape symbol, or a parameter or buffer inside a collapsed call."""
        return _is_shape_symbol(node) or (
            node.op == "placeholder" and any(_is_under(node, p) for p in collapsed)
        )

    inputs = [
        names[n]
        for n in graph.nodes
        if n.op == "placeholder"
        and not n.meta.get("requires_grad", False)
        and not hidden(n)
    ]
    lines: list[tuple[str, str]] = []
    for node in graph.nodes:
        if hidden(node):
            continue
        if node in call_lines:
            lines.append(call_lines[node])
        elif node in inside_calls:
            continue
        elif node.op == "output":
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


def _highlight(code: str) -> str:
    """``code`` coloured for a terminal (ANSI codes) if pygments is installed."""
    try:
        from pygments import highlight  # type: ignore[import-untyped]
        from pygments.formatters import TerminalFormatter  # type: ignore[import-untyped]
        from pygments.lexers import PythonLexer  # type: ignore[import-untyped]
    except ImportError:
        warnings.warn(
            "analyse_module: syntax_highlight=True needs pygments (pip install "
            "pygments); returning plain text",
            UserWarning,
            stacklevel=3,
        )
        return code
    return str(highlight(code, PythonLexer(), TerminalFormatter())).rstrip("\n")


def _default_gradients(outputs: list[Tensor]) -> list[Tensor]:
    generator = seeded(0)
    return [
        torch.ones_like(t) if t.numel() == 1 else normal_like(t, generator)
        for t in outputs
    ]


def analyse_module(
    module: nn.Module,
    inputs: Tensor | tuple[Any, ...],
    backward: Tensor | tuple[Tensor, ...] | None = None,
    *,
    recurse_modules: bool = True,
    syntax_highlight: bool = False,
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
        recurse_modules: show the operations inside submodules (default). With
            ``False``, each call of a direct submodule of ``module`` is one line,
            ``out = self.block(x)``, annotated with the scale of its output; its
            arguments are the values the call reads, and its parameters are not
            listed.
        syntax_highlight: colour the code with ANSI terminal codes, for
            ``print``. Uses `pygments` when it is installed; without it, warns
            and returns plain text. Default ``False``: plain text, to compare
            or save (the reference library colours by default).

    Returns:
        The annotated code, one line per graph node (or submodule call).

    Example (columns aligned, arguments abridged)::

        >>> _ = torch.manual_seed(0)
        >>> print(analyse_module(uu.Linear(16, 32), torch.randn(64, 16)))
        def forward(input):
            self.weight                                   (-> 1.02, <- 1.03)
            input                                         (-> 1.03, <- 1.55)
            linear = U.linear(input, self.weight, ...)    (-> 1.06, <- 1.02)
            return (linear,)
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
    code = _annotated_code(graph, recurse_modules)
    return _highlight(code) if syntax_highlight else code
