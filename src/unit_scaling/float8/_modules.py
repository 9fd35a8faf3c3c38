"""The FP8 modules: unit-scaled layers whose matrix products run in FP8, made
by :func:`convert_to_float8_training` from the modules of the same names."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from ..modules import MHSA, Linear, LinearReadout
from ._attention import scaled_dot_product_attention
from ._config import Float8Config
from ._fsdp import gather_in_fp8
from ._linear import READOUT_POWER, linear


class Float8Layer(nn.Module):
    """The forward of a converted layer: its function's FP8 version."""

    float8_config: Float8Config
    constraint: str | None
    _power: tuple[float, float, float] = (0.5, 0.5, 0.5)

    def forward(self, input: Tensor) -> Tensor:
        weight, bias = self.weight, self.bias
        assert isinstance(weight, Tensor) and (bias is None or isinstance(bias, Tensor))
        return linear(
            input, weight, bias, self.constraint, self._power, config=self.float8_config
        )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, float8"

    def fsdp_prepare_parameters(self) -> None:
        """Called by :func:`unit_scaling.parallel.fully_shard` before sharding:
        with ``float8_config.fsdp_fp8_all_gather``, the weight is gathered in
        FP8."""
        if self.float8_config.fsdp_fp8_all_gather:
            gather_in_fp8(self)


class Float8Linear(Float8Layer, Linear):
    """A :class:`unit_scaling.Linear` whose GEMMs run in FP8 (made by
    :func:`convert_to_float8_training`; ``float8_config`` says how).

    Example::

        >>> from unit_scaling.float8 import convert_to_float8_training
        >>> layer = convert_to_float8_training(nn.Sequential(uu.Linear(64, 32)))[0]
        >>> layer.float8_config.forward_dtype
        torch.float8_e4m3fn
    """


class Float8LinearReadout(Float8Layer, LinearReadout):
    """A :class:`unit_scaling.LinearReadout` whose GEMMs run in FP8.

    Example::

        >>> from unit_scaling.float8 import convert_to_float8_training
        >>> head = convert_to_float8_training(nn.Sequential(uu.LinearReadout(64, 256)))
        >>> type(head[0]).__name__
        'Float8LinearReadout'
    """

    _power = READOUT_POWER


class Float8MHSA(MHSA):
    """A :class:`unit_scaling.MHSA` whose attention runs in FP8
    (:func:`scaled_dot_product_attention`; made by
    :func:`convert_to_float8_training` with ``Float8Config(attention=True)``).
    Its projections are converted as any linear layer.

    Example::

        >>> from unit_scaling.float8 import Float8Config, convert_to_float8_training
        >>> config = Float8Config(attention=True)
        >>> model = convert_to_float8_training(uu.MHSA(64, 4, True), config=config)
        >>> type(model).__name__, model(torch.randn(2, 16, 64)).shape
        ('Float8MHSA', torch.Size([2, 16, 64]))
    """

    float8_config: Float8Config

    def _attention(self, *args: Any, **kwargs: Any) -> Tensor:
        return scaled_dot_product_attention(*args, **kwargs, config=self.float8_config)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, float8"
