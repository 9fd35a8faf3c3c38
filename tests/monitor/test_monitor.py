"""The scale monitor: its statistics against direct computation, its steps,
accumulation, alerts, the inf/NaN guard and compiled models."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from torch import Tensor, nn
from torch._dynamo.utils import counters

import unit_scaling as uu
from unit_scaling import functional as U
from unit_scaling.monitor import (
    KINDS,
    STATISTICS,
    AlertPolicy,
    Monitor,
    NonFiniteError,
    ScaleAlertError,
    tensor_statistics,
)
from unit_scaling.monitor._statistics import FORMATS


def _direct(t: Tensor, scale: float = 1.0) -> dict[str, float]:
    """The statistics, element by element in float64."""
    x = t.detach().double().flatten()
    finite = x[torch.isfinite(x)]
    n = x.numel()
    rms = math.sqrt(float((finite**2).mean())) if finite.numel() else math.inf
    cast = (t.detach().float().abs() * scale).double().flatten()
    out = {
        "rms": rms,
        "abs_max": float(x.abs().nan_to_num(nan=0.0, posinf=math.inf).max()),
        "log2_rms": math.log2(rms),
    }
    for name, fmt in FORMATS.items():
        flush = fmt.min_absolute_subnormal / 2
        out[f"{name}_saturated"] = float((cast > fmt.max_absolute_value).sum()) / n
        out[f"{name}_flushed"] = float(((cast > 0) & (cast <= flush)).sum()) / n
    out["nonfinite"] = float((~torch.isfinite(x)).sum()) / n
    return out


def _planted(seed: int = 0) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(4096, generator=g) * torch.logspace(-12, 6, 4096)
    t[:5] = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan])
    t[5:8] = torch.tensor([448.0, 449.0, 2.0**-10])  # on and past the edges
    return t


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("scale", [1.0, 3.0])
def test_statistics_equal_a_direct_computation(
    dtype: torch.dtype, scale: float
) -> None:
    t = _planted().to(dtype)
    got = tensor_statistics(t, scale)
    want = _direct(t, scale)
    assert list(got) == list(STATISTICS)
    for name in STATISTICS:
        assert got[name] == pytest.approx(want[name], rel=1e-6, abs=0), name
    assert got["nonfinite"] == 3 / 4096
    # the signed zeros are not flushed values; 2^-10 is E4M3's flush threshold
    assert got["e4m3_flushed"] * 4096 == want["e4m3_flushed"] * 4096 > 0


def test_statistics_reject_bad_input() -> None:
    with pytest.raises(TypeError, match="floating-point"):
        tensor_statistics(torch.ones(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="scale"):
        tensor_statistics(torch.ones(3), scale=0.0)


def _mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(uu.Linear(8, 16), uu.GELU(), uu.Linear(16, 4))


def _captured(model: nn.Module) -> dict[str, list[Tensor]]:
    """Each observed module's outputs and their gradients, kept by plain hooks."""
    kept: dict[str, list[Tensor]] = {}

    def hook(name: str):  # type: ignore[no-untyped-def]
        def keep(module: nn.Module, args: object, out: Tensor) -> None:
            kept.setdefault(f"{name}/activation", []).append(out.detach().clone())
            out.register_hook(
                lambda g: kept.setdefault(f"{name}/activation_grad", []).append(g)
            )

        return keep

    for name, module in model.named_children():
        module.register_forward_hook(hook(name))
    return kept


