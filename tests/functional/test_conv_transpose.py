"""Tests for the unit-scaled ``conv_transpose1d``, ``2d`` and ``3d``.

Each case states its expected scales by hand from the rule
``alpha = (fan_in·K/S)^-½``, ``beta_x = (fan_out·K)^-½``, ``beta_W = (N·L_in)^-½``,
``beta_b = (N·L_out)^-½`` with ``fan_in = C_in/G`` and ``fan_out = C_out/G``.
Tolerances: the checked tensors have ``>= 1024`` elements (most ``>= 4096``), so
``rtol=0.1`` is > 4.5σ of the RMS estimate; border positions (with fewer terms
than the rule counts) move the measured RMS by up to ~4% in these cases. The
bias gradient has only ``C_out`` elements and gets a 6σ tolerance of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import unit_scaling.functional as U
from tests.helpers import assert_unit_scale, gradcheck_scaled, randn, unit_backward
from unit_scaling.constraints import apply_constraint


@dataclass
class Case:
    op: str
    input: tuple[int, ...]
    weight: tuple[int, ...]
    kwargs: dict[str, Any]
    scales: tuple[float, float, float, float]  # alpha, beta_x, beta_W, beta_b

    def __str__(self) -> str:
        return f"{self.op}{self.input}{self.weight}{self.kwargs}"


CASES = [
    # stride 1: fan_in·K/S = 32·3; fan_out·K = 64·3; L_in = 256, L_out = 258
    Case(
        "conv_transpose1d",
        (8, 32, 256),
        (32, 64, 3),
        {},
        (96**-0.5, 192**-0.5, 2048**-0.5, 2064**-0.5),
    ),
    # the usual 2x upsampler: K=4, S=2, padding 1 → L_out = 512
    Case(
        "conv_transpose1d",
        (8, 32, 256),
        (32, 32, 4),
        {"stride": 2, "padding": 1},
        (64**-0.5, 128**-0.5, 2048**-0.5, 4096**-0.5),
    ),
    # stride > kernel (gaps in the output): K/S = 1/2; output_padding 1;
    # L_out = 255·4 + 1 + 1 + 1 = 1023
    Case(
        "conv_transpose1d",
        (8, 32, 256),
        (32, 64, 2),
        {"stride": 4, "output_padding": 1, "dilation": 1},
        (16**-0.5, 128**-0.5, 2048**-0.5, 8184**-0.5),
    ),
    # groups 4, dilation 2: fan_in = 16, fan_out = 8; K = 3, S = 2;
    # L_out = 127·2 - 2 + 4 + 1 = 257
    Case(
        "conv_transpose1d",
        (16, 64, 128),
        (64, 8, 3),
        {"stride": 2, "padding": 1, "groups": 4, "dilation": 2},
        (24**-0.5, 24**-0.5, 2048**-0.5, 4112**-0.5),
    ),
    # unbatched: N = 1
    Case(
        "conv_transpose1d",
        (64, 1024),
        (64, 64, 3),
        {"padding": 1},
        (192**-0.5, 192**-0.5, 1024**-0.5, 1024**-0.5),
    ),
    # 2-D 2x upsampler: K = 16, S = 4; L_in = 32², L_out = 64²
    Case(
        "conv_transpose2d",
        (4, 16, 32, 32),
        (16, 16, 4, 4),
        {"stride": 2, "padding": 1},
        (64**-0.5, 256**-0.5, 4096**-0.5, 16384**-0.5),
    ),
    # 2-D, stride (2, 1), 3x3: K/S = 9/2; L_out = 63·32
    Case(
        "conv_transpose2d",
        (4, 16, 32, 32),
        (16, 32, 3, 3),
        {"stride": (2, 1), "padding": 1},
        (72**-0.5, 288**-0.5, 4096**-0.5, 8064**-0.5),
    ),
    # 3-D 2x upsampler, K = S = 8: each output element has exactly C_in terms
    Case(
        "conv_transpose3d",
        (2, 16, 8, 8, 8),
        (16, 8, 2, 2, 2),
        {"stride": 2},
        (16**-0.5, 64**-0.5, 1024**-0.5, 8192**-0.5),
    ),
]
CONSTRAINTS = [None, "to_output_scale", "to_grad_input_scale", "gmean"]


def _run(case: Case, constraint: str | None) -> dict[str, torch.Tensor]:
    x = randn(*case.input, seed=1)
    w = randn(*case.weight, seed=2)
    groups = case.kwargs.get("groups", 1)
    b = randn(case.weight[1] * groups, seed=3)
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
def test_conv_transpose_matches_torch_times_scales(
    case: Case, constraint: str | None
) -> None:
    alpha, beta_x, beta_w, beta_b = case.scales
    alpha, beta_x = apply_constraint(constraint, alpha, beta_x)
    r = _run(case, constraint)
    torch.testing.assert_close(r["y"], alpha * r["y_ref"])
    torch.testing.assert_close(r["x"], beta_x * r["x_ref"])
    torch.testing.assert_close(r["w"], beta_w * r["w_ref"])
    torch.testing.assert_close(r["b"], beta_b * r["b_ref"])


@pytest.mark.parametrize("case", CASES, ids=str)
def test_conv_transpose_unconstrained_is_unit_scaled(case: Case) -> None:
    r = _run(case, None)
    for name in "ywx":
        assert_unit_scale(r[name], name=name)
    assert_unit_scale(r["b"], rtol=6 / (2 * r["b"].numel()) ** 0.5, name="b")


def test_conv_transpose_gradcheck() -> None:
    def f64(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, dtype=torch.float64, requires_grad=True)

    # groups 2: fan_in = 2, fan_out = 3, K = 3, S = 2; L_in = 5, L_out = 11
    x, w, b = f64(2, 4, 5), f64(4, 3, 3), f64(6)
    alpha, beta_x = 3**-0.5, 9**-0.5
    assert gradcheck_scaled(
        lambda x, w, b: U.conv_transpose1d(x, w, b, 2, groups=2, constraint=None),
        [x, w, b],
        alpha,
        [beta_x, 10**-0.5, 22**-0.5],
    )
    x, w = f64(1, 2, 3, 3), f64(2, 2, 2, 2)
    alpha = (8 / 4) ** -0.5  # fan_in·K/S = 2·4/4
    assert gradcheck_scaled(
        lambda x, w: U.conv_transpose2d(x, w, stride=2), [x, w], alpha, [alpha, 3**-1]
    )


@pytest.mark.parametrize(
    ("op", "input", "weight", "kwargs", "match"),
    [
        ("conv_transpose1d", (2, 4, 8), (4, 6, 3, 3), {}, "weight of shape"),
        ("conv_transpose1d", (2, 5, 8), (4, 6, 3), {}, "C_in"),
        ("conv_transpose1d", (2, 6, 8), (6, 2, 3), {"groups": 4}, "groups=4"),
        ("conv_transpose2d", (8,), (4, 6, 3, 3), {}, "input of shape"),
        ("conv_transpose1d", (2, 4, 8), (4, 6, 3), {"padding": "same"}, "padding="),
        (
            "conv_transpose2d",
            (2, 4, 8, 8),
            (4, 6, 3, 3),
            {"output_padding": (1, 1, 1)},
            "output_padding=",
        ),
        (
            "conv_transpose3d",
            (2, 4, 8, 8, 8),
            (4, 6, 3, 3, 3),
            {"stride": (1, 2)},
            "stride=",
        ),
        ("conv_transpose1d", (2, 4, 8), (4, 6, 3), {"constraint": "max"}, "constraint"),
    ],
)
def test_conv_transpose_rejects_bad_arguments(
    op: str,
    input: tuple[int, ...],
    weight: tuple[int, ...],
    kwargs: dict[str, Any],
    match: str,
) -> None:
    with pytest.raises(ValueError, match=match):
        getattr(U, op)(randn(*input), randn(*weight), **kwargs)


def test_conv_transpose_compiles_without_graph_breaks() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return U.conv_transpose2d(x, w, stride=2, padding=1, constraint=None)

    x, w = randn(2, 4, 8, 8, seed=0), randn(4, 3, 4, 4, seed=1)
    torch.testing.assert_close(torch.compile(f, fullgraph=True)(x, w), f(x, w))
