"""Unit-scaled activation, softmax and dropout layers."""

from __future__ import annotations

from torch import Tensor, nn

from .. import functional as U
from ..constraints import validate_constraint

__all__ = ["GELU", "Dropout", "SiLU", "Softmax"]


class GELU(nn.GELU):
    """Unit-scaled :class:`torch.nn.GELU` with temperature ``mult``.

    See :func:`unit_scaling.functional.gelu`.

    Example::

        >>> GELU(mult=2.0)(torch.randn(4, 8)).shape
        torch.Size([4, 8])
    """

    def __init__(
        self,
        approximate: str = "none",
        mult: float = 1.0,
        constraint: str | None = "to_output_scale",
    ) -> None:
        validate_constraint(constraint)
        super().__init__(approximate)
        self.mult = mult
        self.constraint = constraint

    def forward(self, input: Tensor) -> Tensor:
        return U.gelu(
            input, self.approximate, mult=self.mult, constraint=self.constraint
        )

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, mult={self.mult}, constraint={self.constraint!r}"
        )


class SiLU(nn.SiLU):
    """Unit-scaled :class:`torch.nn.SiLU` with temperature ``mult``.

    See :func:`unit_scaling.functional.silu`.

    Example::

        >>> SiLU()(torch.randn(4, 8)).shape
        torch.Size([4, 8])
    """

    def __init__(
        self,
        inplace: bool = False,
        mult: float = 1.0,
        constraint: str | None = "to_output_scale",
    ) -> None:
        validate_constraint(constraint)
        super().__init__(inplace)
        self.mult = mult
        self.constraint = constraint

    def forward(self, input: Tensor) -> Tensor:
        return U.silu(input, self.inplace, mult=self.mult, constraint=self.constraint)

    def extra_repr(self) -> str:
        inplace = "inplace=True, " if self.inplace else ""
        return f"{inplace}mult={self.mult}, constraint={self.constraint!r}"


class Softmax(nn.Softmax):
    """Unit-scaled :class:`torch.nn.Softmax` with temperature ``mult``.

    See :func:`unit_scaling.functional.softmax`.

    Example::

        >>> Softmax(dim=-1)(torch.randn(4, 8)).shape
        torch.Size([4, 8])
    """

    dim: int

    def __init__(
        self,
        dim: int,
        mult: float = 1.0,
        constraint: str | None = "to_output_scale",
    ) -> None:
        validate_constraint(constraint)
        super().__init__(dim)
        self.mult = mult
        self.constraint = constraint

    def forward(self, input: Tensor) -> Tensor:
        return U.softmax(input, self.dim, constraint=self.constraint, mult=self.mult)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, mult={self.mult}, constraint={self.constraint!r}"


class Dropout(nn.Dropout):
    """Unit-scaled :class:`torch.nn.Dropout`: output and gradient scaled
    ``sqrt(1 - p)`` so both keep unit scale.

    Example::

        >>> Dropout(0.1).eval()(torch.ones(3)).tolist()
        [1.0, 1.0, 1.0]
    """

    def forward(self, input: Tensor) -> Tensor:
        return U.dropout(input, self.p, self.training, self.inplace)
