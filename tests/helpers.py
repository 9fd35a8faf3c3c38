"""Helpers shared by the tests: unit-normal inputs, scale checks, gradient checks."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from unit_scaling.scale import scale_bwd


def randn(
    *shape: int, dtype: torch.dtype = torch.float32, seed: int | None = None
) -> Tensor:
    """A unit-normal tensor that requires grad."""
    gen = None if seed is None else torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen, dtype=dtype).requires_grad_()


def unit_backward(output: Tensor, seed: int = 0) -> Tensor:
    """Backpropagate a unit-normal gradient through ``output``; return that gradient."""
    gen = torch.Generator().manual_seed(seed)
    grad = torch.randn(output.shape, generator=gen).to(output.dtype)
    output.backward(grad)
    return grad


def grads(*tensors: Tensor) -> list[Tensor]:
    """The gradients of ``tensors`` (each must have one)."""
    out = [t.grad for t in tensors]
    assert all(g is not None for g in out), "a tensor has no gradient"
    return out  # type: ignore[return-value]


def parameter_grads(model: nn.Module) -> list[Tensor]:
    """Copies of the gradients of ``model``'s parameters that have one."""
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def rms(t: Tensor) -> float:
    """Root mean square of ``t`` (in float32, detached)."""
    return t.detach().float().pow(2).mean().sqrt().item()


def assert_unit_scale(t: Tensor, rtol: float = 0.1, name: str = "tensor") -> None:
    """Assert the RMS of ``t`` is within ``rtol`` of 1 (relative)."""
    value = rms(t)
    assert abs(value - 1) <= rtol, f"{name}: RMS {value:.4f} not within {rtol} of 1"


def gradcheck_scaled(
    fn: Callable[..., Tensor],
    inputs: Sequence[Tensor],
    output_scale: float,
    grad_scales: Sequence[float],
) -> bool:
    """``torch.autograd.gradcheck`` for an op whose gradients are deliberately scaled.

    A unit-scaled op computes ``output_scale * f(x)`` forwards but scales each input's
    gradient by its own ``grad_scales[i]``. Pre-multiplying each input's gradient by
    ``output_scale / grad_scales[i]`` makes the backward the true derivative of the
    forward again, so ``gradcheck`` (float64) verifies both passes numerically.
    """

    def unscaled(*xs: Tensor) -> Tensor:
        xs = tuple(
            scale_bwd(x, output_scale / s) if x.requires_grad else x
            for x, s in zip(xs, grad_scales, strict=True)
        )
        return fn(*xs)

    return bool(torch.autograd.gradcheck(unscaled, tuple(inputs)))
