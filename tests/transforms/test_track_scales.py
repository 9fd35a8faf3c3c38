"""Tests for ``track_scales``, ``Metrics`` and the ``prune_*`` functions."""

from __future__ import annotations

import dataclasses
import math

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

META_KEYS = ("clean_name", "outputs_float_tensor", "requires_grad")


def _tracked_nodes(graph: Graph) -> list:  # type: ignore[type-arg]
    return [n for n in graph.nodes if "metrics" in n.meta]


def _fields(data: Metrics.Data | None) -> dict[str, float]:
    return {} if data is None else dataclasses.asdict(data)


@dataclasses.dataclass
class Tracked:
    model: nn.Module
    graph: Graph


@pytest.fixture(scope="module", params=list(CASES))
def tracked(request: pytest.FixtureRequest) -> Tracked:
    return Tracked(*tracked_unit_scaled(CASES[request.param]))


def test_every_float_tensor_has_metrics(tracked: Tracked) -> None:
    nodes = [n for n in tracked.graph.nodes if n.op != "output"]
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


def test_scales_graph_before_forward_raises() -> None:
    with pytest.raises(RuntimeError, match="forward"):
        track_scales(MLP()).scales_graph()


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
