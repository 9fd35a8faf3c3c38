"""Everything that touches TorchDynamo internals lives in this one module.

The transforms capture a module's forward pass with TorchDynamo, rewrite the FX
graph it produces, and run the rewritten graph. Three things here depend on
Dynamo details that public APIs do not expose, and ``tests/transforms/
test_dynamo_internals.py`` fails loudly if a torch upgrade breaks any of them:

1. **Opaque unit-scaled functions.** While capturing, our own ``U.*`` functions
   must appear as single graph nodes (otherwise the ``F.*`` calls inside them would
   be unit-scaled a second time). We mark them "allowed in graph" only for the
   duration of each call, through ``trace_rules._allowed_callable_ids``.
2. **A fresh code object per transformed module.** Dynamo caches compiled frames
   on the code object, shared by every instance of a class; after
   ``recompile_limit`` instances it silently falls back to eager. Each transformed
   module gets its own copy of its class's ``forward`` code.
3. **Replay under an outer ``torch.compile``.** Dynamo inlines the original
   function of a nested ``torch.compile``, so a user's ``torch.compile(model)`` would
   silently drop our rewrite. Instead, when traced by an outer compile, the forward
   replays the rewritten graph captured at the first eager call, mapping its inputs
   through Dynamo's ``Source`` objects (``GraphArg.source``).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import itertools
import logging
import types
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar, cast

import torch
import torch._dynamo
from torch import Tensor, nn
from torch._dynamo import trace_rules
from torch._dynamo.utils import counters
from torch.fx import GraphModule
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _get_current_dispatch_mode

logger = logging.getLogger(__name__)

M = TypeVar("M", bound=nn.Module)
GraphPass = Callable[[GraphModule], GraphModule]
Executor = Callable[[GraphModule, Sequence[Any]], Callable[..., Any]]

_STATE_ATTR = "_unit_scaling_transforms"


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


def _fresh_forward(module: nn.Module) -> Callable[..., Any]:
    """``module.forward`` rebuilt on a private copy of its code object."""
    bound = type(module).forward.__get__(module)
    fn = bound.__func__
    # A new code object starts with an empty Dynamo cache; a unique name also
    # keeps Dynamo's per-function state (automatic dynamic shapes, keyed by file,
    # line and name) from leaking between transformed modules.
    code = fn.__code__.replace(co_name=f"{fn.__code__.co_name}_{next(_CLONES)}")
    clone = types.FunctionType(
        code,
        fn.__globals__,
        fn.__name__,
        fn.__defaults__,
        fn.__closure__,
    )
    clone.__kwdefaults__ = fn.__kwdefaults__
    clone.__dict__.update(fn.__dict__)
    clone.__wrapped__ = fn  # type: ignore[attr-defined]
    return types.MethodType(clone, module)


# --------------------------------------------------------------------------- #
# Replay: running the captured, rewritten graph without Dynamo at run time.
# --------------------------------------------------------------------------- #

_Step = tuple[str, Any]  # ("attr", name) | ("item", key) | ("size", i) | ...


def _source_steps(source: Any) -> tuple[str, list[_Step]] | None:
    """Decompose a Dynamo ``Source`` into a root local name and access steps.

    Returns ``None`` for sources we cannot replay (globals, closures, ...).
    """
    from torch._dynamo import source as dsrc
    from torch._dynamo.source import TensorProperty

    steps: list[_Step] = []
    while True:
        if isinstance(source, dsrc.LocalSource):
            steps.reverse()
            return source.local_name, steps
        if isinstance(source, dsrc.TensorPropertySource):
            if source.prop is TensorProperty.SIZE:
                steps.append(("size", source.idx))
            elif source.prop is TensorProperty.STRIDE:
                steps.append(("stride", source.idx))
            else:
                return None
        elif isinstance(source, dsrc.AttrSource):
            steps.append(("attr", source.member))
        elif isinstance(source, (dsrc.DictGetItemSource, dsrc.GetItemSource)):
            if isinstance(source.index, dsrc.Source) or getattr(  # type: ignore[attr-defined]
                source, "index_is_slice", False
            ):
                return None
            steps.append(("item", source.index))
        elif not isinstance(source, dsrc.NNModuleSource):
            return None
        source = source.base


def _readable_name(root: str, steps: list[_Step], self_name: str = "self") -> str:
    """``self._modules['h']._modules['0']._parameters['weight']`` -> ``h.0.weight``."""
    omit = root in (self_name, "kwargs") or root.endswith("self")
    parts = [] if omit else [root]
    for kind, key in steps:
        if kind == "attr" and key in ("_modules", "_parameters", "_buffers"):
            continue
        parts.append(str(key) if kind in ("attr", "item") else f"{kind}({key})")
    return ".".join(parts)


def _follow(value: Any, steps: list[_Step]) -> Any:
    for kind, key in steps:
        if kind == "attr":
            value = getattr(value, key)
        elif kind == "item":
            value = value[key]
        elif kind == "size":
            value = value.size(key)
        else:
            value = value.stride(key)
    return value


def _signature_key(
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


@dataclasses.dataclass
class _Replay:
    """A rewritten graph plus how to feed it and rebuild the forward's output."""

    graph_module: GraphModule
    inputs: list[tuple[str, list[_Step]]]
    output_spec: pytree.TreeSpec
    # For each output leaf: ("graph", index) | ("const", value) | ("input", i)
    output_leaves: list[tuple[str, Any]]

    def __call__(self, local_values: dict[str, Any]) -> Any:
        flat_inputs = [
            _follow(local_values[root], steps) for root, steps in self.inputs
        ]
        outputs = self.graph_module(*flat_inputs)
        leaves = []
        for kind, value in self.output_leaves:
            if kind == "graph":
                leaves.append(outputs[value])
            elif kind == "input":
                leaves.append(flat_inputs[value])
            else:
                leaves.append(value)
        return pytree.tree_unflatten(leaves, self.output_spec)


