"""A step of a transform that fails and falls back is reported, never silent."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from unit_scaling.transforms import unit_scale
from unit_scaling.transforms._capture.fallbacks import Fallback, collecting, fell_back
from unit_scaling.transforms._unit import recognise as _recognise


class HandWrittenNorm(nn.Module):
    """An RMSNorm written out in ops, which ``unit_scale`` recognises numerically."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.linear = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        x = self.linear(x)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * x


def test_a_failed_recognition_is_a_report_entry(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    def broken(*args: Any) -> Any:
        raise RuntimeError("expected all tensors to be on the same device\nmore")

    x = torch.randn(4, 16)
    recognised = unit_scale(HandWrittenNorm(16))
    recognised(x)
    assert recognised.unit_scale_report().fallbacks == []
    monkeypatch.setattr(_recognise, "run_quietly", broken)
    capfd.readouterr()
    model = unit_scale(HandWrittenNorm(16))
    model(x)
    report = model.unit_scale_report()
    assert report.fallbacks, "the failed recognition was not reported"
    entry = report.fallbacks[0]
    assert entry.step == "recognise"
    assert entry.error == "RuntimeError: expected all tensors to be on the same device"
    assert "fallback: recognise fell back at" in str(report)
    assert report.counts() != recognised.unit_scale_report().counts()
    assert capfd.readouterr().err == ""


def test_outside_a_transform_a_fallback_is_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="unit_scaling"):
        entry = fell_back("library rewrite", "MultiheadAttention", ValueError("no"))
    assert entry == Fallback("library rewrite", "MultiheadAttention", "ValueError: no")
    assert "library rewrite fell back at MultiheadAttention: ValueError: no" in (
        caplog.text
    )
    with collecting() as found, caplog.at_level(logging.WARNING):
        caplog.clear()
        fell_back("recognise", "x -> y", "a reason")
    assert found == [Fallback("recognise", "x -> y", "a reason")]
    assert caplog.text == ""


def test_a_non_finite_gradient_measurement_is_reported_not_applied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from unit_scaling.transforms._unit import gradients as _gradients

    monkeypatch.setattr(_gradients, "_moments", lambda g: (float("nan"),) * 2)
    model = unit_scale(HandWrittenNorm(16))
    model(torch.randn(4, 16))
    report = model.unit_scale_report()
    calibrations = [f for f in report.fallbacks if f.step == "gradient calibration"]
    assert calibrations and all(f.error == "gradient RMS nan" for f in calibrations)
    assert set(report.gradient_scales().values()) == {1.0}
