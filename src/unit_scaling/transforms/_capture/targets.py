"""Functions the transforms insert into graphs, apart from ``unit_scaling.functional``.

Each is a function of its own (not ``operator.mul``) so that graphs, logs and
reports show it for what it is, and so that scale tracking can report the tensor
it rescales once, after its scale.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from torch import Tensor

from ...scale import scale_bwd, scale_fwd

__all__ = ["RESCALING", "broadcast_gradient", "calibrated_scale", "sum_branches"]


def calibrated_scale(input: Tensor, factor: float) -> Tensor:
    """``input * factor``, with its true gradient: the calibrated output scale of
    a region of ops that no unit-scaling rule covers."""
    return input * factor


def sum_branches(*branches: Tensor) -> Tensor:
    """``(b_1 + ... + b_k) / sqrt(k)``: the parallel branches of one residual add
    (``x + attn(x) + mlp(x)``), summed at unit scale before they join the skip."""
    total = branches[0]
    for branch in branches[1:]:
        total = total + branch
    return cast(Tensor, total * len(branches) ** -0.5)


def broadcast_gradient(input: Tensor, other: Sequence[int]) -> Tensor:
    """``input``, whose gradient is scaled by ``expansion^-½``: ``expansion`` is
    how many times broadcasting ``input`` against the shape ``other`` (the
    other operand's size, passed as a size so that the graph shows no data
    flowing from it) repeats each of its elements. Read from the shapes of each
    call: a graph captured with dynamic shapes scales each batch by its own."""
    shape = torch.broadcast_shapes(input.shape, other)  # type: ignore[no-untyped-call]
    expansion = math.prod(shape) / max(input.numel(), 1)
    return scale_bwd(input, expansion**-0.5) if expansion > 1 else input


# Targets whose output is their first argument rescaled, in value or gradient.
RESCALING: frozenset[Callable[..., Any]] = frozenset(
    {scale_bwd, scale_fwd, calibrated_scale, broadcast_gradient}
)
