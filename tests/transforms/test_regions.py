"""Ops without a rule: graph patterns, recognised hand-written ops, calibrated
regions, and what ``unit_scale`` reports about each."""

from __future__ import annotations

import logging
import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import unit_scaling.functional as U
from tests.helpers import unit_backward
from unit_scaling.transforms import UnitScaleReport, unit_scale, unit_scale_report

LOGGER = "unit_scaling.transforms.unit_scale"


def _rms(t: Tensor) -> float:
    return float(t.detach().double().square().mean().sqrt())


class Apply(nn.Module):
    """``fn(linear(x))``: a region of ops between two rule-covered layers."""

    def __init__(self, fn: object, width: int = 64) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.fn = fn

    def forward(self, x: Tensor) -> Tensor:
        return self.fn(self.fc(x))  # type: ignore[operator,no-any-return]


def _hand_gelu(x: Tensor) -> Tensor:
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _hand_rms_norm(x: Tensor) -> Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def _report(model: nn.Module) -> UnitScaleReport:
    return unit_scale_report(model)


# --------------------------------------------------------------------------- #
# Recognised: patterns and hand-written ops become analytic rules.
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    ("fn", "name"),
    [(_hand_gelu, "gelu"), (_hand_rms_norm, "rms_norm")],
)
def test_hand_written_ops_are_recognised(fn: object, name: str) -> None:
    model = unit_scale(Apply(fn))
    x = torch.randn(32, 64)
    out = model(x)
    rows = [r for r in _report(model).ops if r.op == name]
    assert rows and rows[0].how == "analytic" and "recognised" in rows[0].detail
    target = getattr(U, name)
    h = U.linear(x, model.fc.weight, model.fc.bias, constraint=None)
    expected = target(h, approximate="tanh") if name == "gelu" else target(h, (64,))
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)


def test_norm_with_offset_gain_is_recognised() -> None:
    """Gemma's ``x_hat * (1 + w)``: the parameter enters through ``1 + w``."""

    class OffsetNorm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(64, 64)
            self.weight = nn.Parameter(torch.zeros(64))

        def forward(self, x: Tensor) -> Tensor:
            return _hand_rms_norm(self.fc(x)) * (1.0 + self.weight)

    model = unit_scale(OffsetNorm())
    x = torch.randn(8, 64)
    out = model(x)
    assert any(r.op == "rms_norm" for r in _report(model).ops)
    unit_backward(out)
    assert model.weight.grad is not None and _rms(model.weight.grad) > 0


def test_softcap_pattern_becomes_softcap() -> None:
    model = unit_scale(Apply(lambda h: torch.tanh(h / 30.0) * 30.0))
    x = torch.randn(32, 64)
    out = model(x)
    assert any(r.detail == "recognised: softcap" for r in _report(model).ops)
    h = U.linear(x, model.fc.weight, model.fc.bias, constraint=None)
    torch.testing.assert_close(out, U.softcap(h, 30.0, constraint=None))


def test_addmm_with_a_transposed_weight_is_a_linear_layer() -> None:
    class Conv1DLike(nn.Module):  # Hugging Face's GPT-2 Conv1D, in effect
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(16, 32) * 0.02)
            self.bias = nn.Parameter(torch.randn(32) * 0.02)

        def forward(self, x: Tensor) -> Tensor:
            return torch.addmm(self.bias, x.view(-1, 16), self.weight)

    model = unit_scale(Conv1DLike())
    x = torch.randn(8, 16)
    out = model(x)
    assert model.weight.std().item() == pytest.approx(1, abs=1e-4)
    assert torch.all(model.bias == 0)
    expected = U.linear(x, model.weight.t(), model.bias, constraint=None)
    torch.testing.assert_close(out, expected)


# --------------------------------------------------------------------------- #
# Calibrated regions.
# --------------------------------------------------------------------------- #


def test_composition_is_calibrated_whole() -> None:
    """``50 tanh(x / 50)`` is the identity for unit inputs: calibrating each op
    alone would turn it into ``tanh``. (Here the softcap pattern is hidden by a
    sum, so the region rule, not the pattern, must get it right.)"""
    model = unit_scale(Apply(lambda h: torch.tanh(h / 50.0 + 0.0) * 50.0 + h * 0.0))
    x = torch.randn(256, 64)
    out = model(x)
    h = U.linear(x, model.fc.weight, model.fc.bias, constraint=None)
    torch.testing.assert_close(out, h, rtol=0.02, atol=0.02)