# --------------------------------------------------------------------------- #
# Transform state and the forward wrapper.
# --------------------------------------------------------------------------- #


@dataclasses.dataclass
class _Capture:
    """One graph Dynamo handed to our backend, after our passes."""

    graph_module: GraphModule
    example_inputs: Sequence[Any]
    replay_inputs: list[tuple[str, list[_Step]]] | None
    last_outputs: tuple[Any, ...] | None = None


@dataclasses.dataclass
class TransformState:
    """The transforms applied to a module: graph passes and how to execute."""

    passes: list[tuple[str, GraphPass]]
    executor: Executor | None = None
    executor_name: str = "eager"
    non_recurse: tuple[Callable[..., Any], ...] = ()
    before_call: list[Callable[[tuple[Any, ...], dict[str, Any]], None]] = (
        dataclasses.field(default_factory=list)
    )
    # Filled at run time:
    captures: list[_Capture] = dataclasses.field(default_factory=list)
    calls: int = 0
    record_outputs: bool = False
    graphs_run_in_call: list[_Capture] = dataclasses.field(default_factory=list)
    replays: dict[tuple[Any, ...], _Replay] = dataclasses.field(default_factory=dict)

    def copy_for(self) -> TransformState:
        """The same transforms, with nothing captured yet."""
        return TransformState(
            list(self.passes),
            self.executor,
            self.executor_name,
            self.non_recurse,
            list(self.before_call),
        )

    def __deepcopy__(self, memo: dict[int, Any]) -> TransformState:
        # A copied module is transformed afresh: graphs are captured again.
        new = self.copy_for()
        memo[id(self)] = new
        return new


def transform_state(module: nn.Module) -> TransformState | None:
    """The :class:`TransformState` of a transformed module, else ``None``."""
    state = module.__dict__.get(_STATE_ATTR)
    return state if isinstance(state, TransformState) else None


def _run_passes(state: TransformState, gm: GraphModule) -> GraphModule:
    for name, graph_pass in state.passes:
        logger.info("running %s transform", name)
        gm = graph_pass(gm)
    gm.graph.lint()
    gm.recompile()
    return gm


