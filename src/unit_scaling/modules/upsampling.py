"""Unit-scaled upsampling layer."""

from __future__ import annotations

from torch import Tensor, nn

from .. import functional as U
from ..constraints import validate_constraint

__all__ = ["Upsample"]


class Upsample(nn.Upsample):
    """Unit-scaled :class:`torch.nn.Upsample`: ``y = U.interpolate(x, ...)``.

    Takes torch's arguments plus ``constraint``; see
    :func:`unit_scaling.functional.interpolate` for the (exact) scales.

    Example::

        >>> up = Upsample(scale_factor=2, mode="bilinear")
        >>> up(torch.randn(4, 8, 16, 16)).shape
        torch.Size([4, 8, 32, 32])
    """

    def __init__(
        self,
        size: int | tuple[int, ...] | None = None,
        scale_factor: float | tuple[float, ...] | None = None,
        mode: str = "nearest",
        align_corners: bool | None = None,
        recompute_scale_factor: bool | None = None,
        constraint: str | None = "to_output_scale",
    ) -> None:
        validate_constraint(constraint)
        super().__init__(
            size, scale_factor, mode, align_corners, recompute_scale_factor
        )
        self.constraint = constraint

    def forward(self, input: Tensor) -> Tensor:
        return U.interpolate(
            input,
            self.size,
            self.scale_factor,
            self.mode,
            self.align_corners,
            self.recompute_scale_factor,
            constraint=self.constraint,
        )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, constraint={self.constraint!r}"