def test_a_record_holds_the_statistics_of_each_tensor() -> None:
    model = _mlp()
    opt = uu.optim.AdamW(model.parameters(), lr=0.1)
    monitor = Monitor(model, every=2, optimizer=opt, alerts=None)
    kept = _captured(model)
    micro_batches = [torch.randn(5, 8), torch.randn(3, 8)]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for x in micro_batches:  # one step, accumulated
        U.micro_batch_loss(model(x).pow(2).mean(), 0.5).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}  # type: ignore[union-attr]
    opt.step()
    table = monitor.table()
    assert set(table["step"]) == {0} and set(table["kind"]) == set(KINDS)

    def recorded(tensor: str, kind: str) -> dict[str, float]:
        rows = table[(table.tensor == tensor) & (table.kind == kind)]
        return dict(zip(rows.statistic, rows.value, strict=True))

    for name in ("0", "1", "2"):
        for kind in ("activation", "activation_grad"):
            whole = torch.cat([t.flatten() for t in kept[f"{name}/{kind}"]])
            got, want = recorded(name, kind), _direct(whole)
            for s in STATISTICS:
                assert got[s] == pytest.approx(want[s], rel=1e-6), (name, kind, s)
    for name, p in model.named_parameters():
        for kind, tensor in (
            ("weight", before[name]),
            ("weight_grad", grads[name]),
            ("update", p.detach() - before[name]),
        ):
            got, want = recorded(name, kind), _direct(tensor)
            assert got["rms"] == pytest.approx(want["rms"], rel=1e-6), (name, kind)
        update = recorded(name, "update")
        assert update["relative_rms"] == pytest.approx(
            update["rms"] / _direct(before[name])["rms"], rel=1e-6
        )


def test_records_only_every_steps_and_not_evaluation() -> None:
    model = _mlp()
    monitor = Monitor(model, every=3, alerts=None, kinds=("activation",))
    for step in range(7):
        model(torch.randn(2, 8)).sum().backward()
        with torch.no_grad():
            model(torch.randn(100, 8))  # evaluation: not part of a step
        assert monitor.recording == (step % 3 == 0)
        monitor.step()
    table = monitor.table()
    assert sorted(set(table["step"])) == [0, 3, 6]
    assert set(table["tensor"]) == {"0", "1", "2"}


def test_aggregates_by_type_and_bounds_the_tensors() -> None:
    model = _mlp()
    by_type = Monitor(model, every=1, alerts=None, aggregate="type")
    worst = Monitor(model, every=1, alerts=None, max_tensors=1)
    x = torch.randn(4, 8)
    model(x).sum().backward()
    by_type.step()
    worst.step()
    t = by_type.table()
    assert set(t[t.kind == "activation"].tensor) == {"Linear", "GELU"}
    assert set(t[t.kind == "weight"].tensor) == {"Linear.weight"}
    linear = torch.cat(
        [model[0](x).flatten(), model[2](model[1](model[0](x))).flatten()]
    )
    rms = t[(t.tensor == "Linear") & (t.kind == "activation") & (t.statistic == "rms")]
    assert rms.value.item() == pytest.approx(_direct(linear)["rms"], rel=1e-6)
    w = worst.table()
    assert w.groupby("kind").tensor.nunique().max() == 1


def test_bad_arguments_are_named() -> None:
    model = _mlp()
    with pytest.raises(ValueError, match="every"):
        Monitor(model, every=0)
    with pytest.raises(ValueError, match="kinds"):
        Monitor(model, kinds=("activations",))
    with pytest.raises(ValueError, match="not in the model"):
        Monitor(model, modules=["9"])
    with pytest.raises(TypeError, match="modules"):
        Monitor(model, modules="0")
    with pytest.raises(TypeError, match=r"nn\.Module"):
        Monitor(lambda x: x)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="flushed"):
        AlertPolicy(flushed=2.0)
    with pytest.raises(RuntimeError, match="optimizer"):
        Monitor(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1)).step()


def _unit_scaled_run(
    steps: int, caplog: pytest.LogCaptureFixture, plant_at: int | None = None
) -> Monitor:
    torch.manual_seed(0)
    model = uu.TransformerDecoder(32, 64, layers=2, heads=2)
    opt = uu.optim.AdamW(model.parameters(), lr=2**-6)
    monitor = Monitor(model, every=5, optimizer=opt)
    tokens = torch.randint(0, 64, (8, 17))
    with caplog.at_level(logging.WARNING, logger="unit_scaling.monitor"):
        for step in range(steps):
            if step == plant_at:
                with torch.no_grad():
                    model.layers[1].mlp.linear_1.weight.mul_(64.0)
            model.loss(tokens).backward()
            opt.step()
            opt.zero_grad()
    return monitor


def test_alerts_stay_silent_on_a_healthy_unit_scaled_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    monitor = _unit_scaled_run(30, caplog)
    assert monitor.alerts is not None and monitor.alerts.unit_scaled
    assert monitor.alerts.fired == [] and not caplog.records


