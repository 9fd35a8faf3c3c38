"""Random values the library draws for its own use: stand-ins for activations,
probes, output gradients.

Every draw comes from a seeded generator on the CPU and is then moved to the
device (and cast to the dtype) of the value it stands for. So the numbers are the
same on every device, and what the library measures on them (calibrated scales,
recognised ops) is too; and the result never lands on torch's default device
while the model lives on another (a CPU stand-in multiplied by a CUDA weight).
Factory calls here name their device explicitly, so a default device set with
:func:`torch.set_default_device` does not reach them either.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["normal", "normal_like", "seeded"]

_CPU = torch.device("cpu")


def seeded(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed``."""
    return torch.Generator(device=_CPU).manual_seed(seed)


def normal(
    shape: Sequence[int],
    generator: torch.Generator,
    device: torch.device | str,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Unit-normal values of ``shape``, drawn in float32 on the CPU from
    ``generator``, then moved to ``device`` and cast to ``dtype``.

    Example:
        >>> x = normal((2, 3), seeded(0), "cpu", torch.float64)
        >>> x.dtype, tuple(x.shape)
        (torch.float64, (2, 3))
    """
    x = torch.randn(tuple(shape), generator=generator, device=_CPU)
    return x.to(device=device, dtype=dtype)


def normal_like(value: Tensor, generator: torch.Generator) -> Tensor:
    """Unit-normal values shaped, placed and typed like ``value`` (a float
    tensor), drawn on the CPU (see :func:`normal`).

    Example:
        >>> normal_like(torch.zeros(4, dtype=torch.bfloat16), seeded(0)).dtype
        torch.bfloat16
    """
    return normal(value.shape, generator, value.device, value.dtype)
