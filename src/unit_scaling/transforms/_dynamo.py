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
from typing import Any, TypeAlias, TypeVar

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

# Dynamo's limit on compiled versions of one code object, while a transformed
# module runs. After a graph break, code that several module instances share
# (the ``forward`` of each of 24 decoder layers, say) resumes in frames of its
# own, compiled once per instance (guards check the module) and per input shape;
# at torch's default of 8, later layers would run untransformed.
_RECOMPILE_LIMIT = 256


def _fresh_forward(module: nn.Module) -> Callable[..., Any]:
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


def _readable_name(root: str, steps: list[_Step], self_name: str) -> str:
    """``self._modules['h']._modules['0']._parameters['weight']`` -> ``h.0.weight``."""
    omit = root in (self_name, "kwargs", "fn") or root.endswith("self")
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


# --------------------------------------------------------------------------- #
# Replay: running the captured, rewritten graph without Dynamo at run time.
# --------------------------------------------------------------------------- #


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


# Where a replayed graph input comes from: ("module", dotted tensor name) |
# ("leaf", index into the flattened (args, kwargs)) | ("const", value).
_InputSpec = tuple[str, Any]


def _input_specs(
    module: nn.Module, call: tuple[Any, ...], example_inputs: Sequence[Any]
) -> list[_InputSpec] | None:
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
    specs: list[_InputSpec] = []
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
class _Replay:
    """A rewritten graph plus how to feed it and rebuild the forward's output."""

    graph_module: GraphModule
    inputs: list[_InputSpec]
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


# --------------------------------------------------------------------------- #
# Transform state and the forward wrapper.
# --------------------------------------------------------------------------- #


@dataclasses.dataclass
class _Capture:
    """One graph Dynamo handed to our backend, after our passes."""

    graph_module: GraphModule
    replay_inputs: list[_InputSpec] | None
    last_outputs: tuple[Any, ...] | None = None


@dataclasses.dataclass(frozen=True)
class CaptureContext:
    """What a :class:`CapturePass` sees besides the graph: the real inputs Dynamo
    captured it with (parameters and buffers included, in placeholder order), the
    module, and the ids of the module's buffers."""

    example_inputs: Sequence[Any]
    module: nn.Module
    buffers: frozenset[int]
    # ids of the tensors the caller passed to the module in this call (graph
    # inputs that are the model's own inputs, not activations of an earlier graph)
    call_inputs: frozenset[int] = frozenset()


class StatefulPass:
    """A graph pass holding per-module state (e.g. recorded statistics).

    ``fresh()`` returns a new, empty instance for a copied module.
    """

    def __call__(self, gm: GraphModule) -> GraphModule:
        raise NotImplementedError

    def fresh(self) -> StatefulPass:
        raise NotImplementedError


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
    after_first_call: list[Callable[[TransformState], None]] = dataclasses.field(
        default_factory=list
    )
    # Run after every eager call with the call's output.
    after_call: list[Callable[[TransformState, Any], None]] = dataclasses.field(
        default_factory=list
    )
    # Extra module attributes bound to this state, e.g. track_scales' scales_graph.
    attributes: dict[str, Callable[[TransformState], Any]] = dataclasses.field(
        default_factory=dict
    )
    # Filled at run time:
    captures: list[_Capture] = dataclasses.field(default_factory=list)
    calls: int = 0
    current_call: tuple[Any, ...] | None = None
    record_outputs: bool = False
    graphs_run_in_call: list[_Capture] = dataclasses.field(default_factory=list)
    replays: dict[tuple[Any, ...], _Replay] = dataclasses.field(default_factory=dict)
    # Run-time flags of the after_call hooks (fresh for every copy).
    flags: dict[str, Any] = dataclasses.field(default_factory=dict)

    def copy_for(self) -> TransformState:
        """The same transforms, with nothing captured (or recorded) yet."""
        passes = [
            (name, p.fresh() if isinstance(p, (StatefulPass, CapturePass)) else p)
            for name, p in self.passes
        ]
        return TransformState(
            passes,
            self.executor,
            self.executor_name,
            self.non_recurse,
            list(self.before_call),
            list(self.after_first_call),
            list(self.after_call),
            dict(self.attributes),
        )

    def pass_of(self, kind: type[Any]) -> Any:
        """The first pass that is an instance of ``kind``, or ``None``."""
        return next((p for _, p in self.passes if isinstance(p, kind)), None)

    def __deepcopy__(self, memo: dict[int, Any]) -> TransformState:
        # A copied module is transformed afresh: graphs are captured again.
        new = self.copy_for()
        memo[id(self)] = new
        return new

    def __reduce__(self) -> Any:
        raise TypeError(
            "a module transformed by unit_scaling cannot be pickled whole (its "
            "forward runs through TorchDynamo): save its state_dict() and apply "
            "the transforms again after loading"
        )


