"""Unit-scaled activation, softmax and dropout layers."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from .. import functional as U
from ._base import CallsFunction

__all__ = ["GELU", "Dropout", "SiLU", "Softmax"]


class _Tempered(CallsFunction):
    """An activation with a temperature ``mult`` as well as a ``constraint``."""

    _keywords = ("mult", "constraint")
    _shown = ("mult", "constraint")

    def __init__(self, mult: float, constraint: str | None, *torch_args: Any) -> None:
        super().__init__(constraint, *torch_args)
        self.mult = mult


class GELU(_Tempered, nn.GELU):
    """Unit-scaled :class:`torch.nn.GELU`: ``alpha * GELU(mult * x) / mult``.

    ``mult`` is a temperature; :func:`unit_scaling.functional.gelu` gives ``alpha``.

    Example::

        >>> GELU(mult=2.0)(torch.randn(4, 8)).shape
        torch.Size([4, 8])
    """

    _function = staticmethod(U.gelu)
    _arguments = ("approximate",)

    def __init__(
        self,
        approximate: str = "none",
        mult: float = 1.0,
        constraint: str | None = "to_output_scale",
    ) -> None:
        super().__init__(mult, constraint, approximate)


class SiLU(_Tempered, nn.SiLU):
    """Unit-scaled :class:`torch.nn.SiLU`: ``alpha * SiLU(mult * x) / mult``.

    ``mult`` is a temperature; :func:`unit_scaling.functional.silu` gives ``alpha``.

    Example::

        >>> SiLU()(torch.randn(4, 8)).shape
        torch.Size([4, 8])
    """

    _function = staticmethod(U.silu)
    _arguments = ("inplace",)

    def __init__(
        self,
        inplace: bool = False,
        mult: float = 1.0,
        constraint: str | None = "to_output_scale",
    ) -> None:
        super().__init__(mult, constraint, inplace)


class Softmax(_Tempered, nn.Softmax):
    """Unit-scaled :class:`torch.nn.Softmax`: ``alpha * softmax(mult * x, dim)``.

    ``alpha`` normalises the output's RMS, so rows no longer sum to one; ``mult`` is
    a temperature. See :func:`unit_scaling.functional.softmax`.

    Example::

        >>> Softmax(dim=-1)(torch.randn(4, 8)).shape
        torch.Size([4, 8])
    """

    dim: int
    _function = staticmethod(U.softmax)
    _arguments = ("dim",)
    _keywords = ("constraint", "mult")

    def __init__(
        self,
        dim: int,
        mult: float = 1.0,
        constraint: str | None = "to_output_scale",
    ) -> None:
        super().__init__(mult, constraint, dim)


class Dropout(nn.Dropout):
    """Unit-scaled :class:`torch.nn.Dropout`: output and gradient scaled
    ``sqrt(1 - p)`` so both keep unit scale.

    Example::

        >>> Dropout(0.1).eval()(torch.ones(3)).tolist()
        [1.0, 1.0, 1.0]
    """

    def forward(self, input: Tensor) -> Tensor:
        return U.dropout(input, self.p, self.training, self.inplace)
