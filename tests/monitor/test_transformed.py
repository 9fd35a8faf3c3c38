"""The monitor on transformed models: activations recorded as the transformed
graph uses them, and the transforms exactly as without it."""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import unit_scaling as uu
from unit_scaling import zoo
from unit_scaling.monitor import Monitor, tensor_statistics
from unit_scaling.monitor._observe import observe_activation
from unit_scaling.transforms import simulate_fp8, track_scales, unit_scale
from unit_scaling.transforms._capture.engine import (
    Transform,
    apply_transform,
    transform_state,
)
from unit_scaling.transforms._capture.targets import calibrated_scale

_ACTIVATIONS = ("activation", "activation_grad")


def _rows(monitor: Monitor, step: int = 0) -> dict[tuple[str, str], dict[str, float]]:
    """``{(tensor, kind): {statistic: value}}`` of the activations at ``step``."""
    found: dict[tuple[str, str], dict[str, float]] = {}
    for row_step, tensor, kind, statistic, value in monitor._rows:
        if row_step == step and kind in _ACTIVATIONS:
            found.setdefault((tensor, kind), {})[statistic] = value
    return found


def _observed_nodes(model: nn.Module) -> dict[str, str]:
    """Module name -> the node its observer follows, in the first graph."""
    state = transform_state(model)
    assert state is not None
    graph = state.captures[0].graph_module.graph
    return {
        n.args[1].rpartition("@")[0]: n.args[0].name
        for n in graph.nodes
        if n.target is observe_activation
    }