def transform_state(module: nn.Module) -> TransformState | None:
    """The :class:`TransformState` of a transformed module, else ``None``."""
    state = module.__dict__.get(_STATE_ATTR)
    return state if isinstance(state, TransformState) else None


def _concrete(value: Any) -> Any:
    """A symbolic size Dynamo passes for a dynamic-shape graph, as the concrete
    value it had in this call (its hint); anything else unchanged."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        from torch.fx.experimental.symbolic_shapes import optimization_hint

        if isinstance(value, torch.SymInt):
            return optimization_hint(value)
        return value.node.hint
    return value


class CapturePass:
    """A graph pass holding per-module state that also needs the
    :class:`CaptureContext`. ``fresh()`` returns the instance a copied module
    starts from."""

    def __call__(self, gm: GraphModule, context: CaptureContext) -> GraphModule:
        raise NotImplementedError

    def fresh(self) -> CapturePass:
        raise NotImplementedError


GraphPass: TypeAlias = Callable[[GraphModule], GraphModule] | CapturePass


def _run_passes(
    state: TransformState, gm: GraphModule, context: CaptureContext
) -> GraphModule:
    for name, graph_pass in state.passes:
        logger.info("running %s transform", name)
        if isinstance(graph_pass, CapturePass):
            gm = graph_pass(gm, context)
        else:
            gm = graph_pass(gm)
    gm.graph.lint()
    gm.recompile()
    return gm


def _break_reasons() -> Counter[str]:
    """Dynamo's running counts of graph breaks (and of constructs it skipped)."""
    return Counter(counters["graph_break"]) + Counter(counters["unimplemented"])


class _TransformedForward:
    """The ``forward`` of a transformed module.

    Eager calls run through Dynamo with our backend (graph breaks, guards and
    recompilation handled by Dynamo). When an outer ``torch.compile`` traces this
    forward, or a TorchDispatchMode is active, the graph captured at an earlier
    eager call with the same input signature is replayed instead.

    Each instance gets its own subclass with a private copy of ``__call__``'s
    code, so that an outer ``torch.compile`` caches every transformed module
    separately (a shared code object would hit Dynamo's recompile limit).
    """

    def __new__(cls, module: nn.Module, state: TransformState) -> _TransformedForward:
        call = _TransformedForward.__call__
        code = call.__code__.replace(co_name=f"forward_{next(_CLONES)}")
        own_call = types.FunctionType(code, call.__globals__, "__call__")
        subclass = type(cls.__name__, (cls,), {"__call__": own_call})
        return object.__new__(subclass)

    def __init__(self, module: nn.Module, state: TransformState) -> None:
        self._module = module
        self._state = state
        self._original = _fresh_forward(module)  # called with the module first
        # The frame Dynamo captures is this function's own, decorators included.
        signature = inspect.signature(type(module).forward, follow_wrapped=False)
        self._self_name = next(iter(signature.parameters), "self")
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
        return self._state.__reduce__()

    # -- backend: called by Dynamo once per captured (sub)graph -------------- #
    def _backend(
        self, gm: GraphModule, example_inputs: Sequence[Any]
    ) -> Callable[..., Any]:
        state = self._state
        for node in gm.graph.find_nodes(op="placeholder"):
            arg = node.meta.get("grapharg")
            steps = _source_steps(arg.source) if arg is not None else None
            if steps is not None:
                node.meta["source_name"] = _readable_name(*steps, self._self_name)
        replay_inputs = (
            _input_specs(self._module, state.current_call, example_inputs)
            if state.current_call is not None
            else None
        )
        context = CaptureContext(
            [_concrete(x) for x in example_inputs],
            self._module,
            frozenset(id(b) for b in self._module.buffers()),
            frozenset(
                id(x)
                for x in pytree.tree_leaves(state.current_call or ())
                if isinstance(x, Tensor)
            ),
        )
        gm = _run_passes(state, gm, context)
        capture = _Capture(gm, replay_inputs)
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
        if getattr(self._original, "_torchdynamo_disable", False):
            raise _untraceable(
                self._module,
                "its forward is decorated with torch._dynamo.disable "
                "(or torch.compiler.disable), which stops TorchDynamo from tracing it",
            )
        state = self._state
        for prepare in state.before_call:
            prepare(args, kwargs)
        state.graphs_run_in_call = []
        state.calls += 1
        key = _signature_key(self._module, args, kwargs)
        state.record_outputs = key not in state.replays
        state.current_call = (args, kwargs)
        reasons_before = _break_reasons()
        try:
            # Scales must stay Python numbers in the graph (never 0-d inputs).
            with (
                opaque_functions(state.non_recurse),
                torch._dynamo.config.patch(
                    specialize_float=True, recompile_limit=_RECOMPILE_LIMIT
                ),
            ):
                output = self._compiled(self._module, *args, **kwargs)
        except (torch._dynamo.exc.Unsupported, torch._dynamo.exc.UserError) as error:
            raise _untraceable(self._module, str(error)) from error
        finally:
            state.record_outputs = False
            state.current_call = None
        reasons = _break_reasons() - reasons_before
        ran = state.graphs_run_in_call
        if not ran:
            detail = "; ".join(_first_line(r) for r in reasons) or (
                "TorchDynamo ran it eagerly, e.g. after "
                "torch._dynamo.config.recompile_limit recompilations "
                "(see TORCH_LOGS=recompiles)"
            )
            raise _untraceable(self._module, detail)
        if len(ran) > 1 or reasons:
            _warn_graph_breaks(self._module, len(ran), reasons)
        if key not in state.replays and len(ran) == 1:
            try:
                self._record_replay(key, args, kwargs, output, ran[0])
            except Exception as error:  # replay is an optimisation: never fail here
                logger.info("cannot prepare replay under torch.compile: %r", error)
        for capture in ran:
            capture.last_outputs = None
        if state.calls == 1:
            for check in state.after_first_call:
                check(state)
        for hook in state.after_call:
            hook(state, output)
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
        if capture.replay_inputs is None or capture.last_outputs is None:
            return
        by_id_out = {id(t): i for i, t in enumerate(capture.last_outputs)}
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
                return
        self._state.replays[key] = _Replay(
            capture.graph_module, capture.replay_inputs, spec, mapped
        )

    # -- entry point --------------------------------------------------------- #
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            replay = self._state.replays.get(_signature_key(self._module, args, kwargs))
            if replay is None:
                # No graph captured for these inputs yet: run this call eagerly
                # (a graph break); the capture it makes is replayed once recompiled.
                return self._eager_outside_compile(*args, **kwargs)
            return replay(self._module, args, kwargs)
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
        return replay(self._module, args, kwargs)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def _untraceable(module: nn.Module, detail: str) -> RuntimeError:
    """A readable error for code TorchDynamo could not trace or transform."""
    return RuntimeError(
        f"unit_scaling transforms could not trace {type(module).__name__}.forward: "
        f"{_first_line(detail)}\nThe construct named above cannot be captured as a "
        "graph. Make it traceable, or substitute it: pass replace={the_function: "
        "a_traceable_equivalent} (a function, or an nn.Module subclass as key) "
        "to unit_scale."
    )


