"""The TorchDynamo internals ``unit_scaling.transforms._capture.dynamo`` relies on.

Each test pins one behaviour of a private or semi-private Dynamo API, directly
(not through our transforms), so that a torch upgrade that changes it fails here
with a clear name rather than as a wrong result elsewhere.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import torch
import torch._dynamo
import torch._dynamo.config
import torch.nn.functional as F
from torch import Tensor, nn
from torch._dynamo import source as dsrc
from torch._dynamo import trace_rules
from torch._dynamo.testing import CompileCounter
from torch._dynamo.utils import counters
from torch.fx import GraphModule

from unit_scaling.transforms import unit_scale
from unit_scaling.transforms._capture import dynamo as _dynamo


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Capture:
    """A backend that keeps the graphs Dynamo hands it and runs them as they are.

    Placeholder sources are read during the call: Dynamo drops
    ``meta["grapharg"]`` once the backend returns (so must ``_capture.dynamo``).
    """

    def __init__(self) -> None:
        self.graphs: list[GraphModule] = []
        self.example_inputs: list[Sequence[Any]] = []
        self.sources: list[list[Any]] = []

    def __call__(
        self, gm: GraphModule, example_inputs: Sequence[Any]
    ) -> Callable[..., Any]:
        self.graphs.append(gm)
        self.example_inputs.append(example_inputs)
        self.sources.append(
            [n.meta["grapharg"].source for n in gm.graph.find_nodes(op="placeholder")]
        )
        return gm.forward

    def targets(self, index: int = -1) -> list[Any]:
        return [
            n.target
            for n in self.graphs[index].graph.nodes
            if n.op in ("call_function", "call_method")
        ]


def _helper(x: Tensor) -> Tensor:
    return F.relu(x) * 2


def _calls_helper(x: Tensor) -> Tensor:
    return _helper(x) + 1


# --------------------------------------------------------------------------- #
# 1. trace_rules._allowed_callable_ids: opaque functions.
# --------------------------------------------------------------------------- #


def test_allowed_callable_ids_api() -> None:
    # What opaque_functions relies on: add and remove change what is allowed.
    allowed = trace_rules._allowed_callable_ids
    assert id(_helper) not in allowed()
    allowed.add(id(_helper))
    try:
        assert id(_helper) in allowed()
    finally:
        allowed.remove(id(_helper))
    assert id(_helper) not in allowed()


def test_allowed_callable_is_recorded_as_one_node() -> None:
    capture = Capture()
    with _dynamo.opaque_functions([_helper]):
        assert id(_helper) in trace_rules._allowed_callable_ids()
        torch.compile(_calls_helper, backend=capture)(torch.randn(3))
    assert id(_helper) not in trace_rules._allowed_callable_ids()
    assert _helper in capture.targets()
    assert F.relu not in capture.targets()


def test_not_allowed_callable_is_inlined() -> None:
    capture = Capture()
    torch.compile(_calls_helper, backend=capture)(torch.randn(3))
    assert _helper not in capture.targets()
    assert F.relu in capture.targets()


def test_opaque_functions_keeps_torch_own_entries() -> None:
    # F.linear is allowed in graph by torch itself: leaving the block must not
    # remove it.
    with _dynamo.opaque_functions([F.linear]):
        pass
    capture = Capture()
    torch.compile(lambda x, w: F.linear(x, w), backend=capture)(
        torch.randn(2, 3), torch.randn(4, 3)
    )
    assert F.linear in capture.targets()


def test_multi_head_attention_forward_is_one_node() -> None:
    """Dynamo records ``F.multi_head_attention_forward`` whole (so the linears
    and attention inside ``nn.MultiheadAttention`` are invisible to a graph
    rewrite). If this changes, the encoder scale-fraction xfail may pass."""
    attention = nn.MultiheadAttention(8, 2, batch_first=True)
    capture = Capture()
    x = torch.randn(2, 4, 8)
    torch.compile(lambda x: attention(x, x, x, need_weights=False)[0],
                  backend=capture)(x)  # fmt: skip
    assert F.multi_head_attention_forward in capture.targets()


# --------------------------------------------------------------------------- #
# 2. Dynamo caches compiled frames per code object.
# --------------------------------------------------------------------------- #


def _sine(x: Tensor) -> Tensor:
    return x.sin() + 1


def _function_on(code: types.CodeType, name: str) -> Callable[[Tensor], Tensor]:
    return types.FunctionType(code, _sine.__globals__, name)  # type: ignore[return-value]


def test_functions_sharing_code_share_the_cache() -> None:
    counter = CompileCounter()
    torch.compile(_sine, backend=counter)(torch.randn(3))
    torch.compile(_function_on(_sine.__code__, "other"), backend=counter)(
        torch.randn(3)
    )
    assert counter.frame_count == 1


def test_code_replace_gives_a_fresh_cache() -> None:
    counter = CompileCounter()
    torch.compile(_sine, backend=counter)(torch.randn(3))
    code = _sine.__code__.replace(co_name="_sine_clone")
    assert code is not _sine.__code__
    torch.compile(_function_on(code, "clone"), backend=counter)(torch.randn(3))
    assert counter.frame_count == 2


def test_recompile_limit_config_exists() -> None:
    assert isinstance(torch._dynamo.config.recompile_limit, int)
    assert hasattr(torch._dynamo.config, "specialize_float")
    with torch._dynamo.config.patch(specialize_float=True):
        assert torch._dynamo.config.specialize_float


def test_nested_graph_breaks_resume_inside_the_call() -> None:
    # With the option (set by _dynamo.capturing), a break inside a called
    # function no longer re-traces the caller: one frame fewer to compile.
    assert "nested_graph_breaks" in torch._dynamo.config._config

    def inner(x: Tensor) -> Tensor:
        y = x.sin()
        torch._dynamo.graph_break()
        return y.cos()

    def outer(x: Tensor) -> Tensor:
        return inner(x + 1) * 2

    frames = {}
    for nested in (False, True):
        torch._dynamo.reset()
        counter = CompileCounter()
        with torch._dynamo.config.patch(nested_graph_breaks=nested):
            out = torch.compile(outer, backend=counter)(torch.ones(3))
        torch.testing.assert_close(out, outer(torch.ones(3)))
        frames[nested] = counter.frame_count
    assert frames[True] < frames[False], frames


def test_fresh_forward_has_private_code() -> None:
    first, second = nn.Linear(2, 2), nn.Linear(2, 2)
    a, b = _dynamo.fresh_forward(first), _dynamo.fresh_forward(second)
    shared = nn.Linear.forward.__code__
    assert a.__code__ is not shared
    assert a.__code__ is not b.__code__
    x = torch.randn(3, 2)
    torch.testing.assert_close(a(first, x), first(x))


def test_torch_forward_is_a_top_frame_of_its_own() -> None:
    # torch.compile wraps functions from torch's files in a shared frame
    # (external_utils.wrap_inline); a copy filed elsewhere is compiled as is.
    assert trace_rules.check(nn.Linear.forward)
    clone = _dynamo.fresh_forward(nn.Linear(2, 2))
    assert not trace_rules.check(clone)


def test_many_transformed_torch_modules_stay_traced() -> None:
    # More transformed nn.Linear roots than Dynamo's recompile limit.
    for _ in range(torch._dynamo.config.recompile_limit + 2):
        scaled = unit_scale(nn.Linear(4, 4))
        scaled(torch.randn(2, 4))
        assert scaled.unit_scale_report().ops  # traced, not run eagerly


# --------------------------------------------------------------------------- #
# 3. Placeholder sources, which replay decomposes.
# --------------------------------------------------------------------------- #


class Sources(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("offset", torch.ones(4))

    def forward(
        self, x: Tensor, pair: tuple[Tensor, Tensor], *, table: dict[str, Tensor]
    ) -> Tensor:
        return self.fc(x) + pair[1] + table["bias"] + self.offset


def _inputs(rows: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return (torch.randn(rows, 4), (torch.randn(4), torch.randn(4))), {
        "table": {"bias": torch.randn(4)}
    }


_DECOMPOSED = (
    dsrc.LocalSource,
    dsrc.AttrSource,
    dsrc.GetItemSource,
    dsrc.DictGetItemSource,
    dsrc.TensorPropertySource,
    dsrc.NNModuleSource,
)


def _sources_of(capture: Capture) -> list[Any]:
    return [source for sources in capture.sources for source in sources]


def _kinds(source: Any) -> set[type]:
    kinds = set()
    while source is not None:
        kinds.add(type(source))
        source = getattr(source, "base", None)
    return kinds


def test_placeholder_sources_are_kinds_we_decompose() -> None:
    model = Sources()
    capture = Capture()
    compiled = torch.compile(model.forward, backend=capture, dynamic=None)
    for rows in (2, 3):  # the second shape makes Dynamo add size placeholders
        args, kwargs = _inputs(rows)
        compiled(*args, **kwargs)
    sources = _sources_of(capture)
    assert sources
    seen: set[type] = set()
    for source in sources:
        kinds = _kinds(source)
        seen |= kinds
        assert all(issubclass(k, _DECOMPOSED) for k in kinds), source.name
    assert dsrc.LocalSource in seen
    assert dsrc.GetItemSource in seen or dsrc.DictGetItemSource in seen
    assert any(issubclass(k, dsrc.TensorPropertySource) for k in seen)


def test_example_inputs_are_the_call_arguments_and_parameters() -> None:
    """Replay under an outer torch.compile matches graph inputs to the module's
    tensors and the call's arguments by identity: Dynamo must pass the real
    objects to the backend, and its sources must decompose into readable names."""
    model = Sources()
    capture = Capture()
    compiled = torch.compile(model.forward, backend=capture, dynamic=False)
    args, kwargs = _inputs(2)
    compiled(*args, **kwargs)
    known = {id(t) for t in model.parameters()} | {id(t) for t in model.buffers()}
    known |= {id(x) for x in torch.utils._pytree.tree_leaves((args, kwargs))}
    [example] = capture.example_inputs
    [sources] = capture.sources
    for value, source in zip(example, sources, strict=True):
        if isinstance(value, Tensor):
            assert id(value) in known, source.name
        steps = _dynamo._source_steps(source)
        assert steps is not None, source.name
        assert _dynamo._readable_name(*steps, "self"), source.name


def test_example_value_meta_on_nodes() -> None:
    capture = Capture()
    torch.compile(_calls_helper, backend=capture)(torch.randn(3))
    for node in capture.graphs[0].graph.nodes:
        if node.op in ("call_function", "call_method", "placeholder"):
            value = node.meta.get("example_value")
            assert isinstance(value, Tensor), node.name
            assert value.shape == (3,)


# --------------------------------------------------------------------------- #
# 4. Nested torch.compile inlines the inner function.
# --------------------------------------------------------------------------- #


def _inner(x: Tensor) -> Tensor:
    return x.cos() * 3


def test_nested_compile_inlines_inner_function() -> None:
    inner_counter = CompileCounter()
    inner = torch.compile(_inner, backend=inner_counter)
    outer = Capture()
    torch.compile(lambda x: inner(x) + 1, backend=outer)(torch.randn(3))
    # The inner backend (where a transform would rewrite) never runs ...
    assert inner_counter.frame_count == 0
    # ... and the outer graph holds the inner function's ops, untransformed.
    assert "cos" in [str(t) for t in outer.targets()]


def test_is_compiling_and_disable() -> None:
    seen: list[bool] = []

    def probe(x: Tensor) -> Tensor:
        seen.append(torch.compiler.is_compiling())
        return x + 1

    disabled = torch._dynamo.disable(probe, reason="test: run outside Dynamo")
    torch.compile(lambda x: probe(x) * 2, backend=Capture())(torch.randn(3))
    torch.compile(lambda x: disabled(x) * 2, backend=Capture())(torch.randn(3))
    assert seen == [True, False]
    assert not torch.compiler.is_compiling()


def test_graph_break_counter() -> None:
    before = sum(counters["graph_break"].values())

    def broken(x: Tensor) -> Tensor:
        x = x + 1
        torch._dynamo.graph_break()
        return x * 2

    capture = Capture()
    torch.compile(broken, backend=capture)(torch.randn(3))
    assert len(capture.graphs) == 2
    assert sum(counters["graph_break"].values()) > before


def test_exception_classes_exist() -> None:
    for name in ("TorchDynamoException", "Unsupported", "UserError"):
        assert issubclass(getattr(torch._dynamo.exc, name), Exception)


def test_dispatch_mode_query() -> None:
    from torch.utils._python_dispatch import (
        TorchDispatchMode,
        _get_current_dispatch_mode,
    )

    assert _get_current_dispatch_mode() is None
    with TorchDispatchMode():
        assert _get_current_dispatch_mode() is not None


# --------------------------------------------------------------------------- #
# 5. Symbolic sizes of dynamic-shape graphs, and functorch levels.
# --------------------------------------------------------------------------- #


def test_symbolic_sizes_have_their_values_as_hints() -> None:
    """A recompiled graph takes sizes as SymInts; calibration needs their values
    (``symint_hint``: torch's function for them was renamed in 2.12)."""
    from unit_scaling._torch_internals import symint_hint

    seen: list[Any] = []

    def backend(gm: GraphModule, example_inputs: Sequence[Any]) -> Any:
        seen.append([x for x in example_inputs if isinstance(x, torch.SymInt)])
        return gm.forward

    compiled = torch.compile(lambda x: x.sum(0).expand(3, x.shape[1]), backend=backend)
    compiled(torch.randn(4, 5))
    compiled(torch.randn(6, 7))
    assert seen[-1], "the second shape should compile a dynamic graph"
    assert sorted(symint_hint(s) for s in seen[-1]) == [6, 7]
    assert sorted(_dynamo.concrete(s) for s in seen[-1]) == [6, 7]


def _vmapped(x: Tensor) -> Tensor:
    return torch.vmap(lambda row: row.sin() * 2)(x) + 1


def test_vmap_traces_into_matching_nesting_calls() -> None:
    """Dynamo inlines vmap as _vmap_increment_nesting ... _vmap_decrement_nesting
    around _add_batch_dim/_remove_batch_dim: _dynamo.functorch_sections finds
    that span, and is_functorch_internal its level-changing calls."""
    capture = Capture()
    torch.compile(_vmapped, backend=capture)(torch.randn(3, 4))
    graph = capture.graphs[0].graph
    sections = _dynamo.functorch_sections(graph)
    assert len(sections) == 1
    names = [getattr(n.target, "__name__", "") for n in sections[0]]
    assert names[0] == "_vmap_increment_nesting"
    assert names[-1] == "_vmap_decrement_nesting"
    assert "_add_batch_dim" in names and "_remove_batch_dim" in names
    assert all(_dynamo.is_functorch_internal(sections[0][i].target) for i in (0, -1))


def test_functorch_levels_are_restored_after_a_failure() -> None:
    functorch = torch._C._functorch
    assert functorch.maybe_current_level() is None
    with pytest.raises(RuntimeError), _dynamo.restore_functorch_levels():
        functorch._vmap_increment_nesting(3, "error")
        raise RuntimeError("a failure half-way through a vmapped region")
    assert functorch.maybe_current_level() is None


def test_readable_name_through_module_dict() -> None:
    # Diffusers reaches submodules through ``self.__dict__["_modules"]``.
    steps = [
        ("attr", "__dict__"),
        ("item", "_modules"),
        ("item", "up"),
        ("attr", "_parameters"),
        ("item", "weight"),
    ]
    assert _dynamo._readable_name("self", steps, "self") == "up.weight"
