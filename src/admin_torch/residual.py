"""The residual connection with a rescaled shortcut, ``x * omega + f(x)``."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ._checks import check_embed_dim

__all__ = ["OmegaResidual"]


def _check_omega(init_value: float) -> float:
    if isinstance(init_value, bool) or not isinstance(init_value, int | float):
        raise TypeError(f"init_value must be a float, got {type(init_value).__name__}")
    if not (math.isfinite(init_value) and init_value > 0):
        raise ValueError(f"init_value must be finite and positive, got {init_value}")
    return float(init_value)


class OmegaResidual(nn.Module):
    """Residual connection whose shortcut is rescaled by ``omega``.

    .. math:: \\text{out} = x \\cdot \\omega + f(x)

    Admin sets ``omega`` > 1 in Post-LN transformers so that the shortcut dominates
    each residual sum at initialisation, which bounds how much the output changes
    when parameters are updated. ``omega`` is either a scalar buffer (fixed) or a
    trainable vector of size ``embed_dim`` that multiplies the last dimension of
    ``x`` (like the weight of a layer norm). It is stored as ``self.omega`` either
    way, so it appears in ``state_dict`` under ``<prefix>omega``.

    Args:
        init_value: the initial value of ``omega``.
        as_parameter: make ``omega`` a trainable vector instead of a fixed scalar.
            Default: ``False``.
        embed_dim: the size of the last dimension of ``x``; required when
            ``as_parameter=True``, ignored otherwise.

    Shape:
        - x: ``(*, embed_dim)`` (any shape when ``omega`` is a scalar).
        - f_x: broadcastable with ``x``.
        - Output: the broadcast shape of ``x`` and ``f_x``.

    Example::

        >>> residual = OmegaResidual(2.0)
        >>> x, f_x = torch.ones(3), torch.full((3,), 0.5)
        >>> residual(x, f_x)
        tensor([2.5000, 2.5000, 2.5000])
        >>> OmegaResidual(2.0, as_parameter=True, embed_dim=3).omega.shape
        torch.Size([3])
    """

    omega: Tensor

    def __init__(
        self,
        init_value: float,
        as_parameter: bool = False,
        embed_dim: int | None = None,
    ) -> None:
        super().__init__()
        value = _check_omega(init_value)
        if as_parameter:
            size = check_embed_dim(embed_dim)
            self.omega = nn.Parameter(torch.full((size,), value))
        else:
            self.register_buffer("omega", torch.tensor(value))

    def forward(self, x: Tensor, f_x: Tensor) -> Tensor:
        """Return ``x * omega + f_x``."""
        return x * self.omega + f_x

    def extra_repr(self) -> str:
        if self.omega.is_meta:
            return f"omega_shape={tuple(self.omega.shape)}"
        if isinstance(self.omega, nn.Parameter):
            # a trainable omega drifts from its initial value: show the mean
            mean = self.omega.detach().float().mean().item()
            return f"embed_dim={self.omega.numel()}, omega_mean={mean:.4g}, trainable"
        return f"omega={self.omega.item():.4g}"
