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

__all__ = [
    "RESCALING",
    "broadcast_gradient",
    "calibrated_scale",
    "low_rank_update",
    "repeated_gradient",
    "sum_branches",
]


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


def low_rank_update(output: Tensor, update: Tensor, scaling: float) -> Tensor:
    """``output + update * scaling``, with its true gradient: a low-rank
    adapter's update (LoRA's ``x Aᵀ Bᵀ``) joining the output of the layer it
    adapts as the merged weight ``W + scaling B A`` would compute it (see
    ``transforms._unit.adapters``)."""
    return output + update * scaling


def broadcast_gradient(input: Tensor, *others: Sequence[int]) -> Tensor:
    """``input``, whose gradient is scaled by ``expansion^-½``: ``expansion`` is
    how many times broadcasting ``input`` against the shapes ``others`` (the
    other operands' sizes, passed as sizes so that the graph shows no data
    flowing from them) repeats each of its elements. Read from the shapes of each
    call: a graph captured with dynamic shapes scales each batch by its own."""
    shape = torch.broadcast_shapes(input.shape, *others)  # type: ignore[no-untyped-call]
    expansion = math.prod(shape) / max(input.numel(), 1)
    return scale_bwd(input, expansion**-0.5) if expansion > 1 else input


def repeated_gradient(output: Tensor, source: Sequence[int]) -> Tensor:
    """``output``, which holds the elements of a tensor of size ``source``
    repeated (``x.expand(...)``, ``x.repeat(...)``, ``table[indices]``), whose
    gradient is scaled by ``repeats^-½``: ``repeats = output.numel() /
    numel(source)`` is how many times each element of the source is used, on
    average, so its gradient sums as many terms (for a lookup it may be under
    1). Read from the shapes of each call, as :func:`broadcast_gradient`: the
    repeats of a tensor shared by every example grow with the batch."""
    repeats = output.numel() / max(math.prod(source), 1)
    return output if repeats in (0, 1) else scale_bwd(output, repeats**-0.5)


# Targets whose output is their first argument rescaled, in value or gradient.
RESCALING: frozenset[Callable[..., Any]] = frozenset(
    {scale_bwd, scale_fwd, calibrated_scale, broadcast_gradient, repeated_gradient}
)
