"""Replay: running a captured, rewritten graph without TorchDynamo.

Two situations cannot capture with Dynamo: an outer ``torch.compile`` tracing a
transformed module (Dynamo inlines the inner compile's original function, which
would silently drop the rewrite), and a TorchDispatchMode (FlopCounterMode, memory
trackers), under which Dynamo does not run. Both replay the graph captured at an
earlier eager call with the same input signature: :func:`record` remembers, from
that call, where each graph input comes from (a module tensor, an argument, a
constant) and how to rebuild the forward's output from the graph's outputs.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.fx import GraphModule

from ..._torch_internals import pytree

__all__ = ["InputSpec", "Replay", "input_specs", "record", "signature_key"]

logger = logging.getLogger("unit_scaling.transforms")

# Where a replayed graph input comes from: ("module", dotted tensor name) |
# ("leaf", index into the flattened (args, kwargs)) | ("const", value).
InputSpec = tuple[str, Any]


def signature_key(
    module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, ...]:
    """What a replayed graph is specialised on: modes, tensor metadata, constants."""

    def describe(x: Any) -> Any:
        if isinstance(x, Tensor):
            return ("T", tuple(x.shape), x.dtype, x.device.type, x.requires_grad)
        if isinstance(x, (int, float, bool, str, type(None))):
            return x
        return ("?", type(x).__name__)

    leaves, spec = pytree.tree_flatten((args, kwargs))
    return (
        module.training,
        torch.is_grad_enabled(),
        str(spec),
        tuple(describe(x) for x in leaves),
    )


def input_specs(
    module: nn.Module, call: tuple[Any, ...], example_inputs: Sequence[Any]
) -> list[InputSpec] | None:
    """Match each graph input to the module tensor or call argument it *is*.

    Dynamo passes the real objects as example inputs, so identity tells us where
    each comes from, whichever frame Dynamo happened to start tracing in. Sizes
    (dynamic shapes) are constants of a replay, which is keyed by exact shapes.
    """
    owners = {
        id(t): name for name, t in module.named_parameters(remove_duplicate=False)
    }
    owners.update(
        (id(t), name) for name, t in module.named_buffers(remove_duplicate=False)
    )
    leaves = {id(x): i for i, x in enumerate(pytree.tree_leaves(call))}
    specs: list[InputSpec] = []
    for value in example_inputs:
        if isinstance(value, (int, float, bool)):
            specs.append(("const", value))
        elif id(value) in owners:
            specs.append(("module", owners[id(value)]))
        elif id(value) in leaves:
            specs.append(("leaf", leaves[id(value)]))
        else:
            return None
    return specs


def _module_tensor(module: nn.Module, name: str) -> Any:
    for part in name.split("."):
        module = getattr(module, part)
    return module


@dataclasses.dataclass
class Replay:
    """A rewritten graph plus how to feed it and rebuild the forward's output."""

    graph_module: GraphModule
    inputs: list[InputSpec]
    output_spec: pytree.TreeSpec
    # For each output leaf: ("graph", index) | ("leaf", index) | ("const", value)
    output_leaves: list[tuple[str, Any]]

    def __call__(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        leaves = pytree.tree_leaves((args, kwargs))
        flat_inputs = [
            _module_tensor(module, where)
            if kind == "module"
            else leaves[where]
            if kind == "leaf"
            else where
            for kind, where in self.inputs
        ]
        outputs = self.graph_module(*flat_inputs)
        rebuilt = [
            outputs[where]
            if kind == "graph"
            else leaves[where]
            if kind == "leaf"
            else where
            for kind, where in self.output_leaves
        ]
        return pytree.tree_unflatten(rebuilt, self.output_spec)


def record(
    graph_module: GraphModule,
    inputs: list[InputSpec] | None,
    graph_outputs: tuple[Any, ...] | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    output: Any,
) -> Replay | None:
    """How to replay ``graph_module`` for calls like ``(args, kwargs)``, from the
    call that produced ``output`` (whose graph returned ``graph_outputs``); None
    where the output holds something that cannot be rebuilt."""
    if inputs is None or graph_outputs is None:
        return None
    by_id_out = {id(t): i for i, t in enumerate(graph_outputs)}
    by_id_in = {id(x): i for i, x in enumerate(pytree.tree_leaves((args, kwargs)))}
    leaves, spec = pytree.tree_flatten(output)
    mapped: list[tuple[str, Any]] = []
    for leaf in leaves:
        if isinstance(leaf, Tensor) and id(leaf) in by_id_out:
            mapped.append(("graph", by_id_out[id(leaf)]))
        elif isinstance(leaf, Tensor) and id(leaf) in by_id_in:
            mapped.append(("leaf", by_id_in[id(leaf)]))
        elif isinstance(leaf, (int, float, bool, str, type(None))):
            mapped.append(("const", leaf))
        else:
            logger.info(
                "forward output holds a %s that cannot be rebuilt; "
                "torch.compile of this module will run it eagerly",
                type(leaf).__name__,
            )
            return None
    return Replay(graph_module, inputs, spec, mapped)
