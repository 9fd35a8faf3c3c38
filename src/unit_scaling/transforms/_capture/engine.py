"""How a transform runs: the composition engine behind every transform.

A transform (``unit_scale``, ``simulate_format``, ``track_scales``, ``compile``)
is a frozen :class:`Transform`: a graph pass, the place it takes in a chain
(:class:`Place`), how graphs are executed, how the module is prepared and set up,
and hooks around each call. The entry point builds its ``Transform`` and calls
:func:`apply_transform` once; the engine owns the module's journey from there,
each stage once, in order:

1. **copy**: a deep copy of the module, without an earlier transform's wrapper
   (the user's module is never modified);
2. **prepare** (a capture step, for a transform with a ``rewrite``): layers
   TorchDynamo records as opaque calls are rewritten, on the copy, into the
   functions they compute (``library.prepare``), and the library functions to
   keep whole join the transform's ``non_recurse``;
3. **chain**: the transform joins the module's :class:`TransformConfig` (the
   frozen chain, ordered by place whatever order the user applied them in), and a
   :class:`RunState` starts (what happens at run time: captured graphs,
   replays, the passes' own state, which copies of the module start afresh);
4. **install**: the copy's ``forward`` becomes a :class:`TransformedForward`,
   and the transform's attributes are bound;
5. **set up**: the transform's ``setup(copy, run_state, prepared)`` (``unit_scale``
   restores a checkpoint's record, initialises and tags the parameters).

Then, at every eager call, the forward runs through TorchDynamo with our backend.
For each graph Dynamo captures, the backend runs the passes in place order (each
may need the real example inputs: a :class:`CapturePass` receives them in a
:class:`CaptureContext`), then executes the graph eagerly or with the chain's
backend. A first eager call with a given input signature also records how to
replay its graph (``replay``), for an outer ``torch.compile`` or a dispatch mode.
Everything that touches Dynamo internals is in ``dynamo``.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import inspect
import itertools
import logging
import types
import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias, TypeVar

import torch
from torch import Tensor, nn
from torch.fx import GraphModule

from ..._torch_internals import fsdp_unsharded_parameters, pytree
from . import dynamo, observers
from .fallbacks import fell_back
from .library import LibraryRewrite, Prepared, prepare
from .replay import InputSpec, Replay, input_specs, record, signature_key

__all__ = [
    "CaptureContext",
    "CapturePass",
    "GraphPass",
    "M",
    "Place",
    "RunState",
    "StatefulPass",
    "Transform",
    "TransformConfig",
    "apply_transform",
    "transform_state",
]

logger = logging.getLogger("unit_scaling.transforms")

# The type of a module a transform takes and returns (the same class).
M = TypeVar("M", bound=nn.Module)
Backend = Callable[[GraphModule, Sequence[Any]], Callable[..., Any]]

_STATE_ATTR = "_unit_scaling_transforms"


class Place(enum.IntEnum):
    """Where a transform's pass runs in a chain, whatever the order of application:
    first what the graph computes, then the formats it computes in, then what is
    observed of it."""

    REWRITE = 0  # unit_scale
    QUANTISE = 1  # simulate_format
    OBSERVE = 2  # track_scales: sees the final graph, runs it eagerly


@dataclasses.dataclass(frozen=True)
class CaptureContext:
    """What a :class:`CapturePass` sees besides the graph: the real inputs Dynamo
    captured it with (parameters and buffers included, in placeholder order,
    symbolic sizes as their values in this call), the module, the ids of the
    module's buffers, and the ids of the tensors the caller passed (the model's
    own inputs, as opposed to activations of an earlier graph)."""

    example_inputs: Sequence[Any]
    module: nn.Module
    buffers: frozenset[int]
    call_inputs: frozenset[int] = frozenset()
    # The graphs that already ran in this call, in order (the earlier pieces of
    # a forward that graph breaks split), each with its outputs; and the names
    # of the module's parameters by id (FSDP2's gathered stand-ins included).
    graphs_before: tuple[tuple[GraphModule, tuple[Any, ...]], ...] = ()
    parameter_names: dict[int, list[str]] = dataclasses.field(default_factory=dict)
    # The numbers the caller passed (Python ints and floats, anywhere in the
    # arguments): Dynamo bakes such a number into a graph as a constant until
    # it changes, so this tells a count the caller passes from a literal.
    call_numbers: frozenset[float] = frozenset()
    # The distinct shapes, beyond the leading (batch) dimension, of the tensors
    # the caller passed (scalars left out), sorted: the sizes a call sums over
    # (a sequence length, an image size), whichever graph of the call this is.
    call_shapes: tuple[tuple[int, ...], ...] = ()


class StatefulPass:
    """A graph pass holding per-module state (e.g. recorded statistics).

    ``fresh()`` returns the instance a copy of the module starts from.
    """

    def __call__(self, gm: GraphModule) -> GraphModule:
        raise NotImplementedError

    def fresh(self) -> StatefulPass:
        raise NotImplementedError


class CapturePass:
    """A stateful graph pass that also needs the :class:`CaptureContext`."""

    def __call__(self, gm: GraphModule, context: CaptureContext) -> GraphModule:
        raise NotImplementedError

    def fresh(self) -> CapturePass:
        raise NotImplementedError


GraphPass: TypeAlias = Callable[[GraphModule], GraphModule] | StatefulPass | CapturePass
CallHook = Callable[[tuple[Any, ...], dict[str, Any]], None]


@dataclasses.dataclass(frozen=True)
class Transform:
    """One transform's configuration (frozen: run-time state is in
    :class:`RunState`).

    Args:
        name: the transform's function, named in error messages.
        label: its pass as the INFO log names it, in the reference library's
            words (``"unit scaling backend"``; users grep logs for them).
            Default: ``"<name> backend"``.
        place: where its pass runs in a chain.
        graph_pass: the pass; a :class:`StatefulPass` or :class:`CapturePass` is
            a prototype whose ``fresh()`` copy each module gets.
        backend: how captured graphs run (``None``: eagerly, or as before).
        eager: graphs of a chain holding this transform run eagerly (tracking
            observes every op); no backend may follow it.
        non_recurse: functions Dynamo records as single calls.
        before_call: ``hook(args, kwargs)`` before every call.
        after_first_call: ``hook(run_state)`` after the first call.
        after_call: ``hook(run_state, output)`` after every eager call.
        attributes: ``(name, factory)``: module attributes built from the run
            state, e.g. ``track_scales``' ``scales_graph``.
        rewrite: how to prepare the copy before capture (the library rewrite,
            ``library.prepare``); ``None``: it is captured as it is.
        setup: ``setup(module, run_state, prepared)``, once, on the prepared
            copy with its run state, before its first call.
    """

    name: str
    label: str = ""
    place: Place = Place.REWRITE
    graph_pass: GraphPass | None = None
    backend: Backend | None = None
    eager: bool = False
    non_recurse: tuple[Callable[..., Any], ...] = ()
    before_call: tuple[CallHook, ...] = ()
    after_first_call: tuple[Callable[[RunState], None], ...] = ()
    after_call: tuple[Callable[[RunState, Any], None], ...] = ()
    attributes: tuple[tuple[str, Callable[[RunState], Any]], ...] = ()
    rewrite: LibraryRewrite | None = None
    setup: Callable[[nn.Module, RunState, Prepared], None] | None = None

    def __post_init__(self) -> None:
        if not self.label:
            object.__setattr__(self, "label", f"{self.name} backend")


@dataclasses.dataclass(frozen=True)
class TransformConfig:
    """The transforms applied to a module, in the order their passes run."""

    transforms: tuple[Transform, ...] = ()

    def check(self, transform: Transform) -> None:
        """Whether ``transform`` may join this chain (before any work is done).

        Raises:
            ValueError: for a backend after a transform that runs eagerly.
        """
        if transform.backend is not None and any(t.eager for t in self.transforms):
            eager = next(t.name for t in self.transforms if t.eager)
            raise ValueError(
                f"{transform.name}() cannot follow {eager}(): {eager} runs the "
                f"model eagerly to observe every op, so it must be applied last; "
                f"apply {transform.name} first, then {eager}"
            )

    def then(self, transform: Transform) -> TransformConfig:
        """This chain with ``transform`` added at its place.

        Raises:
            ValueError: for a backend after a transform that runs eagerly.
        """
        self.check(transform)
        ordered = sorted((*self.transforms, transform), key=lambda t: t.place)
        at = ordered.index(transform)
        if at + 1 < len(ordered):  # the others keep their order
            logger.info(
                "moving %s to precede %s", transform.label, ordered[at + 1].label
            )
            logger.debug("transforms run in order: %s", [t.name for t in ordered])
        return TransformConfig(tuple(ordered))

    @property
    def backend(self) -> tuple[str, Backend] | None:
        """The last backend applied, unless a transform runs eagerly."""
        if any(t.eager for t in self.transforms):
            return None
        backends = [(t.name, t.backend) for t in self.transforms if t.backend]
        return backends[-1] if backends else None

    @property
    def non_recurse(self) -> tuple[Callable[..., Any], ...]:
        """The functions Dynamo records as single calls: every transform's, and
        the observers (``observers.OBSERVERS``)."""
        functions = (f for t in self.transforms for f in t.non_recurse)
        return tuple(dict.fromkeys((*functions, *observers.OBSERVERS)))


@dataclasses.dataclass
class Capture:
    """One graph Dynamo handed to our backend, after our passes."""

    graph_module: GraphModule
    replay_inputs: list[InputSpec] | None
    last_outputs: tuple[Any, ...] | None = None
    # While a call runs: weak references to this graph's outputs in this call,
    # for a graph captured later in the same call (see CaptureContext).
    outputs_in_call: tuple[Any, ...] = ()


def parameter_names(module: nn.Module) -> dict[int, list[str]]:
    """Every name of each of ``module``'s parameters, by ``id``; a parameter
    FSDP2 has gathered for a sharded block to run goes by its sharded one's."""
    names: dict[int, list[str]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    for key, sharded in fsdp_unsharded_parameters(module).items():
        if id(sharded) in names:
            names[key] = names[id(sharded)]
    return names


@dataclasses.dataclass
class RunState:
    """What happens at run time to one transformed module (a copy starts afresh:
    no captures, and each stateful pass's ``fresh()`` copy)."""

    config: TransformConfig
    passes: list[tuple[str, GraphPass]]
    captures: list[Capture] = dataclasses.field(default_factory=list)
    calls: int = 0
    current_call: tuple[Any, ...] | None = None
    record_outputs: bool = False
    graphs_run_in_call: list[Capture] = dataclasses.field(default_factory=list)
    replays: dict[tuple[Any, ...], Replay] = dataclasses.field(default_factory=dict)
    flags: dict[str, Any] = dataclasses.field(default_factory=dict)

    @staticmethod
    def start(config: TransformConfig, previous: RunState | None = None) -> RunState:
        """The run state of a module transformed by ``config``, reusing the
        passes of ``previous`` (the state of the module it was copied from)."""
        # The passes of ``previous`` by the transform they belong to (so that,
        # say, unit_scale's record of initialised parameters carries over).
        running: dict[int, GraphPass] = {}
        if previous is not None:
            with_pass = [t for t in previous.config.transforms if t.graph_pass]
            running = {
                id(t): p for t, (_, p) in zip(with_pass, previous.passes, strict=True)
            }
        passes = []
        for transform in config.transforms:
            if transform.graph_pass is None:
                continue
            source = running.get(id(transform), transform.graph_pass)
            passes.append((transform.label, _fresh(source)))
        return RunState(config, passes)

    def pass_of(self, kind: type[Any]) -> Any:
        """The first pass that is an instance of ``kind``, or ``None``."""
        return next((p for _, p in self.passes if isinstance(p, kind)), None)

    def __deepcopy__(self, memo: dict[int, Any]) -> RunState:
        # A copied module is transformed afresh: graphs are captured again, and
        # each stateful pass continues from a fresh() copy of this one's.
        new = RunState(self.config, [(n, _fresh(p)) for n, p in self.passes])
        memo[id(self)] = new
        return new

    def __reduce__(self) -> Any:
        raise TypeError(
            "a module transformed by unit_scaling cannot be pickled whole (its "
            "forward runs through TorchDynamo): save its state_dict() and apply "
            "the transforms again after loading"
        )


def _fresh(graph_pass: GraphPass) -> GraphPass:
    if isinstance(graph_pass, (StatefulPass, CapturePass)):
        return graph_pass.fresh()
    return graph_pass


def transform_state(module: nn.Module) -> RunState | None:
    """The :class:`RunState` of a transformed module, else ``None``."""
    state = module.__dict__.get(_STATE_ATTR)
    return state if isinstance(state, RunState) else None


def _run_passes(
    state: RunState, gm: GraphModule, context: CaptureContext
) -> GraphModule:
    # Observers (a monitor's hooks, traced into the graph) are out of the
    # passes' sight, and go back after the values they observe.
    detached = observers.detach(gm.graph)
    for label, graph_pass in state.passes:
        logger.info("running %s", label)
        with detached.watching(gm):
            if isinstance(graph_pass, CapturePass):
                gm = graph_pass(gm, context)
            else:
                gm = graph_pass(gm)
        detached.follow(gm)
    backend = state.config.backend
    if backend is None:
        detached.reattach(gm.graph)
    else:
        detached.drop(
            f"{backend[0]} compiles the graph, and observers run only in a graph "
            "that runs eagerly"
        )
    gm.graph.lint()
    gm.recompile()
    return gm


_CLONES = itertools.count()


class TransformedForward:
    """The ``forward`` of a transformed module.

    Eager calls run through Dynamo with our backend (graph breaks, guards and
    recompilation handled by Dynamo). When an outer ``torch.compile`` traces this
    forward, or a TorchDispatchMode is active, the graph captured at an earlier
    eager call with the same input signature is replayed instead.

    Each instance gets its own subclass with a private copy of ``__call__``'s
    code, so that an outer ``torch.compile`` caches every transformed module
    separately (a shared code object would hit Dynamo's recompile limit).
    """

    def __new__(cls, module: nn.Module, state: RunState) -> TransformedForward:
        call = TransformedForward.__call__
        code = call.__code__.replace(co_name=f"forward_{next(_CLONES)}")
        own_call = types.FunctionType(code, call.__globals__, "__call__")
        subclass = type(cls.__name__, (cls,), {"__call__": own_call})
        return object.__new__(subclass)

    def __init__(self, module: nn.Module, state: RunState) -> None:
        self._module = module
        self._state = state
        self._seen_type: type[nn.Module] | None = None
        self._original = dynamo.fresh_forward(module)  # called with the module
        # What inspect.signature reports: the module's own forward's parameters,
        # so that tools which read them (Trainer's column pruning, Accelerate,
        # PEFT) see the model's arguments, not (*args, **kwargs).
        self.__signature__ = _forward_signature(module)
        # The frame Dynamo captures is this function's own, decorators included.
        signature = inspect.signature(type(module).forward, follow_wrapped=False)
        self._self_name = next(iter(signature.parameters), "self")
        self._compiled = torch.compile(
            self._original, backend=self._backend, dynamic=None
        )
        self._eager_outside_compile = torch.compiler.disable(  # type: ignore[no-untyped-call]
            self._eager, reason="unit_scaling transform: capture before replay"
        )

    def __deepcopy__(self, memo: dict[int, Any]) -> TransformedForward:
        # copy.deepcopy(module) copies the module (and its state) first.
        module = memo[id(self._module)]
        return TransformedForward(module, copy.deepcopy(self._state, memo))

    def __reduce__(self) -> Any:
        return self._state.__reduce__()

    # -- backend: called by Dynamo once per captured (sub)graph -------------- #
    def _backend(
        self, gm: GraphModule, example_inputs: Sequence[Any]
    ) -> Callable[..., Any]:
        state = self._state
        dynamo.name_placeholders(gm, self._self_name)
        names = parameter_names(self._module)
        modules = {name for name, _ in self._module.named_modules()}
        dynamo.anchor_module_paths(gm, example_inputs, names, modules)
        replay_inputs = (
            input_specs(self._module, state.current_call, example_inputs)
            if state.current_call is not None
            else None
        )
        context = CaptureContext(
            [dynamo.concrete(x) for x in example_inputs],
            self._module,
            frozenset(id(b) for b in self._module.buffers()),
            frozenset(
                id(x)
                for x in pytree.tree_leaves(state.current_call or ())
                if isinstance(x, Tensor)
            ),
            tuple(
                (c.graph_module, tuple(ref() for ref in c.outputs_in_call))
                for c in state.graphs_run_in_call
            ),
            names,
            frozenset(
                x
                for x in pytree.tree_leaves(state.current_call or ())
                if isinstance(x, (int, float)) and not isinstance(x, bool)
            ),
            tuple(
                sorted(
                    {
                        tuple(x.shape[1:])
                        for x in pytree.tree_leaves(state.current_call or ())
                        if isinstance(x, Tensor) and x.dim() >= 1
                    }
                )
            ),
        )
        gm = _run_passes(state, gm, context)
        capture = Capture(gm, replay_inputs)
        state.captures.append(capture)
        backend = state.config.backend
        run = backend[1](gm, example_inputs) if backend else gm.forward

        def execute(*args: Any) -> Any:
            out = run(*args)
            capture.outputs_in_call = tuple(
                weakref.ref(x) if isinstance(x, Tensor) else _no_ref for x in out
            )
            state.graphs_run_in_call.append(capture)
            if state.record_outputs:
                capture.last_outputs = tuple(out)
            return out

        return execute

    # -- eager path ---------------------------------------------------------- #
    def _before_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        for transform in self._state.config.transforms:
            for hook in transform.before_call:
                hook(args, kwargs)

    def _eager(self, *args: Any, **kwargs: Any) -> Any:
        if getattr(self._original, "_torchdynamo_disable", False):
            raise _untraceable(
                self._module,
                "its forward is decorated with torch._dynamo.disable "
                "(or torch.compiler.disable), which stops TorchDynamo from tracing it",
            )
        state, config = self._state, self._state.config
        self._before_call(args, kwargs)
        state.graphs_run_in_call = []
        state.calls += 1
        key = signature_key(self._module, args, kwargs)
        state.record_outputs = key not in state.replays
        state.current_call = (args, kwargs)
        reasons_before = dynamo.break_reasons()
        captured_before = len(state.captures)
        if type(self._module) is not self._seen_type:  # e.g. sharded since
            _own_block_forwards(self._module)
            self._seen_type = type(self._module)
        try:
            with dynamo.capturing(config.non_recurse):
                output = self._compiled(self._module, *args, **kwargs)
        except dynamo.UNTRACEABLE as error:
            raise _untraceable(self._module, str(error)) from error
        finally:
            state.record_outputs = False
            state.current_call = None
        reasons = dynamo.break_reasons() - reasons_before
        ran = state.graphs_run_in_call
        if not ran:
            detail = "; ".join(_first_line(r) for r in reasons) or (
                "TorchDynamo ran it eagerly, e.g. after "
                "torch._dynamo.config.recompile_limit recompilations "
                "(see TORCH_LOGS=recompiles)"
            )
            raise _untraceable(self._module, detail)
        if (len(ran) > 1 or reasons) and len(state.captures) > captured_before:
            _warn_graph_breaks(self._module, len(ran), reasons)
        if key not in state.replays and len(ran) == 1:
            try:
                capture = ran[0]
                replay = record(
                    capture.graph_module,
                    capture.replay_inputs,
                    capture.last_outputs,
                    args,
                    kwargs,
                    output,
                )
                if replay is not None:
                    state.replays[key] = replay
            except Exception as error:  # replay is an optimisation: never fail here
                fell_back("prepare replay under torch.compile", "this call", error)
        for capture in ran:
            capture.last_outputs = None
            capture.outputs_in_call = ()
        for transform in config.transforms:
            if state.calls == 1:
                for first in transform.after_first_call:
                    first(state)
            for hook in transform.after_call:
                hook(state, output)
        return output

    # -- entry point --------------------------------------------------------- #
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            replay = self._state.replays.get(signature_key(self._module, args, kwargs))
            if replay is None:
                # No graph captured for these inputs yet: run this call eagerly
                # (a graph break); the capture it makes is replayed once recompiled.
                return self._eager_outside_compile(*args, **kwargs)
            return replay(self._module, args, kwargs)
        if dynamo.dispatch_mode_active():
            return self._under_dispatch_mode(args, kwargs)
        return self._eager(*args, **kwargs)

    def _under_dispatch_mode(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Dynamo does not run under a TorchDispatchMode (FlopCounterMode, memory
        trackers, ...): replay the captured graph instead."""
        replay = self._state.replays.get(signature_key(self._module, args, kwargs))
        if replay is None:
            raise RuntimeError(
                f"{type(self._module).__name__} is transformed by unit_scaling and "
                "is being called under a TorchDispatchMode, where TorchDynamo "
                "cannot capture its graph. Call it once with inputs like these "
                "outside the mode first; later calls under the mode replay that "
                "capture."
            )
        self._before_call(args, kwargs)
        return replay(self._module, args, kwargs)


def _forward_signature(module: nn.Module) -> inspect.Signature:
    """The signature of ``module``'s forward as a bound method (``self`` left
    out, decorators such as ``functools.wraps`` followed); ``(*args, **kwargs)``
    if Python cannot read one (a forward written in C, say)."""
    try:
        return inspect.signature(types.MethodType(type(module).forward, module))
    except (TypeError, ValueError):
        return inspect.Signature(
            [
                inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL),
                inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD),
            ]
        )


def _own_block_forwards(module: nn.Module) -> None:
    """Give each FSDP2-sharded block inside ``module`` a private copy of its
    forward's code. FSDP2's hooks break the graph at every sharded block, so
    Dynamo captures each block's forward as a frame of its own, and identical
    blocks would share one graph, with the scales baked into it for the first
    block (u-μP residual weights by depth, parameter-gradient scales)."""
    from torch.distributed.fsdp import FSDPModule

    for sub in module.modules():
        if (
            sub is not module
            and isinstance(sub, FSDPModule)
            and "forward" not in sub.__dict__
        ):
            sub.forward = types.MethodType(dynamo.fresh_forward(sub), sub)


def _no_ref() -> None:
    """The weak reference of an output that is not a tensor."""
    return None


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
    from torch.distributed.fsdp import FSDPModule

    if any(isinstance(m, FSDPModule) for m in module.modules()):
        hint += (
            " FSDP2 (fully_shard) breaks it at every sharded block's hooks, as "
            "expected: each block's graph is transformed as in the whole model."
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


def apply_transform(module: M, transform: Transform) -> M:
    """Return a copy of ``module`` whose forward runs the rewritten Dynamo graph.

    The module's whole journey, each stage once (see the module docstring):
    copy, prepare, chain, install, set up. Composes with earlier transforms: the
    copy's chain is the module's chain with ``transform`` added at its place
    (:meth:`TransformConfig.then`).

    Raises:
        TypeError: if ``module`` is not an ``nn.Module``.
        ValueError: if ``transform`` may not follow the module's chain.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(
            f"expected an nn.Module to transform, got {type(module).__name__}"
        )
    previous = transform_state(module)
    chain = previous.config if previous else TransformConfig()
    chain.check(transform)
    copied = _copy_untransformed(module, previous)  # 1. copy
    prepared = Prepared()
    if transform.rewrite is not None:  # 2. prepare
        prepared = prepare(copied, transform.rewrite)
        transform = dataclasses.replace(
            transform, non_recurse=(*transform.non_recurse, *prepared.opaque)
        )
    state = RunState.start(chain.then(transform), previous)  # 3. chain
    object.__setattr__(copied, _STATE_ATTR, state)  # 4. install
    object.__setattr__(copied, "forward", TransformedForward(copied, state))
    _bind_attributes(copied, state)
    if transform.setup is not None:  # 5. set up
        transform.setup(copied, state, prepared)
    return copied


