"""Everything that touches TorchDynamo and functorch internals lives here.

The transforms capture a module's forward pass with TorchDynamo, rewrite the FX
graph it produces, and run the rewritten graph (``engine``). What here depends
on details that public APIs do not expose is pinned by
``tests/transforms/test_dynamo_internals.py``, which fails loudly if a torch
upgrade breaks it:

1. **Opaque unit-scaled functions.** While capturing, our own ``U.*`` functions
   must appear as single graph nodes (otherwise the ``F.*`` calls inside them would
   be unit-scaled a second time). We mark them "allowed in graph" only for the
   duration of each call, through ``trace_rules._allowed_callable_ids``.
2. **A fresh code object per transformed module.** Dynamo caches compiled frames
   on the code object, shared by every instance of a class; after
   ``recompile_limit`` instances it silently falls back to eager. Each transformed
   module gets its own copy of its class's ``forward`` code (filed under a pseudo
   file name when it comes from torch's own files, which ``torch.compile`` would
   otherwise wrap in one shared frame).
3. **Readable placeholder names**, from Dynamo's ``Source`` objects
   (``GraphArg.source``), and the **concrete values** of symbolic sizes.
4. **Graph-break counters** (``torch._dynamo.utils.counters``), to report why a
   graph broke.
5. **functorch levels**: code Dynamo traced under ``vmap`` (as
   ``associative_scan`` does) must stay whole; a failure half-way through it must
   not leave a vmap level open.
"""

from __future__ import annotations

import contextlib
import itertools
import types
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch._dynamo
from torch import nn
from torch._dynamo import trace_rules
from torch._dynamo.utils import counters
from torch.fx import GraphModule
from torch.utils._python_dispatch import _get_current_dispatch_mode

from ..._torch_internals import (
    NESTED_GRAPH_BREAKS_WORK,
    PARAMETER_DATA_SWAPS_RECOMPILE,
    symint_hint,
)

__all__ = [
    "UNTRACEABLE",
    "break_reasons",
    "capturing",
    "concrete",
    "dispatch_mode_active",
    "fresh_forward",
    "functorch_sections",
    "inductor_backend",
    "is_functorch_internal",
    "name_placeholders",
    "opaque_functions",
    "restore_functorch_levels",
]


@contextlib.contextmanager
def opaque_functions(functions: Sequence[Callable[..., Any]]) -> Iterator[None]:
    """Make Dynamo record calls to ``functions`` as single nodes, for this block."""
    allowed = trace_rules._allowed_callable_ids
    added = [id(f) for f in functions if id(f) not in allowed()]
    for fn_id in added:
        allowed.add(fn_id)
    try:
        yield
    finally:
        for fn_id in added:
            allowed.remove(fn_id)


_CLONES = itertools.count()

# Dynamo's limit on compiled versions of one code object, while a transformed
# module runs. After a graph break, code that several module instances share
# (the ``forward`` of each of 24 decoder layers, say) resumes in frames of its
# own, compiled once per instance (guards check the module) and per input shape;
# at torch's default of 8, later layers would run untransformed.
_RECOMPILE_LIMIT = 256


def fresh_forward(module: nn.Module) -> Callable[..., Any]:
    """``type(module).forward`` rebuilt on a private copy of its code object, as a
    plain function (call it with the module as its first argument).

    A new code object starts with an empty Dynamo cache; a unique name also keeps
    Dynamo's per-function state (automatic dynamic shapes, keyed by file, line
    and name) from leaking between transformed modules. Code from torch's own
    files (``nn.Linear.forward``, ``nn.Sequential.forward``) is filed under a
    pseudo file name: ``torch.compile`` would otherwise wrap such a function in
    a frame of its own (``external_utils.wrap_inline``), whose one code object
    all transformed torch modules would share, and after ``recompile_limit`` of
    them Dynamo would run the rest eagerly.
    """
    fn = type(module).forward
    while hasattr(fn, "__func__"):  # a classmethod-like descriptor, say
        fn = fn.__func__
    code = fn.__code__
    changes: dict[str, Any] = {"co_name": f"{code.co_name}_{next(_CLONES)}"}
    if torch._dynamo.trace_rules.check(fn):  # a torch file: skipped as a top frame
        changes["co_filename"] = f"<unit_scaling copy of {code.co_filename}>"
    clone = types.FunctionType(
        code.replace(**changes),
        fn.__globals__,
        fn.__name__,
        fn.__defaults__,
        fn.__closure__,
    )
    clone.__kwdefaults__ = fn.__kwdefaults__
    clone.__dict__.update(fn.__dict__)
    clone.__wrapped__ = fn  # type: ignore[attr-defined]
    return clone


# --------------------------------------------------------------------------- #
# Placeholder names: Dynamo's Source objects, decomposed.
# --------------------------------------------------------------------------- #

_Step = tuple[str, Any]  # ("attr", name) | ("item", key) | ("size", i) | ...


