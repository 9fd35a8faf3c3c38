"""Tests for the unit-scaled pooling and upsampling layers.

Each layer takes its torch counterpart's arguments (and ``constraint``) and must
equal its ``U.*`` function called with them, in the output and the input
gradient; it has the torch layer's output shape and no parameters.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn

import unit_scaling as uu
import unit_scaling.functional as U
from tests.helpers import randn, unit_backward

# (layer, torch-style constructor arguments, input shape, the same call of U)
LAYERS: list[tuple[type[nn.Module], dict[str, Any], tuple[int, ...], Any]] = [
    (
        uu.AvgPool1d,
        {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False},
        (4, 6, 17),
        lambda x, c: U.avg_pool1d(x, 3, 2, 1, False, False, constraint=c),
    ),
    (
        uu.AvgPool2d,
        {"kernel_size": 2, "ceil_mode": True, "divisor_override": 3},
        (4, 6, 9, 9),
        lambda x, c: U.avg_pool2d(x, 2, None, 0, True, True, 3, c),
    ),
    (
        uu.AvgPool3d,
        {"kernel_size": (2, 1, 2)},
        (2, 3, 6, 6, 6),
        lambda x, c: U.avg_pool3d(x, (2, 1, 2), constraint=c),
    ),
    (
        uu.MaxPool1d,
        {"kernel_size": 3, "stride": 2, "dilation": 2},
        (4, 6, 17),
        lambda x, c: U.max_pool1d(x, 3, 2, 0, 2, constraint=c),
    ),
    (
        uu.MaxPool2d,
        {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True},
        (4, 6, 9, 9),
        lambda x, c: U.max_pool2d(x, 3, 2, 1, ceil_mode=True, constraint=c),
    ),
    (
        uu.MaxPool3d,
        {"kernel_size": 2},
        (2, 3, 6, 6, 6),
        lambda x, c: U.max_pool3d(x, 2, constraint=c),
    ),
    (
        uu.AdaptiveAvgPool1d,
        {"output_size": 5},
        (4, 6, 17),
        lambda x, c: U.adaptive_avg_pool1d(x, 5, c),
    ),
    (
        uu.AdaptiveAvgPool2d,
        {"output_size": (3, None)},
        (4, 6, 9, 9),
        lambda x, c: U.adaptive_avg_pool2d(x, (3, None), c),
    ),
    (
        uu.AdaptiveAvgPool3d,
        {"output_size": 2},
        (2, 3, 6, 6, 6),
        lambda x, c: U.adaptive_avg_pool3d(x, 2, c),
    ),
    (
        uu.AdaptiveMaxPool1d,
        {"output_size": 5},
        (4, 6, 17),
        lambda x, c: U.adaptive_max_pool1d(x, 5, constraint=c),
    ),
    (
        uu.AdaptiveMaxPool2d,
        {"output_size": 4},
        (4, 6, 9, 9),
        lambda x, c: U.adaptive_max_pool2d(x, 4, constraint=c),
    ),
    (
        uu.AdaptiveMaxPool3d,
        {"output_size": (2, 3, 2)},
        (2, 3, 6, 6, 6),
        lambda x, c: U.adaptive_max_pool3d(x, (2, 3, 2), constraint=c),
    ),
    (
        uu.Upsample,
        {"scale_factor": 2, "mode": "bilinear", "align_corners": True},
        (2, 3, 5, 5),
        lambda x, c: U.interpolate(x, None, 2, "bilinear", True, constraint=c),
    ),
    (
        uu.Upsample,
        {"size": 7},
        (2, 3, 5),
        lambda x, c: U.interpolate(x, 7, constraint=c),
    ),
]


def _run(fn: Any, x: Tensor) -> tuple[Tensor, Tensor]:
    x.grad = None
    out = fn(x)
    unit_backward(out, seed=1)
    return out.detach(), x.grad.clone()


@pytest.mark.parametrize("constraint", ["to_output_scale", None])
@pytest.mark.parametrize(
    ("cls", "kwargs", "shape", "call"), LAYERS, ids=lambda v: getattr(v, "__name__", "")
)
def test_layer_calls_functional(
    cls: type[nn.Module],
    kwargs: dict[str, Any],
    shape: tuple[int, ...],
    call: Any,
    constraint: str | None,
) -> None:
    layer = cls(**kwargs, constraint=constraint)
    x = randn(*shape, seed=0)
    y_mod, g_mod = _run(layer, x)
    y_fn, g_fn = _run(lambda t: call(t, constraint), x)
    torch.testing.assert_close(y_mod, y_fn, rtol=0, atol=0)
    torch.testing.assert_close(g_mod, g_fn, rtol=0, atol=0)
    assert y_mod.shape == getattr(nn, cls.__name__)(**kwargs)(x).shape
    assert list(layer.parameters()) == []
    assert f"constraint={constraint!r}" in repr(layer)


@pytest.mark.parametrize("cls", [uu.MaxPool2d, uu.AdaptiveMaxPool2d])
def test_max_pool_layers_return_indices(cls: type[nn.Module]) -> None:
    layer = cls(2, return_indices=True)
    x = randn(2, 3, 8, 8, seed=0)
    y, indices = layer(x)
    y_ref, indices_ref = getattr(nn, cls.__name__)(2, return_indices=True)(x)
    assert torch.equal(indices, indices_ref)
    assert y.shape == y_ref.shape


@pytest.mark.parametrize(
    "make",
    [
        lambda: uu.AvgPool2d(2, constraint="bogus"),
        lambda: uu.MaxPool1d(2, constraint="bogus"),
        lambda: uu.AdaptiveAvgPool3d(2, constraint="bogus"),
        lambda: uu.Upsample(scale_factor=2, constraint="bogus"),
    ],
)
def test_unknown_constraint_raises_at_construction(make: Any) -> None:
    with pytest.raises(ValueError, match="bogus"):
        make()
