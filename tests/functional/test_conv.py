"""Tests for the unit-scaled ``conv1d``, ``conv2d`` and ``conv3d``.

Each case states its expected scales by hand from the rule
``alpha = (fan_in·K)^-½``, ``beta_x = (S·G / (fan_out·K))^½``,
``beta_W = (L_out·N)^-½``. Tolerances: every tensor checked for unit scale has
``N >= 2048`` elements, each (but the input gradient near the edges) a sum of many
unit terms, so ``rtol=0.1`` is > 6σ of the RMS estimate (``1/sqrt(2N)``); edge
positions with fewer terms move the input-gradient RMS by ~1% here. The bias
gradient has only ``C_out`` elements and gets a 6σ tolerance of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import unit_scaling.functional as U
from tests.helpers import assert_unit_scale, gradcheck_scaled, randn, unit_backward


@dataclass
class Case:
    op: str
    input: tuple[int, ...]
    weight: tuple[int, ...]
    kwargs: dict[str, Any]
    scales: tuple[float, float, float]  # alpha, beta_x, beta_W (unconstrained)

    def __str__(self) -> str:
        return f"{self.op}{self.input}{self.weight}{self.kwargs}"


CASES = [
    # fan_in·K = 32·3; S·G/(fan_out·K) = 1/(64·3); L_out·N = 254·8
    Case("conv1d", (8, 32, 256), (64, 32, 3), {}, (96**-0.5, 192**-0.5, 2032**-0.5)),
    # stride 2: S/(fan_out·K) = 2/(128·5); L_out = (256 + 4 - 5)//2 + 1 = 128
    Case(
        "conv1d",
        (16, 32, 256),
        (128, 32, 5),
        {"stride": 2, "padding": 2},
        (160**-0.5, (2 / 640) ** 0.5, 2048**-0.5),
    ),
    # groups 4: fan_in = 16, G/(fan_out·K) = 4/(64·3); 'same' keeps L_out = 256
    Case(
        "conv1d",
        (8, 64, 256),
        (64, 16, 3),
        {"padding": "same", "groups": 4, "dilation": 2},
        (48**-0.5, (4 / 192) ** 0.5, 2048**-0.5),
    ),
    # unbatched: N = 1, L_out = 1024 - 2
    Case("conv1d", (64, 1024), (64, 64, 3), {}, (192**-0.5, 192**-0.5, 1022**-0.5)),
    # 3x3: fan_in·K = 16·9; fan_out·K = 32·9; L_out = 22·22, N = 4
    Case(
        "conv2d",
        (4, 16, 24, 24),
        (32, 16, 3, 3),
        {"padding": "valid"},
        (144**-0.5, 288**-0.5, 1936**-0.5),
    ),
    # stride (2, 1): S = 2; L_out = 16·32 (padding 1)
    Case(
        "conv2d",
        (4, 16, 32, 32),
        (32, 16, 3, 3),
        {"stride": (2, 1), "padding": 1},
        (144**-0.5, (2 / 288) ** 0.5, 2048**-0.5),
    ),
    # unbatched 2-D
    Case(
        "conv2d",
        (16, 48, 48),
        (32, 16, 3, 3),
        {"padding": 1},
        (144**-0.5, 288**-0.5, 2304**-0.5),
    ),
    # 3x3x3 (3-D borders weigh more: pad to keep them to ~6%): fan_in·K = 8·27;
    # fan_out·K = 16·27; L_out·N = 16³·2
    Case(
        "conv3d",
        (2, 8, 16, 16, 16),
        (16, 8, 3, 3, 3),
        {"padding": 1},
        (216**-0.5, 432**-0.5, 8192**-0.5),
    ),
    # stride (1, 2, 2), groups 2: fan_in = 4, S·G = 8; L_out·N = 16·8·8·4
    Case(
        "conv3d",
        (4, 8, 16, 16, 16),
        (16, 4, 3, 3, 3),
        {"stride": (1, 2, 2), "padding": 1, "groups": 2},
        (108**-0.5, (8 / 432) ** 0.5, 4096**-0.5),
    ),
]
CONSTRAINTS = [None, "to_output_scale", "to_grad_input_scale", "gmean", "amean"]


def _shared(constraint: str | None, alpha: float, beta_x: float) -> tuple[float, ...]:
    return {
        None: (alpha, beta_x),
        "to_output_scale": (alpha, alpha),
        "to_grad_input_scale": (beta_x, beta_x),
        "gmean": ((alpha * beta_x) ** 0.5,) * 2,
        "amean": ((alpha + beta_x) / 2,) * 2,
    }[constraint]


def _run(case: Case, constraint: str | None) -> dict[str, torch.Tensor]:
    x = randn(*case.input, seed=1)
    w = randn(*case.weight, seed=2)
    b = randn(case.weight[0], seed=3)
    y = getattr(U, case.op)(x, w, b, **case.kwargs, constraint=constraint)
    grad = unit_backward(y)
    refs = [t.detach().requires_grad_() for t in (x, w, b)]
    y_ref = getattr(F, case.op)(*refs, **case.kwargs)
    y_ref.backward(grad)
    return {
        "y": y,
        "y_ref": y_ref,
        **{name: t.grad for name, t in zip("xwb", (x, w, b), strict=True)},
        **{name + "_ref": t.grad for name, t in zip("xwb", refs, strict=True)},
    }


@pytest.mark.parametrize("constraint", CONSTRAINTS)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_conv_matches_torch_times_scales(case: Case, constraint: str | None) -> None:
    alpha, beta_x, beta_w = case.scales
    alpha, beta_x = _shared(constraint, alpha, beta_x)
    r = _run(case, constraint)
    torch.testing.assert_close(r["y"], alpha * r["y_ref"])
    torch.testing.assert_close(r["x"], beta_x * r["x_ref"])
    torch.testing.assert_close(r["w"], beta_w * r["w_ref"])
    torch.testing.assert_close(r["b"], beta_w * r["b_ref"])


@pytest.mark.parametrize("case", CASES, ids=str)
def test_conv_unconstrained_is_unit_scaled(case: Case) -> None:
    r = _run(case, None)
    for name in "ywx":
        assert_unit_scale(r[name], name=name)
    # The bias gradient has only C_out elements: allow 6σ of its RMS estimate.
    assert_unit_scale(r["b"], rtol=6 / (2 * r["b"].numel()) ** 0.5, name="b")


def test_conv_scale_power_and_default_constraint() -> None:
    x, w = randn(8, 16, 64, seed=1), randn(32, 16, 3, seed=2)
    y = U.conv1d(x, w, scale_power=(1.0, 0.5, 0.5))
    torch.testing.assert_close(y, F.conv1d(x, w) / 48)
    assert_unit_scale(U.conv1d(x, w))


def test_conv_gradcheck() -> None:
    def f64(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, dtype=torch.float64, requires_grad=True)

    x, w, b = f64(2, 4, 7), f64(6, 2, 3), f64(6)
    # groups 2: fan_in = 2; stride 2: L_out = 3
    scales = (6**-0.5, (4 / 18) ** 0.5, 6**-0.5)
    assert gradcheck_scaled(
        lambda x, w, b: U.conv1d(x, w, b, stride=2, groups=2, constraint=None),
        [x, w, b],
        scales[0],
        [scales[1], scales[2], scales[2]],
    )
    x, w = f64(1, 2, 5, 4), f64(3, 2, 2, 2)
    assert gradcheck_scaled(
        lambda x, w: U.conv2d(x, w, padding="same"),
        [x, w],
        8**-0.5,
        [8**-0.5, 20**-0.5],
    )
    # 3-D, stride 2: fan_in·K = 16, S/(fan_out·K) = 8/(2·8); L_out·N = 2·2·2·2
    x, w, b = f64(2, 2, 4, 4, 4), f64(2, 2, 2, 2, 2), f64(2)
    scales = (16**-0.5, 0.5**0.5, 16**-0.5)
    assert gradcheck_scaled(
        lambda x, w, b: U.conv3d(x, w, b, stride=2, constraint=None),
        [x, w, b],
        scales[0],
        [scales[1], scales[2], scales[2]],
    )


@pytest.mark.parametrize(
    ("op", "input", "weight", "kwargs", "match"),
    [
        ("conv1d", (2, 4, 8), (6, 4, 3, 3), {}, "weight of shape"),
        ("conv1d", (2, 5, 8), (6, 4, 3), {}, "C_in"),
        ("conv2d", (8,), (6, 4, 3, 3), {}, "input of shape"),
        ("conv3d", (2, 4, 8, 8), (6, 4, 3, 3), {}, "3 spatial dims"),
        ("conv3d", (2, 4, 8, 8, 8), (6, 4, 3, 3, 3), {"dilation": (1, 2)}, "dilation="),
        ("conv1d", (2, 4, 8), (6, 4, 3), {"padding": "full"}, "padding='full'"),
        ("conv2d", (2, 4, 8, 8), (6, 4, 3, 3), {"stride": (1, 2, 3)}, "stride="),
        (
            "conv1d",
            (2, 4, 8),
            (6, 4, 3),
            {"constraint": "to_left_grad_scale"},
            "exactly 3",
        ),
        (
            "conv1d",
            (2, 4, 8),
            (6, 4, 3),
            {"constraint": "max"},
            "not a known constraint",
        ),
    ],
)
def test_conv_rejects_bad_arguments(
    op: str,
    input: tuple[int, ...],
    weight: tuple[int, ...],
    kwargs: dict[str, Any],
    match: str,
) -> None:
    with pytest.raises(ValueError, match=match):
        getattr(U, op)(randn(*input), randn(*weight), **kwargs)
