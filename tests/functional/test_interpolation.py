"""Tests for the unit-scaled ``interpolate``.

The reference scales come from torch itself: interpolating an identity matrix
(one batch element per input position) gives the interpolation matrix ``M``
over all spatial dims at once, so ``alpha = (n_out / ||M||²)^½`` and
``beta = (n_in / ||M||²)^½`` are recomputed here without the package's
per-dimension weight formulas, for every mode and flag.

Tolerances: measured RMS values use ``>= 2^15`` elements (``rtol=0.05`` > 6σ for
independent elements; interpolated neighbours are correlated, which the margin
covers).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import unit_scaling.functional as U
from tests.helpers import assert_unit_scale, gradcheck_scaled, randn, unit_backward
from unit_scaling._torch_internals import INTERPOLATE_HAS_LANCZOS
from unit_scaling.constraints import apply_constraint

# (spatial shape, interpolate keyword arguments)
CONFIGS: list[tuple[tuple[int, ...], dict[str, Any]]] = [
    ((7,), {"size": 16}),
    ((5, 6), {"scale_factor": 1.7}),
    ((4, 5, 3), {"scale_factor": (2.0, 1.0, 0.5)}),
    ((5, 6), {"size": (3, 11), "mode": "nearest-exact"}),
    ((7,), {"scale_factor": 2, "mode": "linear"}),
    ((7,), {"scale_factor": 1.7, "mode": "linear", "align_corners": True}),
    ((16,), {"size": 5, "mode": "linear"}),
    ((9,), {"scale_factor": 0.3, "mode": "linear", "recompute_scale_factor": True}),
    ((5, 6), {"scale_factor": 2, "mode": "bilinear"}),
    ((5, 6), {"size": (11, 3), "mode": "bilinear", "align_corners": True}),
    ((16, 16), {"size": (5, 7), "mode": "bilinear", "antialias": True}),
    (
        (16, 16),
        {
            "scale_factor": 0.3,
            "mode": "bilinear",
            "antialias": True,
            "align_corners": True,
        },
    ),
    ((4, 4), {"size": 9, "mode": "bilinear", "antialias": True}),
    ((5, 6), {"scale_factor": 2.5, "mode": "bicubic"}),
    ((5, 6), {"size": (11, 3), "mode": "bicubic", "align_corners": True}),
    ((16, 16), {"size": (5, 7), "mode": "bicubic", "antialias": True}),
    (
        (7, 7),
        {
            "scale_factor": 1.5,
            "mode": "bicubic",
            "antialias": True,
            "align_corners": True,
        },
    ),
    ((3, 4, 5), {"scale_factor": 2, "mode": "trilinear"}),
    ((3, 4, 5), {"size": (5, 3, 7), "mode": "trilinear", "align_corners": True}),
    ((7,), {"size": 3, "mode": "area"}),
    ((16, 16), {"size": (5, 7), "mode": "area"}),
    ((4, 6, 8), {"size": (2, 3, 5), "mode": "area"}),
    ((10,), {"scale_factor": 0.5, "mode": "area"}),
    ((16, 16), {"size": (5, 7), "mode": "lanczos", "antialias": True}),
    ((6, 6), {"scale_factor": 2, "mode": "lanczos", "antialias": True}),
]


def _ids(config: tuple[tuple[int, ...], dict[str, Any]]) -> str:
    return f"{config[0]}-" + ",".join(f"{k}={v}" for k, v in config[1].items())


def _reference_scales(
    spatial: tuple[int, ...], kwargs: dict[str, Any]
) -> tuple[float, float]:
    n_in = math.prod(spatial)
    eye = torch.eye(n_in, dtype=torch.float64).reshape(n_in, 1, *spatial)
    matrix = F.interpolate(eye, **kwargs)
    norm_sq = matrix.pow(2).sum().item()
    return (math.prod(matrix.shape[2:]) / norm_sq) ** 0.5, (n_in / norm_sq) ** 0.5


def _params(configs: list[tuple[tuple[int, ...], dict[str, Any]]]) -> list[Any]:
    """``configs`` as test parameters; lanczos ones skipped where torch lacks it."""
    return [
        pytest.param(
            config,
            id=_ids(config),
            marks=pytest.mark.skipif(
                config[1].get("mode") == "lanczos" and not INTERPOLATE_HAS_LANCZOS,
                reason="torch < 2.12 has no lanczos interpolation",
            ),
        )
        for config in configs
    ]


@pytest.mark.parametrize("constraint", [None, "to_output_scale", "to_grad_input_scale"])
@pytest.mark.parametrize("config", _params(CONFIGS))
def test_interpolate_matches_torch_times_exact_scales(
    config: tuple[tuple[int, ...], dict[str, Any]], constraint: str | None
) -> None:
    spatial, kwargs = config
    alpha, beta = apply_constraint(constraint, *_reference_scales(spatial, kwargs))
    x = randn(3, 2, *spatial, dtype=torch.float64, seed=0)
    y = U.interpolate(x, **kwargs, constraint=constraint)
    grad = unit_backward(y, seed=1)
    x_ref = x.detach().requires_grad_()
    y_ref = F.interpolate(x_ref, **kwargs)
    y_ref.backward(grad)
    torch.testing.assert_close(y, alpha * y_ref)
    torch.testing.assert_close(x.grad, beta * x_ref.grad)


UNIT_CONFIGS: list[tuple[tuple[int, ...], dict[str, Any]]] = [
    ((32, 32), {"scale_factor": 2, "mode": "nearest"}),
    ((32, 32), {"scale_factor": 2, "mode": "bilinear"}),
    ((64, 64), {"scale_factor": 0.5, "mode": "bilinear", "antialias": True}),
    ((32, 32), {"size": (45, 50), "mode": "bicubic", "align_corners": True}),
    ((64, 64), {"size": 21, "mode": "lanczos", "antialias": True}),
    ((500,), {"scale_factor": 1.7, "mode": "linear"}),
    ((1000,), {"size": 370, "mode": "area"}),
    ((16, 16, 16), {"scale_factor": 2, "mode": "trilinear"}),
]


@pytest.mark.parametrize("config", _params(UNIT_CONFIGS))
def test_interpolate_unconstrained_is_unit_scaled(
    config: tuple[tuple[int, ...], dict[str, Any]],
) -> None:
    spatial, kwargs = config
    batch = max(2**16 // math.prod(spatial), 2)
    x = randn(batch, 4, *spatial, seed=2)
    y = U.interpolate(x, **kwargs, constraint=None)
    unit_backward(y, seed=3)
    assert_unit_scale(y, rtol=0.05, name="output")
    assert_unit_scale(x.grad, rtol=0.05, name="input grad")


def test_nearest_upsampling_copies_without_output_scale() -> None:
    x = randn(2, 3, 8, 8, seed=0)
    y = U.interpolate(x, scale_factor=2, constraint=None)
    torch.testing.assert_close(y, F.interpolate(x, scale_factor=2), rtol=0, atol=0)
    grad = unit_backward(y)
    torch.testing.assert_close(x.grad, F.avg_pool2d(grad, 2) * 4 / 2)  # beta = 1/2


def test_interpolate_gradcheck() -> None:
    x = randn(1, 2, 5, 4, dtype=torch.float64, seed=0)
    kwargs = {"size": (7, 3), "mode": "bicubic", "align_corners": False}
    alpha, beta = _reference_scales((5, 4), kwargs)
    assert gradcheck_scaled(
        lambda t: U.interpolate(t, **kwargs, constraint=None), [x], alpha, [beta]
    )


def test_interpolate_compiles_without_graph_breaks() -> None:
    def f(x: Tensor) -> tuple[Tensor, ...]:
        return (
            U.interpolate(x, scale_factor=2, mode="bilinear"),
            U.interpolate(x, size=(5, 7), mode="bicubic", antialias=True),
            U.interpolate(x, size=3, mode="area", constraint=None),
        )

    x = randn(2, 3, 12, 12, seed=0)
    for ours, expected in zip(torch.compile(f, fullgraph=True)(x), f(x), strict=True):
        torch.testing.assert_close(ours, expected)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda x: U.interpolate(x, size=8, mode="cubic"), "mode='cubic'"),
        (lambda x: U.interpolate(x, size=8, scale_factor=2.0), "exactly one of"),
        (lambda x: U.interpolate(x), "exactly one of"),
        (lambda x: U.interpolate(x, size=(8, 8, 8)), r"size=\(8, 8, 8\)"),
        (lambda x: U.interpolate(x, scale_factor=(2.0,)), r"scale_factor=\(2.0,\)"),
        (lambda x: U.interpolate(x[0, 0], size=8), "expected input of shape"),
        (lambda x: U.interpolate(x, size=8, constraint="x"), "constraint"),
    ],
)
def test_interpolate_rejects_bad_arguments(
    call: Callable[[Tensor], Tensor], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        call(randn(2, 3, 4, 4))


def test_lanczos_on_a_torch_without_it_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from unit_scaling.functional import interpolation

    if INTERPOLATE_HAS_LANCZOS:  # a torch without it (2.11) is stood in for
        monkeypatch.setattr(interpolation, "INTERPOLATE_HAS_LANCZOS", False)
    with pytest.raises(ValueError, match=r"mode='lanczos' needs torch >= 2\.12"):
        U.interpolate(torch.randn(1, 1, 8, 8), size=4, mode="lanczos", antialias=True)
