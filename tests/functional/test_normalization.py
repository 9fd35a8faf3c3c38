"""Tests for the unit-scaled ``layer_norm``, ``rms_norm``, ``group_norm``,
``batch_norm`` and ``instance_norm``.

The affine-gradient scale ``(group numel / numel)^½`` is restated here, not
imported. Tolerances: the RMS of ``N`` unit-variance samples has relative standard
deviation about ``1/sqrt(2N)``. Activations here have ``N >= 16384`` (``rtol=0.1``
is > 18σ); affine gradients have ``N >= 512`` elements, each a sum of >= 64 terms
(close to Gaussian), so ``rtol=0.2`` is > 6σ; the per-channel affine gradients
of ``batch_norm``/``instance_norm`` have 256 elements, so ``rtol=0.3`` is > 6σ.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import unit_scaling.functional as U
from tests.helpers import assert_unit_scale, gradcheck_scaled, randn, unit_backward

NORM_CASES = [
    # (input shape, normalized_shape)
    ((64, 1024), (1024,)),
    ((8, 16, 1024), 1024),
    ((8, 16, 1024), (16, 1024)),
]


def _affine(shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Weight ones and bias zeros (the init), as leaves that require grad."""
    return torch.ones(shape).requires_grad_(), torch.zeros(shape).requires_grad_()


def _as_tuple(normalized_shape: int | tuple[int, ...]) -> tuple[int, ...]:
    return (
        (normalized_shape,) if isinstance(normalized_shape, int) else normalized_shape
    )


@pytest.mark.parametrize("case", NORM_CASES, ids=str)
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_norm_matches_torch_with_scaled_affine_grads(
    case: tuple[tuple[int, ...], int | tuple[int, ...]], op: str
) -> None:
    shape, normalized_shape = case
    norm_shape = _as_tuple(normalized_shape)
    x = randn(*shape, seed=1)
    weight, bias = _affine(norm_shape)
    if op == "layer_norm":
        y = U.layer_norm(x, normalized_shape, weight, bias)
    else:
        y = U.rms_norm(x, normalized_shape, weight)
    grad = unit_backward(y)

    x_ref = x.detach().requires_grad_()
    w_ref, b_ref = _affine(norm_shape)
    if op == "layer_norm":
        y_ref = F.layer_norm(x_ref, norm_shape, w_ref, b_ref)
    else:
        y_ref = F.rms_norm(x_ref, norm_shape, w_ref)
    y_ref.backward(grad)

    scale = (math.prod(norm_shape) / x.numel()) ** 0.5
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(weight.grad, scale * w_ref.grad)
    assert_unit_scale(y, name="output")
    assert_unit_scale(x.grad, name="input grad")
    assert_unit_scale(weight.grad, rtol=0.2, name="weight grad")
    if op == "layer_norm":
        torch.testing.assert_close(bias.grad, scale * b_ref.grad)
        assert_unit_scale(bias.grad, rtol=0.2, name="bias grad")


def test_norms_without_affine_are_the_torch_op() -> None:
    x = randn(4, 32)
    torch.testing.assert_close(U.layer_norm(x, (32,)), F.layer_norm(x, (32,)))
    torch.testing.assert_close(
        U.rms_norm(x, [32], eps=1e-3), F.rms_norm(x, [32], eps=1e-3)
    )
    x = randn(4, 8, 3)
    torch.testing.assert_close(U.group_norm(x, 2), F.group_norm(x, 2))


@pytest.mark.parametrize("shape", [(8, 512, 16), (16, 512)], ids=str)
def test_group_norm_matches_torch_with_scaled_affine_grads(
    shape: tuple[int, ...],
) -> None:
    x = randn(*shape, seed=1)
    weight, bias = _affine((512,))
    y = U.group_norm(x, 8, weight, bias, eps=1e-5)
    grad = unit_backward(y)
    x_ref = x.detach().requires_grad_()
    w_ref, b_ref = _affine((512,))
    F.group_norm(x_ref, 8, w_ref, b_ref, eps=1e-5).backward(grad)
    scale = (512 / x.numel()) ** 0.5
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(weight.grad, scale * w_ref.grad)
    torch.testing.assert_close(bias.grad, scale * b_ref.grad)
    assert_unit_scale(y, name="output")
    assert_unit_scale(weight.grad, rtol=0.2, name="weight grad")
    assert_unit_scale(bias.grad, rtol=0.2, name="bias grad")


def _f64(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64, requires_grad=True)