def _source_steps(source: Any) -> tuple[str, list[_Step]] | None:
    """Decompose a Dynamo ``Source`` into a root local name and access steps.

    Returns ``None`` for sources outside that simple form (globals, closures...).
    """
    from torch._dynamo import source as dsrc
    from torch._dynamo.source import TensorProperty

    steps: list[_Step] = []
    while True:
        if isinstance(source, dsrc.LocalSource):
            steps.reverse()
            return source.local_name, steps
        if isinstance(source, dsrc.TensorPropertySource):
            if source.prop is not TensorProperty.SIZE:
                return None
            steps.append(("size", source.idx))
        elif isinstance(source, dsrc.AttrSource):
            steps.append(("attr", source.member))
        elif isinstance(source, (dsrc.DictGetItemSource, dsrc.GetItemSource)):
            index = source.index
            sliced = getattr(source, "index_is_slice", False)
            if isinstance(index, dsrc.Source) or sliced:  # type: ignore[attr-defined]
                return None
            steps.append(("item", index))
        elif not isinstance(source, dsrc.NNModuleSource):
            return None
        source = source.base


def _reads_module(steps: list[_Step]) -> bool:
    """Whether ``steps`` start by reading a module's children or tensors."""
    return bool(steps) and steps[0][1] in (
        "_modules",
        "_parameters",
        "_buffers",
        "__dict__",
    )


def _readable_name(root: str, steps: list[_Step], self_name: str) -> str:
    """``self._modules['h']._modules['0']._parameters['weight']`` -> ``h.0.weight``."""
    omit = root in (self_name, "kwargs", "fn") or root.endswith("self")
    if root == "__nested_frame_values":
        # An outer frame's local (its ``self``, say), in a frame Dynamo resumed
        # after a graph break inside a nested call.
        while steps and steps[0][0] == "item" and isinstance(steps[0][1], int):
            steps = steps[1:]
        omit = _reads_module(steps)
    if root == "args" and steps[:1] == [("item", 0)] and _reads_module(steps[1:]):
        # A forward wrapped by a ``def wrapper(*args, **kwargs)`` decorator
        # (transformers >= 5.24 wraps its models' forwards): ``self`` is args[0].
        omit, steps = True, steps[1:]
    parts = [] if omit else [root]
    for kind, key in steps:
        if kind == "attr" and key in ("_modules", "_parameters", "_buffers"):
            continue
        if kind == "attr" and key == "__dict__":  # self.__dict__["_modules"]...
            continue
        if kind == "item" and key in ("_modules", "_parameters", "_buffers"):
            continue  # (reached through __dict__)
        parts.append(str(key) if kind in ("attr", "item") else f"{kind}({key})")
    return ".".join(parts)


def name_placeholders(gm: GraphModule, self_name: str) -> None:
    """Set ``meta["source_name"]`` of each placeholder to a readable name, and
    ``meta["call_argument"]`` to whether it is an argument of the call itself (or
    an item of one), rather than read off a tensor (its size) or a module (read
    while the backend runs: Dynamo drops ``meta["grapharg"]`` afterwards)."""
    for node in gm.graph.find_nodes(op="placeholder"):
        arg = node.meta.get("grapharg")
        steps = _source_steps(arg.source) if arg is not None else None
        if steps is not None:
            node.meta["source_name"] = _readable_name(*steps, self_name)
            root, path = steps
            node.meta["call_argument"] = root != self_name and all(
                kind == "item" for kind, _ in path
            )


def anchor_module_paths(
    gm: GraphModule,
    example_inputs: Sequence[Any],
    names: dict[int, list[str]],
    modules: set[str],
) -> None:
    """Make the module paths of ``gm``'s nodes (``meta["nn_module_stack"]``)
    start at the transformed module even when Dynamo captured a frame inside one
    of its submodules: the forward resumed after a graph break, e.g. at the hooks
    of a block sharded by FSDP2, where ``self`` is that block. The block's path
    (one of ``modules``) is read off its parameters: the name ``names`` gives
    each (by ``id``) ends with the name its placeholder reads from the frame."""
    prefixes: dict[str, set[str]] = {}
    placeholders = gm.graph.find_nodes(op="placeholder")
    for node, value in zip(placeholders, example_inputs, strict=False):
        arg = node.meta.get("grapharg")
        steps = _source_steps(arg.source) if arg is not None else None
        relative = node.meta.get("source_name")
        if steps is None or not relative or id(value) not in names:
            continue
        for full in names[id(value)]:
            if full == relative or full.endswith("." + relative):
                prefixes.setdefault(steps[0], set()).add(full[: -len(relative)])
    roots = {
        f"L['{root}']": found.pop().rstrip(".")
        for root, found in prefixes.items()
        if len(found) == 1 and next(iter(found)).rstrip(".") in modules - {""}
    }
    if not roots:
        return
    for node in gm.graph.nodes:
        stack = node.meta.get("nn_module_stack")
        for key, (path, kind) in list((stack or {}).items()):
            root = next((r for r in roots if str(path).startswith(r)), None)
            if root is not None:
                stack[key] = (f"{root}.{roots[root]}{str(path)[len(root) :]}", kind)


