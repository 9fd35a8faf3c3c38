"""Exporting the output of ``unit_scale``: fold its captured graph's scales into
a deep copy of the original module."""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Hashable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.fx import GraphModule, Interpreter, Node
from torch.overrides import TorchFunctionMode

from .. import functional as U
from .._torch_internals import drop_state_dict_hooks, pytree
from ..transforms._capture.engine import RunState, TransformedForward, transform_state
from ..transforms._unit.checkpoint import KEY
from ._graph import attention_ratios, graph_equations
from ._report import PlainExport, Unfolded, evaluating, measured_export, sequence_length
from ._solver import RatioSystem

__all__ = ["export_transformed", "is_unit_scaled"]

# How much changing a value's ratio costs: activations most (a plain model whose
# activations match the unit-scaled one's keeps norms' eps negligible), then
# parameters; variables that stand for no tensor (temperatures) nothing.
_ACTIVATION, _PARAMETER, _VIRTUAL = 1.0, 1e-6, 1e-12


def is_unit_scaled(module: nn.Module) -> bool:
    """Whether ``module`` is a ``unit_scale`` output (possibly with more
    transforms chained)."""
    state = transform_state(module)
    return state is not None and any(
        t.name == "unit_scale" for t in state.config.transforms
    )


def export_transformed(
    module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> PlainExport:
    """:func:`~unit_scaling.export.to_plain` of a ``unit_scale`` output."""
    state = transform_state(module)
    assert state is not None
    if not state.calls:
        raise ValueError(
            f"{type(module).__name__} has not been called since unit_scale: it "
            "initialises some parameters at its first call. Call it once (e.g. on "
            "the example batch), then export"
        )
    work = copy.deepcopy(module)  # its own captures; `module` is never touched
    graph = _run_graph(work, args, kwargs)
    plain = _untransformed(module)
    with evaluating(plain), _AttentionCalls() as calls:
        plain(*args, **kwargs)
    sites = sum(
        n.target is U.scaled_dot_product_attention for n in graph.gm.graph.nodes
    )
    if len(calls.scales) != sites:
        raise ValueError(
            f"the plain {type(module).__name__} calls scaled_dot_product_attention "
            f"{len(calls.scales)} times, its unit-scaled graph {sites} times: the "
            "two do not run the same ops, so the scales cannot be matched"
        )
    found = graph_equations(
        graph.gm,
        graph.env,
        graph.parameters,
        graph.call_inputs,
        calls.scales,
        RatioSystem(),
    )

    def cost(v: Hashable) -> float:
        if v in found.parameters:
            return _PARAMETER
        return _ACTIVATION if v in found.activations else _VIRTUAL

    values, conflicts = found.system.solve(cost)
    shifted = {name: (values[v], c) for v, (name, c) in found.shifted.items()}
    # (A parameter no equation mentions, such as a table read only as a norm's
    # input, which the norm's output does not depend on the scale of, keeps
    # its values.)
    multiplied = {
        name: values.get(v, 0.0)
        for v, name in graph.parameters.items()
        if name not in shifted
    }
    folded = _rescale(plain, multiplied, shifted)
    unfolded = [
        Unfolded(
            c.origin,
            "contradicts the other scales (no parameter can absorb it)",
            c.factor,
            f"multiply {_where(c.origin, c.at_input)} by {c.factor:.6g} in the "
            "plain model",
        )
        for c in conflicts
    ]
    unfolded += [
        Unfolded(op, reason, None, "keep this op unit-scaled, or fold it by hand")
        for op, reason in found.unfolded
    ]
    unfolded += _foreign_modules(plain)
    unfolded += [
        Unfolded(
            t.name,
            "it changes the numbers the model computes in (quantisation), which a "
            "plain model does not",
            None,
            f"export the model before {t.name} is applied",
        )
        for t in state.config.transforms
        if t.name == "simulate_format"
    ]
    seq_len = sequence_length(args, kwargs)
    ratios: dict[int, float] = {}
    notes = []
    if seq_len is not None:
        ratios = attention_ratios(found.attention, seq_len)
    if any(site and site.mask == "other" for site in found.attention):
        notes.append(
            "an attention mask that is neither causal nor full (padding) changes c "
            "too: the plain model matches batches masked as the example is"
        )
    return measured_export(
        work,
        plain,
        (args, kwargs),
        graph.output,
        seq_len,
        ratios,
        folded=folded,
        unfolded=unfolded,
        anchored=found.anchored,
        notes=notes,
    )


@dataclasses.dataclass
class _Graph:
    """The graph one eval-mode call ran, with the value of every node."""

    gm: GraphModule
    env: dict[Node, Any]
    parameters: dict[Node, str]  # placeholders that are parameters
    call_inputs: set[Node]  # placeholders the caller passed
    output: Any  # what the call returned


def _run_graph(
    work: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> _Graph:
    """Call the transformed ``work`` (a copy) in eval mode, and run the graph it
    captured again to keep every node's value."""
    with evaluating(work):
        output = work(*args, **kwargs)
    state = transform_state(work)
    assert state is not None
    ran = state.graphs_run_in_call
    if len(ran) != 1 or ran[0].replay_inputs is None:
        raise ValueError(
            f"{type(work).__name__} runs as {len(ran)} graphs on this batch (graph "
            "breaks): to_plain folds the scales of one captured graph. Remove the "
            "graph breaks (see the unit_scale warning), or export each part"
        )
    gm, specs = ran[0].graph_module, ran[0].replay_inputs
    # Ops that run in FP8 (unit_scaling.float8) are read as the unit-scaled
    # functions they compute: the trained master weights are what is exported.
    for node in gm.graph.nodes:
        exact = getattr(node.target, "high_precision", None)
        if node.op == "call_function" and callable(exact):
            node.target = exact
    gm.recompile()
    parameter_names = dict(work.named_parameters(remove_duplicate=False))
    tensors = {**dict(work.named_buffers(remove_duplicate=False)), **parameter_names}
    leaves = pytree.tree_leaves((args, kwargs))
    graph = _Graph(gm, {}, {}, set(), output)
    inputs = []
    for node, (kind, where) in zip(
        gm.graph.find_nodes(op="placeholder"), specs, strict=True
    ):
        if kind == "module":  # a parameter or buffer, by name
            inputs.append(tensors[where])
            if where in parameter_names:
                graph.parameters[node] = where
        elif kind == "leaf":  # an argument of the call, by position
            inputs.append(leaves[where])
            graph.call_inputs.add(node)
        else:
            inputs.append(where)
    interpreter = Interpreter(gm, garbage_collect_values=False)
    with evaluating(work):
        interpreter.run(*inputs)
    graph.env = interpreter.env
    return graph


class _AttentionCalls(TorchFunctionMode):
    """Records the ``scale=`` of each ``F.scaled_dot_product_attention`` call:
    ``unit_scale`` sets its own in the graph, the plain model keeps the model's."""

    def __init__(self) -> None:
        super().__init__()
        self.scales: list[float | None] = []

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            self.scales.append(kwargs.get("scale", args[6] if len(args) > 6 else None))
        return func(*args, **kwargs)


def _untransformed(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` without its transform wrapper, attributes and
    state-dict hooks, and without the unit_scaling record in a Hugging Face
    config: nothing in it refers to unit_scaling."""
    state = transform_state(module)
    assert state is not None
    added = {name for t in state.config.transforms for name, _ in t.attributes}
    copied = copy.deepcopy(module)
    for name, value in list(vars(copied).items()):
        if name in added or isinstance(value, (RunState, TransformedForward)):
            del copied.__dict__[name]
    config = getattr(copied, "config", None)
    if config is not None and hasattr(config, KEY):
        delattr(config, KEY)
    drop_state_dict_hooks(copied, "unit_scaling")  # unit_scale's record hooks
    _plain_parameters(copied)
    return copied


def _plain_parameters(module: nn.Module) -> None:
    """Make every parameter of ``module`` a plain ``nn.Parameter`` (``unit_scale``
    tags them as :class:`unit_scaling.Parameter`), keeping tied ones tied."""
    plain: dict[int, nn.Parameter] = {}
    for sub in module.modules():
        for name, param in list(sub.named_parameters(recurse=False)):
            if type(param) is nn.Parameter:
                continue
            if id(param) not in plain:
                plain[id(param)] = nn.Parameter(
                    param.detach().as_subclass(torch.Tensor),
                    requires_grad=param.requires_grad,
                )
            setattr(sub, name, plain[id(param)])


def _rescale(
    module: nn.Module,
    ratios: dict[str, float],
    shifted: dict[str, tuple[float, float]],
) -> dict[str, float]:
    """Multiply each named parameter ``w`` by ``exp(R)`` (a shifted one's gain
    ``c + w``); the factors, by canonical name (tied parameters once)."""
    canonical = {id(p): name for name, p in module.named_parameters()}
    folded = {}
    done: set[int] = set()
    with torch.no_grad():
        for name, (r, c) in {
            **{n: (r, 0.0) for n, r in ratios.items()},
            **shifted,
        }.items():
            p = module.get_parameter(name)
            if id(p) in done or r == 0:
                continue
            done.add(id(p))
            factor = math.exp(r)
            p.copy_((factor * (p.double() + c) - c).to(p.dtype))
            folded[canonical[id(p)]] = factor
    return folded


def _where(origin: str, at_input: bool) -> str:
    if origin == "graph output":
        return "the model's output"
    return f"the {'input' if at_input else 'output'} of {origin}"


# Classes of the library a plain model must not contain: unit-scaled layers,
# and the layers unit_scale swaps in (nn.MultiheadAttention's rewrite).
_LIBRARY_MODULES = ("unit_scaling.modules", "unit_scaling.transforms")


def _foreign_modules(module: nn.Module) -> list[Unfolded]:
    """Submodules of unit_scaling classes (layers ``unit_scale`` rewrote, such
    as ``nn.MultiheadAttention``): the plain model would still need the library."""
    return [
        Unfolded(
            f"{type(m).__name__} at {name}",
            "a unit_scaling module replaced the original layer",
            None,
            "rebuild the original layer from its parameters",
        )
        for name, m in module.named_modules()
        if type(m).__module__.startswith(_LIBRARY_MODULES)
    ]