def _warn_graph_breaks(module: nn.Module, graphs: int, reasons: Counter[str]) -> None:
    summary = "; ".join(_first_line(r) for r in reasons) or "reasons not reported"
    hint = ""
    if "logging.Logger" in summary and type(module).__module__.startswith(
        "transformers."
    ):
        # transformers logs from forward when it has to guess the loss type.
        hint = (
            " For a Hugging Face model, set its loss type first (e.g. model.loss_type "
            '= "ForCausalLM") so that forward does not log.'
        )
    logger.warning(
        "TorchDynamo broke the graph of %s.forward (%d graph(s) ran; %s). Every "
        "graph is transformed, but code at a break runs untransformed, and a "
        "residual add whose branch spans a break is treated as a plain add. To "
        "avoid a break, make that code traceable or pass it in replace=.%s",
        type(module).__name__,
        graphs,
        summary,
        hint,
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
    copied = _copy_untransformed(module, previous)
    object.__setattr__(copied, _STATE_ATTR, state)
    object.__setattr__(copied, "forward", _TransformedForward(copied, state))
    for attribute, factory in state.attributes.items():
        object.__setattr__(copied, attribute, factory(state))
    return copied


def bind_attribute(
    module: nn.Module, name: str, factory: Callable[[TransformState], Any]
) -> None:
    """Give a transformed module an attribute built from its state (and rebuilt
    for every transformed copy)."""
    state = transform_state(module)
    assert state is not None
    state.attributes[name] = factory
    object.__setattr__(module, name, factory(state))


def _copy_untransformed(module: M, state: TransformState | None) -> M:
    """A deep copy of ``module`` without any transform wrapper."""
    names = (_STATE_ATTR, "forward", *(state.attributes if state else ()))
    saved = {k: module.__dict__.pop(k) for k in names if k in module.__dict__}
    try:
        return copy.deepcopy(module)
    finally:
        module.__dict__.update(saved)


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