def test_calibrated_region_is_unit_scaled_with_its_true_gradient() -> None:
    def softplus_ish(h: Tensor) -> Tensor:
        return torch.log1p(torch.exp(h)) * 3.0

    model = unit_scale(Apply(softplus_ish))
    x = torch.randn(512, 64)
    out = model(x)
    rows = [r for r in _report(model).ops if r.how == "calibrated"]
    assert rows, _report(model)
    factor = float(rows[0].detail.lstrip("x"))
    assert 0.5 <= _rms(out) <= 2
    h = U.linear(x, model.fc.weight, model.fc.bias, constraint=None)
    torch.testing.assert_close(out, softplus_ish(h) * factor, rtol=1e-5, atol=1e-5)


def test_mask_fill_values_do_not_count_in_a_calibration() -> None:
    def masked(h: Tensor) -> Tensor:
        mask = torch.ones(h.shape, dtype=torch.bool).tril(-1)
        return (h * 2).masked_fill(mask, torch.finfo(h.dtype).min)

    model = unit_scale(Apply(masked))
    out = model(torch.randn(64, 64))
    visible = out[out > torch.finfo(out.dtype).min / 2]
    assert 0.5 <= _rms(visible) <= 2


def test_region_that_cannot_be_calibrated_is_reported_and_warned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Code traced under ``vmap`` carries batch levels a rewrite would break: it
    is left as it is, reported, and named in one warning."""

    def vmapped(h: Tensor) -> Tensor:
        return torch.vmap(lambda row: torch.sin(row) * 3)(h)

    caplog.set_level(logging.WARNING, logger=LOGGER)
    model = unit_scale(Apply(vmapped))
    out = model(torch.randn(8, 64))
    assert torch.isfinite(out).all()
    left = _report(model).left_as_is
    assert left and "vmap" in left[0].detail
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len([w for w in warnings if "as they are" in w]) == 1
    assert "vmap" in next(w for w in warnings if "as they are" in w)


def test_calibration_leaves_the_random_state_alone() -> None:
    model = unit_scale(Apply(lambda h: torch.exp(h) * 2))
    torch.manual_seed(0)
    state = torch.random.get_rng_state()
    model(torch.randn(4, 64, generator=torch.Generator().manual_seed(1)))
    assert torch.equal(state, torch.random.get_rng_state())


# --------------------------------------------------------------------------- #
# The report.
# --------------------------------------------------------------------------- #


def test_report_before_and_after_a_call() -> None:
    model = unit_scale(Apply(lambda h: torch.exp(h)))
    assert "nothing captured" in str(_report(model))
    model(torch.randn(4, 64))
    report = _report(model)
    assert report.counts()["analytic"] == 1  # the linear layer
    # exp (and, depending on the draw, a gradient correction at the linear's output)
    assert [
        r.op for r in report.ops if r.how == "calibrated" and r.op != "gradient"
    ] == ["exp"]
    rows = report.summary()
    assert ("exp", "calibrated") in {(r[0], r[1]) for r in rows}
    text = str(report)
    assert "exp" in text and "calibrated" in text and "linear" in text
    frame = report.to_dataframe()
    assert list(frame.columns) == ["op", "how", "module", "count", "detail"]
    assert {p.name for p in report.parameters} == {"fc.weight", "fc.bias"}


def test_report_of_a_module_not_transformed_raises() -> None:
    with pytest.raises(TypeError, match="unit_scale"):
        unit_scale_report(nn.Linear(2, 2))


def test_report_groups_layers_under_one_pattern() -> None:
    model = unit_scale(
        nn.Sequential(*(Apply(torch.exp, 16) for _ in range(3)), nn.Linear(16, 4))
    )
    model(torch.randn(4, 16))
    rows = {(op, module): n for op, _, module, n, _ in _report(model).summary()}
    assert rows[("exp", "*")] == 3


# --------------------------------------------------------------------------- #
# A loss outside the model.
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("inside", [False, True])
def test_loss_outside_the_model_is_reported_once(
    inside: bool, caplog: pytest.LogCaptureFixture
) -> None:
    model = unit_scale(nn.Sequential(nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 64)))
    caplog.set_level(logging.WARNING, logger=LOGGER)
    targets = torch.randint(64, (512,))
    for _ in range(2):
        logits = model(torch.randn(512, 32))
        if inside:
            loss = U.cross_entropy(logits, targets)
        else:
            loss = F.cross_entropy(logits, targets)  # mean over 512: grads / 512
        loss.backward()
    warned = [r for r in caplog.records if "loss computed outside" in r.getMessage()]
    assert len(warned) == (0 if inside else 1)
    if not inside:
        assert "labels=" in warned[0].getMessage()