def concrete(value: Any) -> Any:
    """A symbolic size Dynamo passes for a dynamic-shape graph, as the concrete
    value it had in this call (its hint); anything else unchanged."""
    if isinstance(value, torch.SymInt):
        return symint_hint(value)
    if isinstance(value, (torch.SymFloat, torch.SymBool)):
        return value.node.hint
    return value


def break_reasons() -> Counter[str]:
    """Dynamo's running counts of graph breaks (and of constructs it skipped)."""
    return Counter(counters["graph_break"]) + Counter(counters["unimplemented"])


# The errors Dynamo raises for code it cannot capture.
UNTRACEABLE = (torch._dynamo.exc.Unsupported, torch._dynamo.exc.UserError)


@contextlib.contextmanager
def capturing(non_recurse: Sequence[Callable[..., Any]]) -> Iterator[None]:
    """The settings of every capture: ``non_recurse`` recorded as single calls,
    scales kept as Python numbers in the graph (never 0-d inputs), and room for
    a compiled frame per layer (see ``_RECOMPILE_LIMIT``; FSDP2-sharded layers
    included), and graph breaks that resume inside the nested call where they
    happen.

    Without ``nested_graph_breaks``, a break in a function called from the
    traced frame (a mixture-of-experts layer's data-dependent expert loop, say)
    makes Dynamo re-trace the outer frame up to that call, once per break:
    Switch Transformers' first output took 10.8 s, now 8.4 s (a plain
    ``torch.compile(backend="eager")`` of that model: 9.9 s, now 8.3 s). Off on
    torch 2.11, whose nested graph breaks can mix up a frame's locals
    (``NESTED_GRAPH_BREAKS_WORK``). There too, the guards on the parameters'
    tensors are kept, or a parameter given new data in place would go unseen
    (``PARAMETER_DATA_SWAPS_RECOMPILE``)."""
    guards: dict[str, Any] = (
        {}
        if PARAMETER_DATA_SWAPS_RECOMPILE
        else {"skip_tensor_guards_with_matching_dict_tags": False}
    )
    with (
        opaque_functions(non_recurse),
        torch._dynamo.config.patch(
            specialize_float=True,
            recompile_limit=_RECOMPILE_LIMIT,
            nested_graph_breaks=NESTED_GRAPH_BREAKS_WORK,
            # FSDP2-sharded blocks of one class would otherwise share one graph,
            # but each has its own scales (u-μP's residual weight by depth).
            skip_fsdp_guards=False,
            **guards,
        ),
    ):
        yield


def dispatch_mode_active() -> bool:
    """Whether a TorchDispatchMode is active (Dynamo does not run under one)."""
    return _get_current_dispatch_mode() is not None


# --------------------------------------------------------------------------- #
# functorch: graphs of vmap-traced code (e.g. associative_scan's generic mode).
# --------------------------------------------------------------------------- #


def is_functorch_internal(target: Any) -> bool:
    """Whether a graph target is one of functorch's level-manipulating internals
    (``_vmap_increment_nesting``, ``_add_batch_dim``, ...), which Dynamo inlines
    when it traces ``vmap``: such ops only make sense in a whole graph, between
    their matching increment and decrement."""
    module = getattr(target, "__module__", None) or ""
    return module.startswith(("torch._functorch", "torch._C._functorch"))


@contextlib.contextmanager
def restore_functorch_levels() -> Iterator[None]:
    """Undo functorch levels left open by a graph that failed half-way through a
    vmap-traced region, so that the failure does not leak into later calls."""
    functorch = torch._C._functorch
    before = functorch.maybe_current_level()
    try:
        yield
    finally:
        while True:
            level = functorch.maybe_current_level()
            if level is None or (before is not None and level <= before):
                break
            functorch._vmap_decrement_nesting()


def functorch_sections(graph: Any) -> list[list[Any]]:
    """The runs of nodes between ``_vmap_increment_nesting`` and the matching
    ``_vmap_decrement_nesting`` (both included): code Dynamo traced under
    ``vmap``, whose tensors carry batch levels and must be left as they are."""
    sections: list[list[Any]] = []
    depth = 0
    for node in graph.nodes:
        name = getattr(node.target, "__name__", "")
        internal = is_functorch_internal(node.target)
        if internal and name == "_vmap_increment_nesting":
            if depth == 0:
                sections.append([])
            depth += 1
        if depth > 0:
            sections[-1].append(node)
        if internal and name == "_vmap_decrement_nesting":
            depth = max(depth - 1, 0)
    return sections


def inductor_backend() -> Callable[..., Any]:
    """Inductor as a Dynamo backend: ``(graph_module, example_inputs) ->
    callable``, the compiler ``torch.compile`` uses by default."""
    backend: Callable[..., Any] = torch._dynamo.lookup_backend("inductor")
    return backend
