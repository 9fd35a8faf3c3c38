"""Tests for ``track_scales``, ``Metrics`` and the ``prune_*`` functions."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import math
import operator
import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.fx import Graph

import unit_scaling.functional as U
from tests.transforms.models import (
    CASES,
    MLP,
    NanoGPT,
    tracked_unit_scaled,
    unit_backward,
)
from unit_scaling.transforms import (
    Metrics,
    prune_non_float_tensors,
    prune_same_scale_tensors,
    prune_selected_nodes,
    track_scales,
    unit_scale,
)
from unit_scaling.transforms._capture.engine import Transform, apply_transform

META_KEYS = ("clean_name", "outputs_float_tensor", "requires_grad")


def _tracked_nodes(graph: Graph) -> list:  # type: ignore[type-arg]
    return [n for n in graph.nodes if "metrics" in n.meta]


def _fields(data: Metrics.Data | None) -> dict[str, float]:
    """The scale statistics (the ``block_*`` fields are NaN, not measured,
    without ``track_scales(..., block_format=...)``:
    tests/formats/test_quantisation_statistics.py tests them)."""
    if data is None:
        return {}
    return {
        k: v for k, v in dataclasses.asdict(data).items() if not k.startswith("block_")
    }


@dataclasses.dataclass
class Tracked:
    model: nn.Module
    graph: Graph


@pytest.fixture(scope="module", params=list(CASES))
def tracked(request: pytest.FixtureRequest) -> Tracked:
    return Tracked(*tracked_unit_scaled(CASES[request.param]))


def test_every_float_tensor_has_metrics(tracked: Tracked) -> None:
    nodes = list(tracked.graph.nodes)
    for node in nodes:
        for key in META_KEYS:
            assert key in node.meta, (node.name, key)
        if node.meta["outputs_float_tensor"]:
            assert isinstance(node.meta.get("metrics"), Metrics), node.name
        else:
            assert "metrics" not in node.meta, node.name
    assert len(_tracked_nodes(tracked.graph)) > 0


def test_parameters_flagged_and_have_gradients(tracked: Tracked) -> None:
    params = [n for n in tracked.graph.nodes if n.meta.get("requires_grad")]
    assert len(params) == len(list(tracked.model.parameters()))
    for node in params:
        assert node.meta["outputs_float_tensor"], node.name
        assert node.meta["metrics"].bwd is not None, node.name


_KNOWN_FAILURES: dict[tuple[str, str], str] = {}


def _expect_failure(request: pytest.FixtureRequest, test: str) -> None:
    reason = _KNOWN_FAILURES.get((test, request.node.callspec.params["tracked"]))
    if reason is not None:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))


def test_parameter_clean_names_are_parameter_names(
    tracked: Tracked, request: pytest.FixtureRequest
) -> None:
    _expect_failure(request, "clean_names")
    graph = tracked.graph
    names = {n.meta["clean_name"] for n in graph.nodes if n.meta.get("requires_grad")}
    assert names == set(dict(tracked.model.named_parameters()))


def _passes_self_as_args(forward: Any) -> Any:
    """A decorator in the style of transformers' ``can_return_tuple``."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return forward(*args, **kwargs)

    return wrapper


class _WrappedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(8, 8)

    @_passes_self_as_args
    def forward(self, x: Tensor) -> Tensor:
        return self.inner(x).relu()


def test_clean_names_through_a_forward_decorator() -> None:
    model = track_scales(_WrappedForward())
    model(torch.randn(4, 8)).sum().backward()
    names = {
        n.meta["clean_name"]
        for n in model.scales_graph().nodes
        if n.meta.get("requires_grad")
    }
    assert names == {"inner.weight", "inner.bias"}


def test_module_paths_through_a_forward_decorator() -> None:
    scaled = unit_scale(_WrappedForward())
    scaled(torch.randn(4, 8))
    linear = [r for r in scaled.unit_scale_report().ops if r.op == "linear"]
    assert [r.module for r in linear] == ["inner"]


def test_no_nan_presented_as_a_scale(
    tracked: Tracked, request: pytest.FixtureRequest
) -> None:
    _expect_failure(request, "nan")
    for node in _tracked_nodes(tracked.graph):
        metrics = node.meta["metrics"]
        for field, value in {**_fields(metrics.fwd), **_fields(metrics.bwd)}.items():
            assert not math.isnan(value), (node.name, field)