class _TransformedForward:
    """The ``forward`` of a transformed module.

    Eager calls run through Dynamo with our backend (graph breaks, guards and
    recompilation handled by Dynamo). When an outer ``torch.compile`` traces this
    forward, the captured graph is replayed instead (see the module docstring).
    """

    def __init__(self, module: nn.Module, state: TransformState) -> None:
        self._module = module
        self._state = state
        self._original = _fresh_forward(module)
        # The frame Dynamo captures is this function's own, decorators included:
        # bind arguments to its parameters, not those of what it wraps.
        self._signature = inspect.signature(type(module).forward, follow_wrapped=False)
        self._self_name = next(iter(self._signature.parameters), "self")
        self._compiled = torch.compile(
            self._original, backend=self._backend, dynamic=None
        )
        self._eager_outside_compile = torch._dynamo.disable(  # type: ignore[no-untyped-call]
            self._eager, reason="unit_scaling transform: capture before replay"
        )

    def __deepcopy__(self, memo: dict[int, Any]) -> _TransformedForward:
        # copy.deepcopy(module) copies the module (and its state) first.
        module = memo[id(self._module)]
        return _TransformedForward(module, copy.deepcopy(self._state, memo))

    def __reduce__(self) -> Any:
        raise TypeError(
            "a transformed module cannot be pickled whole (its forward is a "
            "TorchDynamo function); save its state_dict() instead"
        )

    # -- backend: called by Dynamo once per captured (sub)graph -------------- #
    def _backend(
        self, gm: GraphModule, example_inputs: Sequence[Any]
    ) -> Callable[..., Any]:
        state = self._state
        sources = []
        for node in gm.graph.find_nodes(op="placeholder"):
            arg = node.meta.get("grapharg")
            steps = _source_steps(arg.source) if arg is not None else None
            if steps is not None:
                node.meta["source_name"] = _readable_name(*steps, self._self_name)
            sources.append(steps)
        replay_inputs = (
            None if None in sources else cast(list[tuple[str, list[_Step]]], sources)
        )
        gm = _run_passes(state, gm)
        capture = _Capture(gm, example_inputs, replay_inputs)
        state.captures.append(capture)
        run = state.executor(gm, example_inputs) if state.executor else gm.forward

        def execute(*args: Any) -> Any:
            out = run(*args)
            state.graphs_run_in_call.append(capture)
            if state.record_outputs:
                capture.last_outputs = tuple(out)
            return out

        return execute

    # -- eager path ---------------------------------------------------------- #
    def _eager(self, *args: Any, **kwargs: Any) -> Any:
        state = self._state
        for prepare in state.before_call:
            prepare(args, kwargs)
        state.graphs_run_in_call = []
        state.calls += 1
        key = _signature_key(self._module, args, kwargs)
        state.record_outputs = key not in state.replays
        breaks_before = Counter(counters["graph_break"])
        try:
            # Scales must stay Python numbers in the graph (never 0-d inputs).
            with (
                opaque_functions(state.non_recurse),
                torch._dynamo.config.patch(specialize_float=True),
            ):
                output = self._compiled(*args, **kwargs)
        except (torch._dynamo.exc.Unsupported, torch._dynamo.exc.UserError) as error:
            raise _untraceable(self._module, error) from error
        finally:
            state.record_outputs = False
        new_breaks = Counter(counters["graph_break"]) - breaks_before
        if new_breaks:
            _warn_graph_breaks(self._module, new_breaks)
        ran = state.graphs_run_in_call
        if not ran:
            raise RuntimeError(
                f"{type(self._module).__name__}.forward ran without its transformed "
                "graph: TorchDynamo fell back to eager (for example after "
                "torch._dynamo.config.recompile_limit recompilations). Raise that "
                "limit, or check the logs with TORCH_LOGS=recompiles."
            )
        if key not in state.replays and len(ran) == 1:
            try:
                self._record_replay(key, args, kwargs, output, ran[0])
            except Exception as error:  # replay is an optimisation: never fail here
                logger.info("cannot prepare replay under torch.compile: %r", error)
        for capture in ran:
            capture.last_outputs = None
        return output

    def _record_replay(
        self,
        key: tuple[Any, ...],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        output: Any,
        capture: _Capture,
    ) -> None:
        """Remember how to replay ``capture`` for calls with this signature."""
        state = self._state
        if capture.replay_inputs is None or capture.last_outputs is None:
            return
        local_values = self._bind(args, kwargs)
        flat_inputs = [_follow(local_values[r], s) for r, s in capture.replay_inputs]
        by_id_out = {id(t): i for i, t in enumerate(capture.last_outputs)}
        by_id_in = {id(t): i for i, t in enumerate(flat_inputs)}
        leaves, spec = pytree.tree_flatten(output)
        mapped: list[tuple[str, Any]] = []
        for leaf in leaves:
            if id(leaf) in by_id_out and isinstance(leaf, Tensor):
                mapped.append(("graph", by_id_out[id(leaf)]))
            elif id(leaf) in by_id_in and isinstance(leaf, Tensor):
                mapped.append(("input", by_id_in[id(leaf)]))
            elif isinstance(leaf, (int, float, bool, str, type(None))):
                mapped.append(("const", leaf))
            else:
                logger.info(
                    "forward output holds a %s that cannot be rebuilt; "
                    "torch.compile of this module will run it eagerly",
                    type(leaf).__name__,
                )
                return
        state.replays[key] = _Replay(
            capture.graph_module, capture.replay_inputs, spec, mapped
        )

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        bound = self._signature.bind(self._module, *args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    # -- entry point --------------------------------------------------------- #
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            replay = self._state.replays.get(_signature_key(self._module, args, kwargs))
            if replay is None:
                # No graph captured for these inputs yet: run this call eagerly
                # (a graph break); the capture it makes is replayed once recompiled.
                return self._eager_outside_compile(*args, **kwargs)
            return replay(self._bind(args, kwargs))
        if _get_current_dispatch_mode() is not None:
            return self._under_dispatch_mode(args, kwargs)
        return self._eager(*args, **kwargs)

    def _under_dispatch_mode(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Dynamo does not run under a TorchDispatchMode (FlopCounterMode, memory
        trackers, ...): replay the captured graph instead."""
        replay = self._state.replays.get(_signature_key(self._module, args, kwargs))
        if replay is None:
            raise RuntimeError(
                f"{type(self._module).__name__} is transformed by unit_scaling and "
                "is being called under a TorchDispatchMode, where TorchDynamo "
                "cannot capture its graph. Call it once with inputs like these "
                "outside the mode first; later calls under the mode replay that "
                "capture."
            )
        for prepare in self._state.before_call:
            prepare(args, kwargs)
        return replay(self._bind(args, kwargs))


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def _untraceable(module: nn.Module, error: Exception) -> RuntimeError:
    """A readable error for code TorchDynamo could not trace or transform."""
    detail = _first_line(str(error))
    return RuntimeError(
        f"unit_scaling transforms could not trace {type(module).__name__}.forward: "
        f"{detail}\nThe construct named above cannot be captured as a graph. "
        "Make it traceable, or substitute it: pass replace={the_function: "
        "a_traceable_equivalent} (a function, or an nn.Module subclass as key) "
        "to unit_scale."
    )


def _warn_graph_breaks(module: nn.Module, reasons: Counter[str]) -> None:
    summary = "; ".join(_first_line(r) for r in reasons)
    logger.warning(
        "TorchDynamo split %s.forward at %d graph break(s) (%s). Every subgraph is "
        "transformed, but code at a break runs untransformed, and a residual add "
        "whose branch spans a break is treated as a plain add. To avoid a break, "
        "make that code traceable or pass it in replace=.",
        type(module).__name__,
        sum(reasons.values()),
        summary,
    )


def apply_transform(
    module: M,
    name: str,
    graph_pass: GraphPass | None = None,
    *,
    executor: Executor | None = None,
    executor_name: str | None = None,
    non_recurse: Sequence[Callable[..., Any]] = (),
    order: Callable[[list[tuple[str, GraphPass]]], None] | None = None,
) -> M:
    """Return a copy of ``module`` whose forward runs the rewritten Dynamo graph.

    Composes with earlier transforms: the copy keeps their passes, appends
    ``graph_pass`` and replaces the executor if one is given.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(
            f"expected an nn.Module to transform, got {type(module).__name__}"
        )
    previous = transform_state(module)
    state = previous.copy_for() if previous else TransformState(passes=[])
    if graph_pass is not None:
        state.passes.append((name, graph_pass))
    if order is not None:
        order(state.passes)
    if executor is not None:
        state.executor = executor
        state.executor_name = executor_name or name
    state.non_recurse = tuple(dict.fromkeys((*state.non_recurse, *non_recurse)))
    copied = _copy_untransformed(module)
    object.__setattr__(copied, _STATE_ATTR, state)
    object.__setattr__(copied, "forward", _TransformedForward(copied, state))
    return copied


def _copy_untransformed(module: M) -> M:
    """A deep copy of ``module`` without any transform wrapper."""
    saved = {
        k: module.__dict__.pop(k)
        for k in (_STATE_ATTR, "forward")
        if k in module.__dict__
    }
    try:
        return copy.deepcopy(module)
    finally:
        module.__dict__.update(saved)