def extend_in_place(module: nn.Module, transform: Transform) -> None:
    """Add ``transform`` to the chain of the transformed ``module`` itself (for
    module conversions such as ``convert_to_float8_training``, which work in
    place): its graphs are captured again at the next call, and the passes keep
    their state (``unit_scale`` does not initialise its parameters again).

    Raises:
        ValueError: if ``module`` is not transformed.
    """
    _start_again(module, lambda config: config.then(transform))


def recapture(module: nn.Module) -> None:
    """Make the transformed ``module`` capture its graphs again at its next call
    (its passes keep their state, as :func:`extend_in_place`'s do).

    Raises:
        ValueError: if ``module`` is not transformed.
    """
    _start_again(module, lambda config: config)


def _start_again(
    module: nn.Module, chain: Callable[[TransformConfig], TransformConfig]
) -> None:
    previous = transform_state(module)
    if previous is None:
        raise ValueError(f"{type(module).__name__} is not a transformed module")
    state = RunState.start(chain(previous.config), previous)
    object.__setattr__(module, _STATE_ATTR, state)
    object.__setattr__(module, "forward", TransformedForward(module, state))
    _bind_attributes(module, state)


def _bind_attributes(module: nn.Module, state: RunState) -> None:
    for t in state.config.transforms:
        for name, factory in t.attributes:
            object.__setattr__(module, name, factory(state))


def _copy_untransformed(module: M, state: RunState | None) -> M:
    """A deep copy of ``module`` without any transform wrapper."""
    attributes = (
        [name for t in state.config.transforms for name, _ in t.attributes]
        if state
        else []
    )
    names = (_STATE_ATTR, "forward", *attributes)
    saved = {k: module.__dict__.pop(k) for k in names if k in module.__dict__}
    try:
        copied = copy.deepcopy(module)
    finally:
        module.__dict__.update(saved)
    return copied
