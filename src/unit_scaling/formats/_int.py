"""Fixed-point element formats: :class:`IntFormat`, the elements of MXINT8."""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor

from ._fp import FPFormat, Rounding

__all__ = ["IntFormat"]


@dataclass(frozen=True)
class IntFormat:
    """A two's complement integer times ``2^(2 - bits)``, that rounds tensors onto
    its values: the elements of OCP MXINT8 (``bits=8``: ``k / 64``).

    .. math:: q(x) = 2^{2-b} \\operatorname{round}\\big(
        \\operatorname{clamp}(x\\, 2^{b-2}, -(2^{b-1} - 1), 2^{b-1} - 1)\\big)

    Saturation is symmetric: the code ``-2^(b-1)`` (``-2.0`` for INT8) is never
    produced, as in the OCP MX v1.0 reference (``microxcaling``'s ``max_norm``).

    Args:
        bits: total bits ``b`` (sign included), from 2 to 16.
        rounding: ``"nearest"`` (ties to even) or ``"stochastic"`` (unbiased).
        srbits: random bits per stochastic decision, as for :class:`FPFormat`.

    Example::

        >>> IntFormat(8, "nearest").quantise(torch.tensor([0.01, -3.0, 1.0]))
        tensor([ 0.0156, -1.9844,  1.0000])
    """

    bits: int = 8
    rounding: Rounding = "nearest"
    srbits: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.bits, int) or isinstance(self.bits, bool):
            raise TypeError(f"bits must be an int, got {type(self.bits).__name__}")
        if not 2 <= self.bits <= 16:
            raise ValueError(f"bits must be between 2 and 16, got {self.bits}")
        # The grid check (rounding, srbits) is FPFormat's.
        self._grid()

    def _grid(self) -> FPFormat:
        # k * 2^(2-b) for |k| < 2^(b-1) is the E2M(b-2) grid below 2: its
        # subnormals cover [0, 1) and its first binade [1, 2), both in steps of
        # 2^(2-b), and ties to the even mantissa are ties to even k.
        return FPFormat(2, self.bits - 2, self.rounding, self.srbits)

    @property
    def max_absolute_value(self) -> float:
        """The largest magnitude, ``(2^(b-1) - 1) * 2^(2-b)``."""
        return math.ldexp((1 << (self.bits - 1)) - 1, 2 - self.bits)

    @property
    def step(self) -> float:
        """The spacing of the values, ``2^(2-b)``."""
        return math.ldexp(1.0, 2 - self.bits)

    def __str__(self) -> str:
        suffix = str(self.srbits) if self.srbits else ""
        short = {"nearest": "RN", "stochastic": "SR"}[self.rounding]
        return f"INT{self.bits}-{short}{suffix}"

    def quantise(self, x: Tensor) -> Tensor:
        """Round ``x`` onto this format's values; same dtype and shape, no gradient.

        Magnitudes above :attr:`max_absolute_value` saturate, NaN stays NaN, and
        zero is ``+0`` (an integer has no negative zero). Ties go to even ``k``.

        Example::

            >>> IntFormat(8, "nearest").quantise(torch.tensor([3 / 128, 5 / 128]))
            tensor([0.0312, 0.0312])
        """
        if not x.is_floating_point():
            raise TypeError(f"quantise expects a floating-point tensor, got {x.dtype}")
        limit = self.max_absolute_value
        # Adding +0 turns -0 into +0 and leaves every other value as it is.
        return self._grid().quantise(x.detach().clamp(-limit, limit)) + 0.0
