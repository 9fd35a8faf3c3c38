"""Unit-scaled upsampling layer."""

from __future__ import annotations

from torch import nn

from .. import functional as U
from ._base import CallsFunction

__all__ = ["Upsample"]


class Upsample(CallsFunction, nn.Upsample):
    """Unit-scaled :class:`torch.nn.Upsample`: ``y = U.interpolate(x, ...)``.

    Takes torch's arguments plus ``constraint``; see
    :func:`unit_scaling.functional.interpolate` for the (exact) scales.

    Example::

        >>> up = Upsample(scale_factor=2, mode="bilinear")
        >>> up(torch.randn(4, 8, 16, 16)).shape
        torch.Size([4, 8, 32, 32])
    """

    _function = staticmethod(U.interpolate)
    _arguments = (
        "size",
        "scale_factor",
        "mode",
        "align_corners",
        "recompute_scale_factor",
    )

    def __init__(
        self,
        size: int | tuple[int, ...] | None = None,
        scale_factor: float | tuple[float, ...] | None = None,
        mode: str = "nearest",
        align_corners: bool | None = None,
        recompute_scale_factor: bool | None = None,
        constraint: str | None = "to_output_scale",
    ) -> None:
        super().__init__(
            constraint, size, scale_factor, mode, align_corners, recompute_scale_factor
        )