def _train_step(model: nn.Module, name: str, monitor: Monitor | None) -> Tensor:
    out = zoo.get(name).run(model, 0)
    out.float().pow(2).mean().backward()
    if monitor is not None:
        monitor.step()
    return out


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_a_unit_scaled_model_is_monitored_without_changing_it(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    model = zoo.get(name)
    plain = unit_scale(model.make(0))
    monitored = unit_scale(model.make(0))
    monitor = Monitor(monitored, every=2, alerts=None)
    with caplog.at_level(logging.WARNING):
        for step in range(3):
            expected = _train_step(plain, name, None)
            got = _train_step(monitored, name, monitor)
            assert torch.equal(got, expected), step
            for (p_name, p), q in zip(
                plain.named_parameters(), monitored.parameters(), strict=True
            ):
                assert torch.equal(p.grad, q.grad), (step, p_name)  # type: ignore[arg-type]
                p.grad = q.grad = None
    report = str(monitored.unit_scale_report())  # type: ignore[operator]
    assert report == str(plain.unit_scale_report())  # type: ignore[operator]
    assert "observe" not in report
    # recording on steps 0 and 2, not on 1, from one capture
    assert len(transform_state(monitored).captures) == 1  # type: ignore[union-attr]
    assert sorted({row[0] for row in monitor._rows}) == [0, 2]
    assert "not recorded" not in caplog.text
    assert "monitor observer" not in caplog.text
    # every module an eager monitor records, each kept through the passes
    eager = model.make(0)
    eager_monitor = Monitor(eager, every=1, alerts=None)
    _train_step(eager, name, eager_monitor)
    assert set(_rows(monitor)) == set(_rows(eager_monitor))
    assert len(_observed_nodes(monitored)) == len(eager_monitor._handles) - 2


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_activations_are_those_the_transformed_graph_uses(name: str) -> None:
    model = zoo.get(name)
    tracked = track_scales(unit_scale(model.make(0)))
    monitor = Monitor(tracked, every=1, alerts=None)
    args, kwargs = model.example(0)
    raw = tracked(*args, **kwargs)
    logits = model.output(raw)
    logits.retain_grad()
    logits.float().pow(2).mean().backward()
    monitor.step()
    rows = _rows(monitor)
    # track_scales measures each value and gradient of the same graph itself
    metrics = {n.name: n.meta.get("metrics") for n in tracked.scales_graph().nodes}  # type: ignore[operator]
    nodes = _observed_nodes(tracked)
    assert set(nodes) == {tensor for tensor, _ in rows}
    for tensor, node in nodes.items():
        for kind, data in (
            ("activation", metrics[node].fwd),
            ("activation_grad", metrics[node].bwd),
        ):
            if data is None:  # (rotary tables get no gradient)
                assert (tensor, kind) not in rows
                continue
            got = rows[(tensor, kind)]
            rms = math.sqrt(
                data.std**2 * (data.numel - 1) / data.numel + data.abs_mean**2
            )
            assert got["abs_max"] == data.abs_max, (tensor, kind)
            assert got["rms"] == pytest.approx(rms, rel=1e-5), (tensor, kind)
    # and the last layer's output is the model's logits
    assert rows[("lm_head", "activation")] == pytest.approx(_statistics(logits))
    assert rows[("lm_head", "activation_grad")] == pytest.approx(
        _statistics(logits.grad)
    )


class _Bump(nn.Module):
    """An activation no unit-scaling rule covers: ``unit_scale`` calibrates it."""

    def forward(self, x: Tensor) -> Tensor:
        return 3 * torch.exp(-x * x)


def test_a_calibrated_output_is_recorded_after_its_scale() -> None:
    torch.manual_seed(0)
    model = track_scales(
        unit_scale(nn.Sequential(nn.Linear(16, 64), _Bump(), nn.Linear(64, 8)))
    )
    monitor = Monitor(model, every=1, alerts=None)
    model(torch.randn(32, 16)).pow(2).mean().backward()
    monitor.step()
    graph = transform_state(model).captures[0].graph_module.graph  # type: ignore[union-attr]
    scaled = next(n for n in graph.nodes if n.target is calibrated_scale)
    # the value the next layer reads is the calibrated one, and is observed
    assert uu.functional.linear in {user.target for user in scaled.users}
    assert _observed_nodes(model)["1"] == scaled.name
    factor = scaled.args[1]
    assert not 0.5 < factor < 2  # (the region's own output is far from unit scale)
    metrics = {n.name: n.meta.get("metrics") for n in model.scales_graph().nodes}  # type: ignore[operator]
    got = _rows(monitor)[("1", "activation")]
    assert got["abs_max"] == metrics[scaled.name].fwd.abs_max
    assert got["rms"] == pytest.approx(1.0, abs=0.2)


def test_simulate_fp8_of_a_unit_scaled_model_records_its_activations() -> None:
    def mlp() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(uu.Linear(8, 16), uu.GELU(), uu.Linear(16, 4))

    x = torch.randn(4, 8)
    plain, monitored = simulate_fp8(mlp()), simulate_fp8(mlp())
    monitor = Monitor(monitored, every=1, alerts=None)
    expected = plain(x)
    out = monitored(x)
    out.retain_grad()
    out.pow(2).mean().backward()
    monitor.step()
    assert torch.equal(out, expected)
    rows = _rows(monitor)
    assert {tensor for tensor, _ in rows} == {"0", "1", "2"}
    assert rows[("2", "activation")] == pytest.approx(_statistics(out))
    assert rows[("2", "activation_grad")] == pytest.approx(_statistics(out.grad))


def test_a_compiled_graph_leaves_activations_unrecorded_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def backend(gm: Any, inputs: Any) -> Any:
        return gm.forward  # (as a compiler would, without running it eagerly)

    model = apply_transform(
        unit_scale(nn.Sequential(nn.Linear(8, 8), nn.ReLU())),
        Transform(name="compiled", backend=backend),
    )
    monitor = Monitor(model, every=1, alerts=None)
    with caplog.at_level(logging.WARNING):
        model(torch.randn(4, 8)).sum().backward()
        monitor.step()
    assert not _rows(monitor)
    assert "compiled compiles the graph" in caplog.text
    assert "activations and their gradients are not recorded" in caplog.text


def _statistics(t: Tensor | None) -> dict[str, float]:
    assert t is not None
    return tensor_statistics(t)
