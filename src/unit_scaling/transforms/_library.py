"""Rewrite known library layers into the torch functions they compute.

Real models often implement standard ops by hand: Hugging Face's GPT-2 writes its
tanh-approximated GELU as ``0.5 * x * (1 + tanh(...))`` and its linear layers as
``addmm`` with a transposed weight (``Conv1D``); Llama-style models write RMSNorm
with ``pow``/``mean``/``rsqrt``. Unit scaling recognises ``F.gelu``,
``F.linear`` and ``F.rms_norm``, not the hand-written forms, so before tracing we
swap such layers for small modules that call the torch function on the *same*
parameters. Each swap is validated numerically against the original layer on a
random input and skipped (with a log line) if the two disagree.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["rewrite_library_modules"]

logger = logging.getLogger("unit_scaling.transforms.unit_scale")


class TanhGELU(nn.Module):
    """``F.gelu(x, approximate="tanh")``: stands in for hand-written GELUs."""

    def forward(self, input: Tensor) -> Tensor:
        return F.gelu(input, approximate="tanh")


class RMSNormFunction(nn.Module):
    """``F.rms_norm`` over the last dimension with an existing gain parameter."""

    def __init__(self, weight: nn.Parameter, eps: float | None) -> None:
        super().__init__()
        self.weight = weight
        self.eps = eps

    def forward(self, input: Tensor) -> Tensor:
        return F.rms_norm(input, (self.weight.shape[0],), self.weight, self.eps)


class TransposedLinear(nn.Module):
    """``F.linear`` with an ``(in, out)`` weight, as Hugging Face ``Conv1D`` has."""

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None) -> None:
        super().__init__()
        self.weight = weight
        self.bias = bias

    def forward(self, input: Tensor) -> Tensor:
        return F.linear(input, self.weight.t(), self.bias)


class CallReplacement(nn.Module):
    """A module whose forward calls a user-supplied replacement function.

    The replaced module is kept as a child so its parameters stay registered.
    """

    def __init__(self, original: nn.Module, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.original = original
        self.fn = fn

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


_GELU_CLASSES = {
    "NewGELUActivation",
    "FastGELUActivation",
    "GELUTanh",
    "PytorchGELUTanh",
    "GELUPytorchTanh",
}


def _candidate(module: nn.Module) -> tuple[nn.Module, tuple[int, ...]] | None:
    """A replacement for ``module`` and an input shape to validate it on."""
    name = type(module).__name__
    if name in _GELU_CLASSES:
        return TanhGELU(), (4, 16)
    weight = getattr(module, "weight", None)
    if name.endswith("RMSNorm") or name == "T5LayerNorm":
        eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
        if (
            isinstance(weight, nn.Parameter)
            and weight.dim() == 1
            and isinstance(eps, float)
        ):
            return RMSNormFunction(weight, eps), (4, weight.shape[0])
    if name == "Conv1D" and isinstance(weight, nn.Parameter) and weight.dim() == 2:
        bias = getattr(module, "bias", None)
        return TransposedLinear(weight, bias), (4, weight.shape[0])
    return None


def _agrees(
    original: nn.Module, replacement: nn.Module, shape: tuple[int, ...]
) -> bool:
    reference = next(original.parameters(), None)
    dtype = reference.dtype if reference is not None else torch.float32
    device = reference.device if reference is not None else None
    if device is not None and device.type == "meta":
        return False
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(
        dtype=dtype, device=device
    )
    with torch.no_grad():
        try:
            expected, actual = original(x), replacement(x)
        except Exception:  # a layer with a different calling convention
            return False
    return (
        isinstance(expected, Tensor)
        and expected.shape == actual.shape
        and bool(torch.allclose(expected, actual, rtol=1e-4, atol=1e-5))
    )


def rewrite_library_modules(
    module: nn.Module, replacements: dict[type[nn.Module], Callable[..., Any]]
) -> None:
    """Swap known hand-written layers (and user-listed classes) in ``module``."""
    # Instances of one class with the same shapes run the same code: validate once.
    verdicts: dict[tuple[Any, ...], bool] = {}
    for parent_name, parent in list(module.named_modules()):
        for child_name, child in list(parent.named_children()):
            path = f"{parent_name}.{child_name}" if parent_name else child_name
            new: nn.Module | None = None
            for cls, fn in replacements.items():
                if isinstance(child, cls):
                    new = CallReplacement(child, fn)
                    logger.info(
                        "replacing module: %s (%s) with %s",
                        path,
                        type(child).__name__,
                        getattr(fn, "__name__", fn),
                    )
                    break
            else:
                found = _candidate(child)
                if found is not None:
                    candidate, shape = found
                    key = (
                        type(child),
                        type(candidate),
                        shape,
                        tuple(p.dtype for p in child.parameters()),
                    )
                    if key not in verdicts:
                        verdicts[key] = _agrees(child, candidate, shape)
                    if verdicts[key]:
                        new = candidate
                        logger.info(
                            "replacing module: %s (%s) with %s",
                            path,
                            type(child).__name__,
                            type(candidate).__name__,
                        )
                    else:
                        logger.info(
                            "keeping module: %s (%s): its output differs from %s",
                            path,
                            type(child).__name__,
                            type(candidate).__name__,
                        )
            if new is not None:
                setattr(parent, child_name, new)
