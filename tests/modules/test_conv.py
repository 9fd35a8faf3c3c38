"""Tests for the unit-scaled convolution layers: ``Conv{1,2,3}d`` and
``ConvTranspose{1,2,3}d``.

Each module must be a thin wrapper: its output and gradients equal those of its
``U.*`` function called with the module's own parameters and settings. Weights are
checked for unit init with a tolerance of 6σ of the sample std of ``N`` normal
draws (relative σ ≈ ``1/sqrt(2N)``).
"""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import unit_scaling as uu
import unit_scaling.functional as U
from tests.helpers import randn, unit_backward


def _assert_unit_init(w: Tensor) -> None:
    tol = 6 / math.sqrt(2 * w.numel())
    std, mean = w.detach().std().item(), w.detach().mean().item()
    assert abs(std - 1) <= tol, f"std {std:.4f} not within {tol:.4f} of 1"
    assert abs(mean) <= 6 / math.sqrt(w.numel()), f"mean {mean:.4f} not ≈ 0"


def _run(fn, *inputs: Tensor) -> tuple[Tensor, list[Tensor]]:  # type: ignore[no-untyped-def]
    for t in inputs:
        t.grad = None
    out = fn(*inputs)
    unit_backward(out, seed=1)
    return out.detach(), [t.grad.clone() for t in inputs]


# (module class, U function, input shape, constructor args, keyword settings)
CONVS: list[
    tuple[type[nn.Module], Any, tuple[int, ...], tuple[Any, ...], dict[str, Any]]
] = [
    (uu.Conv1d, U.conv1d, (4, 8, 20), (8, 12, 3), {}),
    (
        uu.Conv1d,
        U.conv1d,
        (4, 8, 20),
        (8, 12, 3),
        {"stride": 2, "padding": 1, "dilation": 2, "groups": 2, "bias": True},
    ),
    (
        uu.Conv1d,
        U.conv1d,
        (4, 8, 20),
        (8, 12, 3),
        {"padding": "same", "constraint": None},
    ),
    (uu.Conv2d, U.conv2d, (2, 8, 10, 10), (8, 12, 3), {"stride": 2, "bias": True}),
    (
        uu.Conv2d,
        U.conv2d,
        (2, 8, 10, 10),
        (8, 12, (3, 1)),
        {"padding": (1, 0), "groups": 4, "constraint": "gmean"},
    ),
    (uu.Conv3d, U.conv3d, (2, 4, 6, 6, 6), (4, 6, 3), {"padding": 1, "bias": True}),
]
TRANSPOSED: list[
    tuple[type[nn.Module], Any, tuple[int, ...], tuple[Any, ...], dict[str, Any]]
] = [
    (uu.ConvTranspose1d, U.conv_transpose1d, (4, 8, 20), (8, 6, 4), {"stride": 2}),
    (
        uu.ConvTranspose1d,
        U.conv_transpose1d,
        (4, 8, 20),
        (8, 6, 3),
        {"stride": 2, "padding": 1, "output_padding": 1, "groups": 2, "bias": True},
    ),
    (
        uu.ConvTranspose2d,
        U.conv_transpose2d,
        (2, 8, 6, 6),
        (8, 4, 4),
        {"stride": 2, "padding": 1, "constraint": None, "bias": True},
    ),
    (
        uu.ConvTranspose3d,
        U.conv_transpose3d,
        (2, 4, 3, 3, 3),
        (4, 2, 2),
        {"stride": 2, "dilation": 2},
    ),
]


def _positional(module: nn.Module, transposed: bool) -> tuple[Any, ...]:
    if transposed:
        return (
            module.stride,
            module.padding,
            module.output_padding,
            module.groups,
            module.dilation,
        )
    return module.stride, module.padding, module.dilation, module.groups