def test_alerts_fire_once_on_a_planted_drift(caplog: pytest.LogCaptureFixture) -> None:
    monitor = _unit_scaled_run(30, caplog, plant_at=12)
    assert monitor.alerts is not None
    fired = [m for m in monitor.alerts.fired if "layers.1.mlp.linear_1" in m]
    assert any("step 15: layers.1.mlp.linear_1.weight (weight) rms" in m for m in fired)
    assert len(set(fired)) == len(fired)  # once per tensor and condition
    assert len(caplog.records) == len(monitor.alerts.fired)


def test_each_kind_is_checked_against_the_format_it_is_cast_to() -> None:
    model = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with torch.no_grad():
        model.weight.fill_(1.0)
    # a gradient past E4M3's 448 but within E5M2's 57344: fine in the recipe
    loud = AlertPolicy(casts={"weight_grad": ("e4m3",)})
    quiet = Monitor(model, every=1, kinds=("weight_grad",))
    checked = Monitor(model, every=1, kinds=("weight_grad",), alerts=loud)
    (model(x).sum() * 1000).backward()
    quiet.step()
    checked.step()
    assert quiet.alerts is not None and quiet.alerts.fired == []
    assert checked.alerts is not None
    assert any("saturate in E4M3" in m for m in checked.alerts.fired)
    with pytest.raises(ValueError, match="unknown kinds"):
        AlertPolicy(casts={"gradient": ("e5m2",)})
    with pytest.raises(ValueError, match="unknown formats"):
        AlertPolicy(casts={"weight": ("e3m4",)})


def test_alerts_can_raise() -> None:
    model = nn.Linear(4, 4)
    with torch.no_grad():
        model.weight.mul_(1e6)
    monitor = Monitor(model, every=1, alerts=AlertPolicy(raise_on_alert=True))
    model(torch.randn(2, 4)).sum().backward()
    with pytest.raises(ScaleAlertError, match="saturate in E4M3"):
        monitor.step()


class _Planted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.armed = False

    def forward(self, x: Tensor) -> Tensor:
        return x / 0.0 if self.armed else x


def test_the_guard_names_the_module_that_made_the_first_nan() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), _Planted(), nn.Linear(4, 4), nn.ReLU())

    class Loss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = model

        def forward(self, x: Tensor) -> Tensor:
            return self.body(x).mean()

    wrapped = Loss()
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    Monitor(wrapped, every=10, optimizer=opt, alerts=None)
    wrapped(torch.randn(3, 4)).backward()
    opt.step()
    model[1].armed = True
    wrapped(torch.randn(3, 4)).backward()
    with pytest.raises(NonFiniteError, match=r"step 1: .*module 'body.1' produced"):
        opt.step()


def test_a_compiled_model_is_compiled_once_per_mode_without_breaks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    torch._dynamo.reset()
    counters.clear()
    model = _mlp()
    opt = uu.optim.AdamW(model.parameters(), lr=0.01)
    monitor = Monitor(model, every=3, optimizer=opt, alerts=None)
    compiled = torch.compile(model, backend="eager")
    x = torch.randn(4, 8)
    graphs = []
    with caplog.at_level(logging.WARNING, logger="unit_scaling.monitor"):
        for step in range(8):
            compiled(x).pow(2).mean().backward()
            if step == 6:
                at_six = {k: v.clone() for k, v in model.state_dict().items()}
            opt.step()
            opt.zero_grad()
            graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[1] == graphs[-1] == 2  # recording and not; none after
    assert not counters["graph_break"]
    table = monitor.table()
    assert sorted(set(table["step"])) == [0, 3, 6]
    assert "activation_grad" not in set(table["kind"])
    assert "activation gradients are not recorded" in caplog.text
    # the compiled record is that of the eager model at the step's weights
    model.load_state_dict(at_six)
    with torch.no_grad():
        first = model[0](x)
    rows = table[
        (table.step == 6) & (table.tensor == "0") & (table.kind == "activation")
    ]
    got = dict(zip(rows.statistic, rows.value, strict=True))
    assert got["rms"] == pytest.approx(_direct(first)["rms"], rel=1e-5)
    torch._dynamo.reset()
