"""Tests for the unit-scaled normalisation layers: ``LayerNorm``, ``RMSNorm``,
``GroupNorm``, ``BatchNorm{1,2,3}d`` and ``InstanceNorm{1,2,3}d``.

``LayerNorm``/``RMSNorm`` default to ``elementwise_affine=False`` (no
parameters); the others are affine as in torch. Gains are tagged ``"norm"``
(initialised to ones) and biases ``"bias"`` (zeros), and each module equals its
``U.*`` function called with them, gradients included (which is where the unit
scaling lives); the batch and instance norms also keep torch's module logic
(running statistics, momentum, train/eval), checked against torch's modules.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import Tensor, nn

import unit_scaling as uu
import unit_scaling.functional as U
from tests.helpers import randn, unit_backward


def _run(fn, *inputs: Tensor) -> tuple[Tensor, list[Tensor]]:
    for t in inputs:
        t.grad = None
    out = fn(*inputs)
    unit_backward(out, seed=1)
    return out.detach(), [t.grad.clone() for t in inputs]


def _assert_same(
    a: tuple[Tensor, list[Tensor]], b: tuple[Tensor, list[Tensor]]
) -> None:
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=0)
    for ga, gb in zip(a[1], b[1], strict=True):
        torch.testing.assert_close(ga, gb, rtol=0, atol=0)


@pytest.mark.parametrize("cls", [uu.LayerNorm, uu.RMSNorm])
def test_no_parameters_by_default(cls: type[nn.Module]) -> None:
    norm = cls(16)
    assert list(norm.parameters()) == []
    assert norm.weight is None


def test_layer_norm_affine_tags_and_init() -> None:
    norm = uu.LayerNorm(16, elementwise_affine=True)
    assert isinstance(norm.weight, uu.Parameter) and isinstance(norm.bias, uu.Parameter)
    assert (norm.weight.mup_type, norm.weight.mup_scaling_depth) == ("norm", None)
    assert (norm.bias.mup_type, norm.bias.mup_scaling_depth) == ("bias", None)
    assert torch.equal(norm.weight.detach(), torch.ones(16))
    assert torch.count_nonzero(norm.bias) == 0
    no_bias = uu.LayerNorm(16, elementwise_affine=True, bias=False)
    assert no_bias.bias is None and no_bias.weight.mup_type == "norm"


def test_rms_norm_affine_tags_and_init() -> None:
    norm = uu.RMSNorm((4, 8), elementwise_affine=True)
    assert isinstance(norm.weight, uu.Parameter)
    assert (norm.weight.mup_type, norm.weight.mup_scaling_depth) == ("norm", None)
    assert torch.equal(norm.weight.detach(), torch.ones(4, 8))
    assert [n for n, _ in norm.named_parameters()] == ["weight"]


@pytest.mark.parametrize("cls", [uu.LayerNorm, uu.RMSNorm])
def test_reset_parameters_keeps_tags(cls: type[nn.Module]) -> None:
    norm = cls(8, elementwise_affine=True)
    weight = norm.weight
    with torch.no_grad():
        weight.fill_(3)
    norm.reset_parameters()
    assert norm.weight is weight and weight.mup_type == "norm"
    assert torch.equal(weight.detach(), torch.ones(8))
    if getattr(norm, "bias", None) is not None:
        assert norm.bias.mup_type == "bias"


@pytest.mark.parametrize("affine", [False, True])
def test_layer_norm_calls_functional(affine: bool) -> None:
    norm = uu.LayerNorm((6, 10), eps=1e-3, elementwise_affine=affine)
    params: list[Tensor] = []
    if affine:
        nn.init.normal_(norm.weight)
        nn.init.normal_(norm.bias)
        params = [norm.weight, norm.bias]
    x = randn(5, 6, 10, seed=0)
    _assert_same(
        _run(lambda x, *p: norm(x), x, *params),
        _run(
            lambda x, *p: U.layer_norm(x, (6, 10), norm.weight, norm.bias, eps=1e-3),
            x,
            *params,
        ),
    )


@pytest.mark.parametrize("affine", [False, True])
def test_rms_norm_calls_functional(affine: bool) -> None:
    norm = uu.RMSNorm(10, eps=0.5, elementwise_affine=affine)
    params: list[Tensor] = []
    if affine:
        nn.init.normal_(norm.weight)
        params = [norm.weight]
    x = randn(5, 7, 10, seed=0)
    _assert_same(
        _run(lambda x, *p: norm(x), x, *params),
        _run(lambda x, *p: U.rms_norm(x, (10,), norm.weight, eps=0.5), x, *params),
    )


def test_affine_gradients_are_unit_scaled() -> None:
    # 64 rows of 32: a plain norm's gain gradient has RMS ≈ sqrt(64) = 8; the
    # unit-scaled one ≈ 1 (6σ tolerance of an RMS over 32 elements is ≈ 0.75).
    # (The output gradient must be independent of x: a different seed.)
    norms = [uu.LayerNorm(32, elementwise_affine=True), uu.RMSNorm(32, None, True)]
    for norm in norms:
        x = randn(64, 32, seed=0)
        unit_backward(norm(x), seed=1)
        rms = norm.weight.grad.pow(2).mean().sqrt().item()
        assert 0.5 < rms < 2, f"{type(norm).__name__}: weight grad RMS {rms}"


# --- BatchNorm, InstanceNorm, GroupNorm ---------------------------------------------

CHANNEL_NORMS = [
    (uu.BatchNorm1d, (16, 8, 5)),
    (uu.BatchNorm1d, (16, 8)),
    (uu.BatchNorm2d, (8, 8, 4, 4)),
    (uu.BatchNorm3d, (4, 8, 3, 3, 3)),
    (uu.InstanceNorm1d, (4, 8, 12)),
    (uu.InstanceNorm1d, (8, 12)),  # unbatched
    (uu.InstanceNorm2d, (4, 8, 6, 6)),
    (uu.InstanceNorm3d, (2, 8, 3, 4, 5)),
]


def _torch_twin(norm: nn.Module) -> nn.Module:
    """The plain torch module with the same settings, parameters and buffers."""
    twin = getattr(nn, type(norm).__name__)(
        norm.num_features,
        norm.eps,
        norm.momentum,
        norm.affine,
        norm.track_running_stats,
    )
    twin.load_state_dict(norm.state_dict())
    return twin


@pytest.mark.parametrize("momentum", [0.3, None])
@pytest.mark.parametrize("settings", [(True, True), (False, False), (True, False)])
@pytest.mark.parametrize(("cls", "shape"), CHANNEL_NORMS, ids=str)
def test_channel_norm_modules_follow_torch_modules(
    cls: type[nn.Module],
    shape: tuple[int, ...],
    settings: tuple[bool, bool],
    momentum: float | None,
) -> None:
    """Same outputs, input gradients and running statistics as torch's module in
    training and evaluation; affine gradients scaled by ``(C / numel)^½``."""
    affine, track = settings
    if momentum is None and cls.__name__.startswith("Instance"):
        momentum = 0.1  # torch's instance norms take no None momentum
    norm = cls(8, eps=1e-3, momentum=momentum, affine=affine, track_running_stats=track)
    if affine:
        nn.init.normal_(norm.weight)
        nn.init.normal_(norm.bias)
        assert (norm.weight.mup_type, norm.bias.mup_type) == ("norm", "bias")
    twin = _torch_twin(norm)
    for mode in ("train", "train", "eval"):
        norm.train(mode == "train")
        twin.train(mode == "train")
        x = randn(*shape, seed=len(mode))
        x_ref = x.detach().requires_grad_()
        y, y_ref = norm(x), twin(x_ref)
        torch.testing.assert_close(y, y_ref)
        grad = unit_backward(y, seed=3)
        y_ref.backward(grad)
        torch.testing.assert_close(x.grad, x_ref.grad)
        for name, buffer in twin.named_buffers():
            torch.testing.assert_close(getattr(norm, name), buffer, rtol=0, atol=1e-7)
    if affine:
        scale = (8 / math.prod(shape)) ** 0.5
        torch.testing.assert_close(norm.weight.grad, scale * twin.weight.grad)
        torch.testing.assert_close(norm.bias.grad, scale * twin.bias.grad)


def test_channel_norm_defaults_match_torch() -> None:
    assert uu.BatchNorm2d(4).weight.mup_type == "norm"  # affine by default
    assert uu.BatchNorm2d(4).running_mean is not None
    assert uu.InstanceNorm2d(4).weight is None  # not affine by default
    assert uu.InstanceNorm2d(4).running_mean is None
    norm = uu.GroupNorm(2, 8)
    assert (norm.weight.mup_type, norm.bias.mup_type) == ("norm", "bias")
    assert torch.equal(norm.weight.detach(), torch.ones(8))
    assert list(uu.GroupNorm(2, 8, affine=False).parameters()) == []


@pytest.mark.parametrize("affine", [False, True])
def test_group_norm_calls_functional(affine: bool) -> None:
    norm = uu.GroupNorm(4, 8, eps=1e-3, affine=affine)
    params: list[Tensor] = []
    if affine:
        nn.init.normal_(norm.weight)
        nn.init.normal_(norm.bias)
        params = [norm.weight, norm.bias]
    x = randn(5, 8, 6, seed=0)
    _assert_same(
        _run(lambda x, *p: norm(x), x, *params),
        _run(
            lambda x, *p: U.group_norm(x, 4, norm.weight, norm.bias, eps=1e-3),
            x,
            *params,
        ),
    )


def test_channel_norms_keep_tags_through_copies() -> None:
    norm = uu.BatchNorm1d(4)
    clone = copy.deepcopy(norm)
    assert clone.weight.mup_type == "norm" and clone.bias.mup_type == "bias"
    norm.reset_parameters()
    assert norm.weight.mup_type == "norm"