@pytest.mark.parametrize(
    ("cls", "fn", "shape", "args", "kwargs", "transposed"),
    [(*case, False) for case in CONVS] + [(*case, True) for case in TRANSPOSED],
    ids=lambda v: getattr(v, "__name__", None),
)
def test_conv_module_calls_functional(
    cls: type[nn.Module],
    fn: Any,
    shape: tuple[int, ...],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    transposed: bool,
) -> None:
    conv = cls(*args, **kwargs)
    if conv.bias is not None:
        nn.init.normal_(conv.bias)  # zero at init: make it matter
    x = randn(*shape, seed=0)
    params = [conv.weight] + ([conv.bias] if conv.bias is not None else [])
    constraint = kwargs.get("constraint", "to_output_scale")
    settings = _positional(conv, transposed)
    y_mod, g_mod = _run(lambda x, *p: conv(x), x, *params)
    y_fn, g_fn = _run(
        lambda x, *p: fn(x, conv.weight, conv.bias, *settings, constraint=constraint),
        x,
        *params,
    )
    torch.testing.assert_close(y_mod, y_fn, rtol=0, atol=0)
    for a, b in zip(g_mod, g_fn, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch_kwargs = {k: v for k, v in kwargs.items() if k != "constraint"}
    reference = getattr(nn, cls.__name__)(*args, **torch_kwargs)
    assert y_mod.shape == reference(x).shape


@pytest.mark.parametrize(
    "cls",
    [
        uu.Conv1d,
        uu.Conv2d,
        uu.Conv3d,
        uu.ConvTranspose1d,
        uu.ConvTranspose2d,
        uu.ConvTranspose3d,
    ],
)
def test_conv_init_tags_and_copies(cls: type[nn.Module]) -> None:
    conv = cls(16, 32, 3, bias=True)
    _assert_unit_init(conv.weight)
    assert isinstance(conv.weight, uu.Parameter) and conv.weight.mup_type == "weight"
    assert isinstance(conv.bias, uu.Parameter) and conv.bias.mup_type == "bias"
    assert conv.weight.mup_scaling_depth is None
    assert torch.count_nonzero(conv.bias) == 0
    assert cls(2, 2, 1).bias is None  # bias is off by default
    weight = conv.weight
    with torch.no_grad():
        weight.mul_(5)
    conv.reset_parameters()
    assert conv.weight is weight
    _assert_unit_init(conv.weight)
    clone = copy.deepcopy(conv)
    assert clone.weight.mup_type == "weight" and clone.bias.mup_type == "bias"
    assert "constraint='to_output_scale'" in repr(conv)


def test_conv_matches_torch_times_fan_in_power() -> None:
    conv = uu.Conv2d(8, 16, 3, padding=1)
    x = randn(2, 8, 10, 10, seed=0)
    expected = F.conv2d(x, conv.weight, padding=1) * (8 * 9) ** -0.5
    torch.testing.assert_close(conv(x), expected, rtol=1e-5, atol=1e-6)


def test_conv_transpose_output_size_picks_output_padding_like_torch() -> None:
    conv = uu.ConvTranspose2d(8, 4, 3, stride=2, padding=1)
    x = randn(2, 8, 5, 5, seed=0)
    y = conv(x, output_size=[10, 10])
    assert y.shape == (2, 4, 10, 10)
    expected = U.conv_transpose2d(x, conv.weight, None, 2, 1, 1)
    torch.testing.assert_close(y, expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    "make",
    [
        lambda: uu.Conv1d(4, 4, 3, padding=1, padding_mode="reflect"),
        lambda: uu.Conv2d(4, 4, 3, padding=1, padding_mode="circular"),
        lambda: uu.ConvTranspose1d(4, 4, 3, padding_mode="reflect"),
    ],
)
def test_conv_rejects_padding_mode(make: Any) -> None:
    with pytest.raises(ValueError, match=r"padding_mode='(reflect|circular)'"):
        make()


def test_conv_rejects_unknown_constraint() -> None:
    with pytest.raises(ValueError, match="bogus"):
        uu.Conv3d(4, 4, 3, constraint="bogus")