def test_norms_gradcheck() -> None:
    x, w, b = _f64(3, 4, 5), _f64(4, 5), _f64(4, 5)
    s = (20 / 60) ** 0.5
    assert gradcheck_scaled(
        lambda x, w, b: U.layer_norm(x, (4, 5), w, b), [x, w, b], 1.0, [1.0, s, s]
    )
    assert gradcheck_scaled(
        lambda x, w: U.rms_norm(x, (4, 5), w, eps=1e-6), [x, w], 1.0, [1.0, s]
    )
    x, w, b = _f64(2, 6, 3), _f64(6), _f64(6)
    s = (6 / 36) ** 0.5
    assert gradcheck_scaled(
        lambda x, w, b: U.group_norm(x, 3, w, b), [x, w, b], 1.0, [1.0, s, s]
    )


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("normalized_shape", [(16,), (8, 4), (), 5], ids=str)
def test_norms_reject_mismatched_normalized_shape(
    op: str, normalized_shape: int | tuple[int, ...]
) -> None:
    norm = U.layer_norm if op == "layer_norm" else U.rms_norm
    with pytest.raises(ValueError, match=r"normalized_shape=.*trailing dimensions"):
        norm(randn(4, 8), normalized_shape)


@pytest.mark.parametrize("num_groups", [3, 0])
def test_group_norm_rejects_bad_groups(num_groups: int) -> None:
    with pytest.raises(ValueError, match="num_groups"):
        U.group_norm(randn(2, 8, 4), num_groups)
    with pytest.raises(ValueError, match="num_groups"):
        U.group_norm(randn(8), 2)


# --- batch_norm and instance_norm ---------------------------------------------------

CHANNEL_NORM_SHAPES = [(64, 256), (16, 256, 64), (8, 256, 8, 8)]


@pytest.mark.parametrize("shape", CHANNEL_NORM_SHAPES, ids=str)
@pytest.mark.parametrize(
    ("op", "training"),
    [("batch_norm", True), ("batch_norm", False), ("instance_norm", True)],
)
def test_channel_norms_match_torch_with_scaled_affine_grads(
    op: str, training: bool, shape: tuple[int, ...]
) -> None:
    if op == "instance_norm" and len(shape) == 2:
        pytest.skip("instance norm needs spatial dims")
    channels = shape[1]
    x = randn(*shape, seed=1)
    weight, bias = _affine((channels,))
    stats = [torch.zeros(channels), torch.ones(channels)]
    stats_ref = [t.clone() for t in stats]
    args = (*stats, weight, bias, training, 0.3, 1e-4)
    y = getattr(U, op)(x, *args)
    grad = unit_backward(y)

    x_ref = x.detach().requires_grad_()
    w_ref, b_ref = _affine((channels,))
    y_ref = getattr(F, op)(x_ref, *stats_ref, w_ref, b_ref, training, 0.3, 1e-4)
    y_ref.backward(grad)

    scale = (channels / x.numel()) ** 0.5
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(weight.grad, scale * w_ref.grad)
    torch.testing.assert_close(bias.grad, scale * b_ref.grad)
    # Running statistics were updated in place exactly as torch updates them.
    for ours, theirs in zip(stats, stats_ref, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    if training:
        assert_unit_scale(y, name="output")
        assert_unit_scale(x.grad, name="input grad")
        assert_unit_scale(weight.grad, rtol=0.3, name="weight grad")
        assert_unit_scale(bias.grad, rtol=0.3, name="bias grad")
        assert not torch.equal(stats[0], torch.zeros(channels))


def test_batch_norm_eval_uses_running_stats_and_none_stats_use_the_batch() -> None:
    x = randn(16, 4, 5, seed=0)
    mean, var = torch.randn(4), torch.rand(4) + 0.5
    torch.testing.assert_close(
        U.batch_norm(x, mean, var), F.batch_norm(x, mean, var), rtol=0, atol=0
    )
    torch.testing.assert_close(
        U.batch_norm(x, None, None, training=True),
        F.batch_norm(x, None, None, training=True),
    )
    torch.testing.assert_close(U.instance_norm(x), F.instance_norm(x))
    y = U.instance_norm(x, mean, var, use_input_stats=False)
    torch.testing.assert_close(y, F.instance_norm(x, mean, var, use_input_stats=False))


def test_channel_norms_gradcheck() -> None:
    x, w, b = _f64(4, 3, 5), _f64(3), _f64(3)
    s = (3 / 60) ** 0.5
    assert gradcheck_scaled(
        lambda x, w, b: U.batch_norm(x, None, None, w, b, training=True),
        [x, w, b],
        1.0,
        [1.0, s, s],
    )
    assert gradcheck_scaled(
        lambda x, w, b: U.instance_norm(x, weight=w, bias=b),
        [x, w, b],
        1.0,
        [1.0, s, s],
    )


@pytest.mark.parametrize("op", ["batch_norm", "instance_norm"])
def test_channel_norms_reject_input_without_channels(op: str) -> None:
    with pytest.raises(ValueError, match=r"expected input of shape \(N, C, \*\)"):
        getattr(U, op)(randn(8), None, None)