# --------------------------------------------------------------------------- #
# Edge cases: empty, one-element, integer and non-tensor values.
# --------------------------------------------------------------------------- #


class Odd(nn.Module):
    """Produces an empty tensor, a one-element tensor, integer tensors and
    Python numbers."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: Tensor, ids: Tensor) -> tuple[Tensor, ...]:
        y = self.fc(x)
        empty = y[:, :0] * 2
        total = y.sum()
        count = ids.sum() + x.shape[0]
        return y, empty, total, count


def _node(graph: Graph, name: str):  # type: ignore[no-untyped-def]
    matches = [n for n in graph.nodes if n.meta.get("clean_name") == name]
    assert len(matches) == 1, [n.meta.get("clean_name") for n in graph.nodes]
    return matches[0]


@pytest.fixture(scope="module")
def odd_graph() -> Graph:
    model = track_scales(Odd())
    y, empty, total, _ = model(torch.randn(4, 8), torch.arange(4))
    (y.sum() + total + empty.sum()).backward()
    return model.scales_graph()


def test_empty_tensor(odd_graph: Graph) -> None:
    metrics = _node(odd_graph, "empty").meta["metrics"]
    assert metrics.fwd.numel == 0
    for value in _fields(metrics.fwd).values():
        assert value == 0
    if metrics.bwd is not None:
        assert not any(math.isnan(v) for v in _fields(metrics.bwd).values())


def test_one_element_tensor(odd_graph: Graph) -> None:
    metrics = _node(odd_graph, "total").meta["metrics"]
    assert metrics.fwd.numel == 1
    assert metrics.fwd.std == 0
    assert metrics.fwd.abs_max == metrics.fwd.abs_min == metrics.fwd.mean_abs
    assert metrics.bwd is not None and metrics.bwd.mean_abs == 1.0
    assert metrics.bwd.std == 0


def test_integer_and_non_tensor_nodes(odd_graph: Graph) -> None:
    ids = _node(odd_graph, "ids")
    assert not ids.meta["outputs_float_tensor"] and "metrics" not in ids.meta
    count = [n for n in odd_graph.nodes if n.meta.get("clean_name") == "count"]
    for node in count:
        assert not node.meta["outputs_float_tensor"]
        assert "metrics" not in node.meta


def test_inputs_get_requires_grad() -> None:
    class TwoInputs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x: Tensor, ids: Tensor, *, scale: Tensor) -> Tensor:
            return self.fc(x) * scale + ids.float()

    model = track_scales(TwoInputs())
    x, ids, scale = torch.randn(4, 8), torch.arange(8), torch.tensor(2.0)
    model(x, ids, scale=scale).sum().backward()
    assert x.requires_grad and x.grad is not None
    assert scale.requires_grad and scale.grad is not None
    assert not ids.requires_grad
    graph = model.scales_graph()
    assert _node(graph, "x").meta["metrics"].bwd is not None


def test_forward_only_has_no_backward_metrics() -> None:
    model = track_scales(MLP())
    model(torch.randn(4, 32))
    nodes = _tracked_nodes(model.scales_graph())
    assert nodes and all(n.meta["metrics"].bwd is None for n in nodes)


def test_scales_graph_before_forward_is_empty() -> None:
    graph = track_scales(MLP()).scales_graph()
    assert isinstance(graph, Graph) and len(graph.nodes) == 0
    # an empty graph prunes to an empty graph
    for prune in (prune_non_float_tensors, prune_same_scale_tensors):
        assert len(prune(graph).nodes) == 0


def test_output_node_carries_the_metadata(tracked: Tracked) -> None:
    [output] = [n for n in tracked.graph.nodes if n.op == "output"]
    assert output.meta["clean_name"] == "output"
    assert output.meta["outputs_float_tensor"] is False
    assert output.meta["requires_grad"] is False


def test_graph_reflects_latest_call() -> None:
    model = track_scales(MLP())
    x = torch.randn(4, 32)
    model(x)
    first = _node(model.scales_graph(), "x").meta["metrics"].fwd.mean_abs
    model(3 * x)
    second = _node(model.scales_graph(), "x").meta["metrics"].fwd.mean_abs
    assert second == pytest.approx(3 * first, rel=1e-5)


def test_metrics_match_tensor_statistics() -> None:
    class Scale(nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            return x * 3

    model = track_scales(Scale())
    torch.manual_seed(0)  # a mean not so near 0 that rel=1e-5 is below rounding
    x = torch.randn(64, 32)
    grad = torch.randn(64, 32)
    model(x).backward(grad)
    graph = model.scales_graph()
    [out] = [n for n in _tracked_nodes(graph) if n.meta["clean_name"] != "x"]
    fwd, bwd = out.meta["metrics"].fwd, out.meta["metrics"].bwd
    y = 3 * x
    assert fwd.mean_abs == pytest.approx(y.abs().mean().item(), rel=1e-5)
    assert fwd.abs_mean == pytest.approx(y.mean().abs().item(), rel=1e-5)
    assert fwd.std == pytest.approx(y.std().item(), rel=1e-5)
    assert fwd.abs_max == pytest.approx(y.abs().max().item(), rel=1e-6)
    assert fwd.abs_min == pytest.approx(y.abs().min().item(), rel=1e-6)
    assert fwd.numel == y.numel()
    assert bwd is not None and bwd.std == pytest.approx(grad.std().item(), rel=1e-5)
    x_bwd = _node(graph, "x").meta["metrics"].bwd
    assert x_bwd.std == pytest.approx((3 * grad).std().item(), rel=1e-5)


def test_non_finite_tensors_never_report_a_finite_scale() -> None:
    class NonFinite(nn.Module):
        def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            masked = x.masked_fill(x > 0, float("-inf"))
            return x * float("inf"), masked, x * float("nan")

    model = track_scales(NonFinite())
    x = torch.randn(16, 8)
    model(x)
    graph = model.scales_graph()
    by_name = {
        n.meta["clean_name"]: n.meta["metrics"].fwd for n in _tracked_nodes(graph)
    }
    all_inf = by_name["mul"]
    assert math.isinf(all_inf.mean_abs) and math.isinf(all_inf.std)
    assert all_inf.e4m3_overflow == 1.0
    # a partly masked tensor keeps the scale of its finite part
    part = by_name["masked"]
    finite = x[x <= 0]
    assert part.mean_abs == pytest.approx(finite.abs().mean().item(), rel=1e-5)
    assert math.isinf(part.abs_max)
    all_nan = by_name["mul_1"]
    assert math.isnan(all_nan.mean_abs) and math.isnan(all_nan.std)


def test_parameter_hooks_do_not_accumulate() -> None:
    model = track_scales(nn.Linear(8, 8))
    for _ in range(4):
        model(torch.randn(2, 8)).sum().backward()
    for name, param in model.named_parameters():
        assert len(param._backward_hooks or {}) <= 1, name


# --------------------------------------------------------------------------- #
# FP8 overflow / underflow fractions.
# --------------------------------------------------------------------------- #

_VALUES = [1000.0, -500.0, 448.0, 1.0, 2**-10, 1.5 * 2**-10, -(2**-12),
           2**-17, 2**-18, 0.0, 1e5, 3.0]  # fmt: skip


def _flushes(x: Tensor, dtype: torch.dtype) -> float:
    """Fraction of nonzero values that the native cast rounds to zero."""
    return ((x != 0) & (x.to(dtype).float() == 0)).float().mean().item()


def test_fp8_overflow_and_underflow_fractions() -> None:
    class Identity(nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            return x * 1.0

    values = torch.tensor(_VALUES)
    model = track_scales(Identity())
    model(torch.ones(len(_VALUES))).backward(values)
    model(values.clone()).backward(values)
    graph = model.scales_graph()
    n = len(_VALUES)
    for data in (_node(graph, "x").meta["metrics"].fwd,
                 _node(graph, "x").meta["metrics"].bwd):  # fmt: skip
        assert data.e4m3_overflow == pytest.approx(3 / n)  # 1000, -500, 1e5
        assert data.e4m3_underflow == pytest.approx(4 / n)  # 2^-10 ... 2^-18
        assert data.e5m2_overflow == pytest.approx(1 / n)  # 1e5
        assert data.e5m2_underflow == pytest.approx(2 / n)  # 2^-17, 2^-18
        # The same fractions from torch's own casts.
        assert data.e4m3_underflow == pytest.approx(
            _flushes(values, torch.float8_e4m3fn)
        )
        assert data.e5m2_underflow == pytest.approx(_flushes(values, torch.float8_e5m2))
        assert data.e4m3_overflow == pytest.approx(
            (values.abs() > torch.finfo(torch.float8_e4m3fn).max).float().mean().item()
        )


def test_unit_scaled_model_has_no_fp8_overflow(tracked: Tracked) -> None:
    for node in _tracked_nodes(tracked.graph):
        metrics = node.meta["metrics"]
        for data in (metrics.fwd, metrics.bwd):
            if data is not None and math.isfinite(data.abs_max):
                assert data.e5m2_overflow == 0, node.name


# --------------------------------------------------------------------------- #
# Metrics API.
# --------------------------------------------------------------------------- #


def test_metrics_names() -> None:
    names = Metrics.names()
    for name in ("mean_abs", "abs_mean", "std", "abs_max", "abs_min", "numel"):
        assert name in names
    assert len(Metrics.full_names()) == len(names)
    assert Metrics.get_full_name("std") == "standard deviation"
    with pytest.raises(ValueError, match="unknown metric"):
        Metrics.get_full_name("variance")


# --------------------------------------------------------------------------- #
# Pruning.
# --------------------------------------------------------------------------- #


class Views(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: Tensor, ids: Tensor) -> Tensor:
        y = self.fc(x).view(4, 2, 4).transpose(1, 2)
        z = F.gelu(y) * 1.001
        w = z + y
        return w + ids.sum()


@pytest.fixture(scope="module")
def views_graph() -> Graph:
    model = track_scales(Views())
    unit_backward(model(torch.randn(4, 8), torch.arange(4)))
    return model.scales_graph()


def _targets(graph: Graph) -> set[str]:
    return {str(getattr(n.target, "__name__", n.target)) for n in graph.nodes}


def test_prune_non_float_tensors(views_graph: Graph) -> None:
    assert any(
        not n.meta["outputs_float_tensor"]
        for n in views_graph.nodes
        if n.op != "output"
    )
    pruned = prune_non_float_tensors(views_graph)
    remaining = [n for n in pruned.nodes if n.op != "output"]
    assert remaining and all(n.meta["outputs_float_tensor"] for n in remaining)
    assert "ids" in {n.meta.get("clean_name") for n in views_graph.nodes}  # a copy
    pruned.lint()


def test_prune_same_scale_tensors(views_graph: Graph) -> None:
    pruned = prune_same_scale_tensors(views_graph)
    names = _targets(pruned)
    assert "view" not in names and "transpose" not in names
    assert "view" in _targets(views_graph)  # a copy
    assert "gelu" in names
    # Two floating-point inputs: never pruned, whatever the scales.
    assert sum(n.meta.get("clean_name") == "w" for n in pruned.nodes) == 1
    # `z = gelu(y) * 1.001` changes the scale by 0.1%: kept by default, pruned
    # with a looser tolerance.
    assert any(n.meta.get("clean_name") == "z" for n in pruned.nodes)
    loose = prune_same_scale_tensors(views_graph, rtol=1e-2)
    assert not any(n.meta.get("clean_name") == "z" for n in loose.nodes)
    pruned.lint()


def test_prune_selected_nodes(views_graph: Graph) -> None:
    pruned = prune_selected_nodes(views_graph, [F.gelu])
    assert "gelu" not in _targets(pruned)
    assert "gelu" in _targets(views_graph)  # a copy
    [z] = [n for n in pruned.nodes if n.meta.get("clean_name") == "z"]
    assert z.args[0].meta["clean_name"] == "y"  # rewired to gelu's input
    pruned.lint()


def test_prune_requires_scales_graph() -> None:
    graph = torch.fx.symbolic_trace(nn.Linear(2, 2)).graph
    for prune in (prune_non_float_tensors, prune_same_scale_tensors):
        with pytest.raises(ValueError, match="track_scales"):
            prune(graph)


def test_nanogpt_positions_are_pruned_as_non_float() -> None:
    model = track_scales(unit_scale(NanoGPT()))
    CASES["nanogpt"].run(model)
    graph = model.scales_graph()
    [positions] = [n for n in graph.nodes if n.meta.get("clean_name") == "positions"]
    assert not positions.meta["outputs_float_tensor"]
    pruned = prune_non_float_tensors(graph)
    assert "positions" not in {n.meta.get("clean_name") for n in pruned.nodes}
    assert U.residual_add in {n.target for n in pruned.nodes}


# --------------------------------------------------------------------------- #
# Statistics: the C++ kernel, the torch kernel and the definitions agree.
# --------------------------------------------------------------------------- #

statistics_module = importlib.import_module(
    "unit_scaling.transforms._tracking.statistics"
)
metrics_module = importlib.import_module("unit_scaling.transforms._tracking.metrics")
tracking_module = importlib.import_module(
    "unit_scaling.transforms._tracking.graph_pass"
)
_NATIVE = statistics_module._NATIVE
_KERNELS = statistics_module._KERNELS


def _defined(t: Tensor) -> Metrics.Data:
    """The documented meaning of each field, computed directly in float64."""
    x = t.detach().double().reshape(-1)
    n = x.numel()
    if n == 0:
        return Metrics.Data(0.0, 0.0, 0.0, 0.0, 0.0, 0)
    a = x.abs()
    finite = x[torch.isfinite(x)]
    if finite.numel():
        mean_abs = finite.abs().mean().item()
        abs_mean = finite.mean().abs().item()
        std = finite.std().item() if finite.numel() > 1 else 0.0
    else:
        mean_abs = abs_mean = std = math.nan if x.isnan().any() else math.inf
    not_nan = a[~a.isnan()]
    e4, e5 = torch.finfo(torch.float8_e4m3fn), torch.finfo(torch.float8_e5m2)
    nonzero = a > 0
    return Metrics.Data(
        mean_abs,
        abs_mean,
        std,
        not_nan.max().item() if not_nan.numel() else 0.0,
        not_nan.min().item() if not_nan.numel() else math.inf,
        n,
        (a > e4.max).sum().item() / n,
        (nonzero & (a <= e4.smallest_normal * 2**-3 / 2)).sum().item() / n,
        (a > e5.max).sum().item() / n,
        (nonzero & (a <= e5.smallest_normal * 2**-2 / 2)).sum().item() / n,
    )


def _close(a: Metrics.Data, b: Metrics.Data, rel: float = 1e-5) -> None:
    # A mean near 0 is known to within rounding of the elements it sums.
    mean_tolerance = rel * b.mean_abs if math.isfinite(b.mean_abs) else 0.0
    for field, x, y in zip(
        Metrics.names(),
        dataclasses.astuple(a),
        dataclasses.astuple(b),
        strict=True,
    ):
        if math.isnan(y):
            assert math.isnan(x), field
        else:
            tolerance = mean_tolerance if field == "abs_mean" else 1e-12
            assert x == pytest.approx(y, rel=rel, abs=tolerance), (field, x, y)


def _special(n: int) -> Tensor:
    """Normal values with zeros, infinities, NaN, FP8 overflow and underflow."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)) * 30
    specials = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e5, -600.0, 2**-12, 1e-7]
    x[:: max(n // len(specials), 1)][: len(specials)] = torch.tensor(
        specials[: min(len(specials), n)]
    )
    return x


_TENSORS = {
    "normal": lambda: torch.randn(3001, generator=torch.Generator().manual_seed(1)),
    "special": lambda: _special(5000),
    "large (parallel, several blocks)": lambda: _special(200_003),
    "all nan": lambda: torch.full((17,), math.nan),
    "all inf": lambda: torch.tensor([math.inf, -math.inf, math.inf]),
    "inf and nan only": lambda: torch.tensor([math.inf, math.nan]),
    "zeros": lambda: torch.zeros(40),
    "one element": lambda: torch.tensor([-3.5]),
    "scalar": lambda: torch.tensor(2.0),
    "empty": lambda: torch.zeros(0, 4),
    "mean far from zero": lambda: 1e4 + 1e-2 * torch.randn(10_000),
    "first element an outlier": lambda: torch.cat(
        [torch.tensor([1e6]), torch.randn(10_000)]
    ),
    "float16": lambda: _special(1000).half(),
    "bfloat16": lambda: _special(1000).bfloat16(),
    "float64": lambda: _special(1000).double() * 1e100,
    "permuted": lambda: _special(6 * 7 * 40).reshape(6, 7, 40).permute(2, 0, 1),
    "sliced rows": lambda: _special(8 * 3 * 64).reshape(8, 3, 64)[:, 1],
    "strided": lambda: _special(4000)[::3],
    "broadcast": lambda: _special(50)[:, None].expand(50, 30),
    "mask": lambda: torch.randn(64, 64).masked_fill(
        torch.ones(64, 64).triu(1).bool(), -math.inf
    ),
    # Hugging Face's additive mask: squares past float32's range
    "finfo.min mask": lambda: torch.zeros(64, 64).masked_fill(
        torch.ones(64, 64).triu(1).bool(), torch.finfo(torch.float32).min
    ),
}


def _measure(t: Tensor) -> Metrics.Data:
    return Metrics.Data.from_tensor(t)


@pytest.mark.parametrize("name", list(_TENSORS))
def test_statistics_match_their_definitions(name: str) -> None:
    t = _TENSORS[name]()
    _close(_measure(t), _defined(t))


@pytest.mark.parametrize("name", list(_TENSORS))
def test_torch_kernel_matches_the_native_kernel(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = _TENSORS[name]()
    native = _measure(t)
    monkeypatch.setattr(_NATIVE, "get", lambda: None)  # no C++ kernel
    _close(_measure(t), native)
    monkeypatch.setattr(_KERNELS, "min_numel", 1)  # compiled torch kernel
    _close(_measure(t), native)


def test_native_kernel_runs_on_cpu_float32() -> None:
    if _NATIVE.get() is None:
        pytest.skip(f"no C++ kernel here: {_NATIVE.error}")
    calls = []
    kernel = _NATIVE.get()

    def counting(*args: object) -> None:
        calls.append(args)
        kernel(*args)  # type: ignore[misc]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_NATIVE, "get", lambda: counting)
        _measure(torch.randn(100, 3).t())  # no copy needed: read in place
        _measure(torch.randn(100).half())
    assert len(calls) == 2
    assert calls[0][2:5] == (1, 300, 300)


def test_parallel_statistics_equal_serial(monkeypatch: pytest.MonkeyPatch) -> None:
    t = _special(300_001)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    monkeypatch.setattr(statistics_module, "_NUMEL_PER_THREAD", 1 << 30)
    serial = _measure(t)
    monkeypatch.setattr(statistics_module, "_NUMEL_PER_THREAD", 1 << 12)
    _close(_measure(t), serial, rel=1e-9)


_ONE_SIGNED = {
    "relu (zeros included)": lambda: torch.randn(2**4, 2**10).relu(),
    "negative, several blocks": lambda: -torch.rand(5, 3001) - 1e-3,
    "positive, large (parallel)": lambda: torch.randn(200_003).abs(),
    "negative, with -inf and nan": lambda: torch.cat(
        [-torch.rand(3000), torch.tensor([-math.inf, math.nan, -0.0])]
    ),
    "half, in place": lambda: torch.randn(64, 33).abs().half().t(),
}


@pytest.mark.parametrize("name", list(_ONE_SIGNED))
@pytest.mark.parametrize("kernel", ["native", "torch", "compiled torch"])
def test_mean_abs_equals_abs_mean_for_one_sign(
    name: str, kernel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Equal, not close: the reference's own test compares them with ``==``.
    if kernel != "native":
        monkeypatch.setattr(_NATIVE, "get", lambda: None)
    if kernel == "compiled torch":
        monkeypatch.setattr(_KERNELS, "min_numel", 1)
    monkeypatch.setattr(statistics_module, "_NUMEL_PER_THREAD", 1 << 12)
    t = _ONE_SIGNED[name]()
    data = _measure(t)
    assert data.mean_abs == data.abs_mean
    assert data.mean_abs == pytest.approx(_defined(t).mean_abs, rel=1e-6)
    mixed = _measure(
        torch.cat([t.reshape(-1), torch.tensor([-1.0, 1.0], dtype=t.dtype)])
    )
    assert mixed.abs_mean < mixed.mean_abs  # both signs: no longer equal


# --------------------------------------------------------------------------- #
# Work is shared only between values that are provably the same.
# --------------------------------------------------------------------------- #


def _count_statistics(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    shapes: list[tuple[int, ...]] = []
    measure = tracking_module.raw_statistics

    def counted(t: Tensor, *args: Any) -> Tensor:
        shapes.append(tuple(t.shape))
        return measure(t, *args)

    monkeypatch.setattr(tracking_module, "raw_statistics", counted)
    return shapes


class _Shared(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: Tensor) -> Tensor:
        y = self.fc(x)
        viewed = y.view(4, 2, 4).transpose(1, 2)  # y's only user
        same = F.dropout(viewed, p=0.0, training=False)  # y itself
        residual, skip = U.residual_split(same, tau=0.5)  # views of y
        return U.residual_add(torch.relu(residual), skip, tau=0.5)


def test_same_values_are_measured_once(monkeypatch: pytest.MonkeyPatch) -> None:
    model = track_scales(_Shared())
    x = torch.randn(4, 8)
    unit_backward(model(x))
    shapes = _count_statistics(monkeypatch)
    unit_backward(model(x))
    graph = model.scales_graph()
    nodes = {n.meta["clean_name"]: n.meta["metrics"] for n in _tracked_nodes(graph)}
    for name in ("viewed", "same", "residual", "skip"):
        assert nodes[name].fwd == nodes["y"].fwd, name
    assert nodes["viewed"].bwd == nodes["y"].bwd  # y's only user: same gradient
    _close(nodes["same"].bwd, nodes["y"].bwd)  # the same gradient, reordered
    for name in ("residual", "skip"):  # gradients of their own
        assert nodes[name].bwd != nodes["y"].bwd, name
    # residual_add passes its gradient unchanged to both inputs
    assert nodes["relu"].bwd == nodes["skip"].bwd == nodes["residual_add"].bwd
    # Forward: y, relu and the add. The input and the parameters are the tensors
    # measured in the first call, unchanged since; `same` is y itself. Backward:
    # the 7 distinct gradients (of the add, residual, same, y, x, weight, bias).
    assert sorted(shapes[:3]) == [(4, 4, 2), (4, 4, 2), (4, 8)]
    assert len(shapes) == 3 + 7


def test_changed_parameters_are_measured_again() -> None:
    model = track_scales(_Shared())
    x = torch.randn(4, 8)
    model(x)
    before = _node(model.scales_graph(), "fc.weight").meta["metrics"].fwd
    with torch.no_grad():
        model.fc.weight.mul_(3)  # in place: a new version of the same tensor
    model(x)
    after = _node(model.scales_graph(), "fc.weight").meta["metrics"].fwd
    assert after.mean_abs == pytest.approx(3 * before.mean_abs, rel=1e-6)


def test_reused_memory_is_measured_again() -> None:
    tracking = tracking_module.TrackingPass()
    first = tracking._measure(torch.ones(1000))
    second = tracking._measure(torch.full((1000,), 2.0))  # may reuse memory
    assert first[0] is not second[0]
    assert metrics_module.finalize(second[0].tolist(), 1000).mean_abs == 2.0


def test_inference_tensors_are_measured() -> None:
    model = track_scales(_Shared())
    with torch.inference_mode():
        model(torch.randn(4, 8))
    assert _tracked_nodes(model.scales_graph())


def test_nodes_without_recorded_values_are_checked_at_run_time() -> None:
    def add_untyped_node(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
        output = next(iter(gm.graph.find_nodes(op="output")))
        value = output.args[0][0]
        with gm.graph.inserting_before(output):
            neg = gm.graph.call_function(torch.neg, (value,))  # no example_value
            count = gm.graph.call_method("size", (neg, 0))
            gm.graph.call_function(operator.add, (neg, count))
        output.args = ((neg,),)
        gm.graph.eliminate_dead_code()
        return gm

    untyped = Transform(name="untyped", graph_pass=add_untyped_node)
    model = track_scales(apply_transform(nn.Linear(4, 4), untyped))
    model(torch.randn(2, 4)).sum().backward()
    [neg] = [n for n in model.scales_graph().nodes if n.target is torch.neg]
    assert neg.meta["outputs_float_tensor"]
    assert neg.meta["metrics"].fwd.numel == 8 and neg.meta["metrics"].bwd is not None


# --------------------------------------------------------------------------- #
# Regressions: models that crashed under track_scales.
# --------------------------------------------------------------------------- #


class _VmapEmpty(nn.Module):
    """A vmap over samples holding no elements, as a state-space model's
    associative scan has at its last level."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x: Tensor) -> Tensor:
        empty = torch.vmap(lambda row: (row * 2).reshape(-1))(x[:, :0])
        scaled = torch.vmap(lambda row: row * row.sum())(self.fc(x))
        return scaled.sum() + empty.sum()


def test_values_inside_vmap_are_not_tracked() -> None:
    model = track_scales(_VmapEmpty())
    model(torch.randn(3, 6)).backward()
    graph = model.scales_graph()
    batched = [n for n in graph.nodes if "_add_batch_dim" in str(n.target)]
    assert batched and not any("metrics" in n.meta for n in batched)
    assert not any(n.meta["outputs_float_tensor"] for n in batched)
    assert _node(graph, "x").meta["metrics"].bwd is not None
    for node in _tracked_nodes(graph):
        for data in (node.meta["metrics"].fwd, node.meta["metrics"].bwd):
            assert data is None or not math.isnan(data.mean_abs), node.name


class _SetsRequiresGrad(nn.Module):
    """Sets requires_grad on a tensor computed from its input alone, as
    Hugging Face's audio feature encoders do in training mode."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(1, 4, 3)

    def forward(self, x: Tensor) -> Tensor:
        hidden = x[:, None]
        if self.training:
            hidden.requires_grad = True
        return self.conv(hidden)


def test_model_setting_requires_grad_on_its_input_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = track_scales(_SetsRequiresGrad())
    x = torch.randn(2, 16)
    model(x).sum().backward()
    assert "inputs as given" in caplog.text
    assert not x.requires_grad  # the input was left as given...
    graph = model.scales_graph()
    conv = _node(graph, "conv.weight").meta["metrics"]
    assert conv.bwd is not None  # ...and everything else is tracked
    caplog.clear()
    model(torch.randn(2, 16)).sum().backward()  # later calls: no retry
    assert "inputs as given" not in caplog.text
    model.eval()
    x = torch.randn(2, 16)
    model(x)
    assert not x.requires_grad


def test_input_gradient_fallback_survives_a_copy() -> None:
    model = track_scales(_SetsRequiresGrad())
    model(torch.randn(2, 16))
    copied = copy.deepcopy(model)
    copied(torch.randn(2, 16)).sum().backward()
    assert _tracked_nodes(copied.scales_graph())


def test_other_errors_are_not_retried() -> None:
    class Fails(nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            raise RuntimeError("something else")

    with pytest.raises(RuntimeError, match="something else"):
        track_scales(Fails())(torch.randn(2))


def _hf_small(name: str) -> tuple[nn.Module, dict[str, Tensor]]:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    special = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    audio = {
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "conv_dim": (16, 16),
        "conv_stride": (5, 2),
        "conv_kernel": (10, 3),
        "num_conv_pos_embeddings": 16,
        "num_conv_pos_embedding_groups": 4,
        "vocab_size": 32,
    }
    seq2seq = {
        "d_model": 64,
        "encoder_layers": 2,
        "decoder_layers": 2,
        "encoder_attention_heads": 4,
        "decoder_attention_heads": 4,
        "encoder_ffn_dim": 128,
        "decoder_ffn_dim": 128,
        "vocab_size": 128,
        "decoder_start_token_id": 1,
        **special,
    }
    ids = torch.randint(3, 128, (2, 8))
    if name == "mamba":
        config = transformers.MambaConfig(
            vocab_size=128, hidden_size=64, num_hidden_layers=2, state_size=8
        )
        return transformers.MambaModel(config), {"input_ids": ids}
    if name == "whisper":
        config = transformers.WhisperConfig(
            num_mel_bins=16,
            max_source_positions=16,
            max_target_positions=32,
            **seq2seq,
        )
        inputs = {"input_features": torch.randn(2, 16, 32), "decoder_input_ids": ids}
        return transformers.WhisperModel(config), inputs
    if name == "speech2text":
        config = transformers.Speech2TextConfig(
            input_feat_per_channel=16,
            conv_channels=32,
            max_source_positions=64,
            max_target_positions=32,
            **seq2seq,
        )
        inputs = {"input_features": torch.randn(2, 32, 16), "decoder_input_ids": ids}
        return transformers.Speech2TextModel(config), inputs
    config_class, model_class = {
        "wav2vec2": (transformers.Wav2Vec2Config, transformers.Wav2Vec2Model),
        "hubert": (transformers.HubertConfig, transformers.HubertModel),
    }[name]
    model = model_class(config_class(**audio)).train()
    return model, {"input_values": torch.randn(2, 400)}


@pytest.mark.parametrize(
    "name", ["mamba", "whisper", "wav2vec2", "hubert", "speech2text"]
)
@pytest.mark.parametrize("unit_scaled", [False, True], ids=["plain", "unit_scale"])
def test_hugging_face_models_are_tracked(name: str, unit_scaled: bool) -> None:
    model, inputs = _hf_small(name)
    model = track_scales(unit_scale(model) if unit_scaled else model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        output = model(**inputs)
    output.last_hidden_state.float().pow(2).mean().backward()
    nodes = _tracked_nodes(model.scales_graph())
    assert len(nodes) > 20
    assert sum(n.meta["metrics"].bwd is not None for n in nodes) > 10


def test_pruned_graphs_keep_the_output_metadata(views_graph: Graph) -> None:
    for pruned in (
        prune_non_float_tensors(views_graph),
        prune_same_scale_tensors(views_graph),
        prune_selected_nodes(views_graph, [F.gelu]),
    ):
        [output] = pruned.find_nodes(op="output")
        assert output.meta["clean_name"] == "output"
