"""Closed-form Admin: omega from the number of residual layers.

For a Post-LN residual stack with ``N`` residual branches, the output change caused
by a parameter update grows as ``O(N)`` when every shortcut has weight 1 (the plain
residual), which is why deep Post-LN transformers are hard to train. Rescaling every
shortcut by the same ``omega`` regulates it:

========================  ==================================  =====================
``output_change_scale``   ``omega``                           output change
========================  ==================================  =====================
``"O(n)"``                ``1``                               linear in depth
``"O(logn)"``/default     ``sqrt((N + 1) / ln(N + 1) - 1)``   logarithmic
``"O(1)"``                ``sqrt(N)``                         bounded
========================  ==================================  =====================

These functions build that ``omega`` as a module (:func:`as_module`), or register it
on an existing module as a buffer (:func:`as_buffer`) or a trainable vector
(:func:`as_parameter`).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ._checks import check_embed_dim
from .residual import OmegaResidual

__all__ = [
    "OUTPUT_CHANGE_SCALES",
    "as_buffer",
    "as_module",
    "as_parameter",
    "calculate_init",
]

OUTPUT_CHANGE_SCALES = ("O(logn)", "default", "O(n)", "O(1)")
"""The values :func:`calculate_init` takes for ``output_change_scale``."""


def calculate_init(num_res_layers: int, output_change_scale: str = "O(logn)") -> float:
    """Compute the shortcut scale ``omega`` for a stack of residual layers.

    .. math::
        \\omega = \\begin{cases}
            1 & \\text{"O(n)"} \\\\
            \\sqrt{(N + 1) / \\ln(N + 1) - 1} & \\text{"O(logn)" or "default"} \\\\
            \\sqrt{N} & \\text{"O(1)"}
        \\end{cases}

    Args:
        num_res_layers: ``N``, the total number of residual branches in the stack
            (an ``n``-layer transformer encoder has ``2n``).
        output_change_scale: how fast the output change at initialisation may grow
            with depth: ``"O(logn)"`` (same as ``"default"``), ``"O(n)"`` (the plain
            residual) or ``"O(1)"`` (most stable). Default: ``"O(logn)"``.

    Returns:
        ``omega`` as a Python float.

    Example::

        >>> round(calculate_init(12), 4)
        2.017
        >>> calculate_init(16, "O(1)")
        4.0
    """
    if isinstance(num_res_layers, bool) or not isinstance(num_res_layers, int):
        raise TypeError(
            f"num_res_layers must be an int, got {type(num_res_layers).__name__}"
        )
    if num_res_layers <= 0:
        raise ValueError(
            f"num_res_layers must be positive, got {num_res_layers}: pass the total "
            "number of residual branches (2 per transformer encoder layer)"
        )
    n = num_res_layers
    if output_change_scale in ("O(logn)", "default"):
        return math.sqrt((n + 1) / math.log(n + 1) - 1)
    if output_change_scale == "O(n)":
        return 1.0
    if output_change_scale == "O(1)":
        return math.sqrt(n)
    raise ValueError(
        f"unknown output_change_scale {output_change_scale!r}; "
        f"expected one of {', '.join(map(repr, OUTPUT_CHANGE_SCALES))}"
    )


def as_module(
    num_res_layers: int,
    output_change_scale: str = "default",
    as_parameter: bool = False,
    embed_dim: int | None = None,
) -> OmegaResidual:
    """Return an :class:`OmegaResidual` with ``omega`` from :func:`calculate_init`.

    Args:
        num_res_layers: total number of residual branches in the stack.
        output_change_scale: ``"O(logn)"``/``"default"``, ``"O(n)"`` or ``"O(1)"``.
            Default: ``"default"``.
        as_parameter: make ``omega`` a trainable vector of size ``embed_dim``
            instead of a fixed scalar buffer. Default: ``False``.
        embed_dim: hidden size of the shortcut; required when ``as_parameter``.

    Example (a Post-LN encoder layer)::

        >>> from types import SimpleNamespace
        >>> import torch.nn as nn
        >>> import admin_torch
        >>> class TransformerEncoderLayer(nn.Module):
        ...     def __init__(self, cfg):
        ...         super().__init__()
        ...         num_layer = 2 * cfg.encoder_layers  # number of residual layers
        ...         self.attn = nn.MultiheadAttention(cfg.embed_dim, cfg.num_heads)
        ...         self.residual_attn = admin_torch.as_module(num_layer)
        ...         self.ln_attn = nn.LayerNorm(cfg.embed_dim)
        ...         self.ffn = nn.Sequential(
        ...             nn.Linear(cfg.embed_dim, cfg.feedforward_dim),
        ...             nn.ReLU(),
        ...             nn.Linear(cfg.feedforward_dim, cfg.embed_dim),
        ...         )
        ...         self.residual_ffn = admin_torch.as_module(num_layer)
        ...         self.ln_ffn = nn.LayerNorm(cfg.embed_dim)
        ...
        ...     def forward(self, x):
        ...         f_x, _ = self.attn(x, x, x)
        ...         x = self.residual_attn(x, f_x)
        ...         x = self.ln_attn(x)
        ...         f_x = self.ffn(x)
        ...         x = self.residual_ffn(x, f_x)
        ...         x = self.ln_ffn(x)
        ...         return x
        >>> cfg = SimpleNamespace(
        ...     encoder_layers=6, embed_dim=16, num_heads=4, feedforward_dim=64
        ... )
        >>> layer = TransformerEncoderLayer(cfg)
        >>> layer.residual_attn
        OmegaResidual(omega=2.017)
        >>> layer(torch.randn(10, 2, cfg.embed_dim)).shape  # (seq, batch, embed)
        torch.Size([10, 2, 16])
    """
    omega = calculate_init(num_res_layers, output_change_scale)
    return OmegaResidual(omega, as_parameter=as_parameter, embed_dim=embed_dim)


def _check_network(network: nn.Module) -> None:
    if not isinstance(network, nn.Module):
        raise TypeError(
            "network must be the torch.nn.Module to register omega on (usually "
            f"`self` inside __init__), got {type(network).__name__}"
        )


def as_buffer(
    network: nn.Module,
    buffer_name: str,
    num_res_layers: int,
    output_change_scale: str = "default",
) -> None:
    """Register ``omega`` from :func:`calculate_init` as a scalar buffer.

    The buffer is persistent (it is saved in ``state_dict``), moves with
    ``network.to(...)`` and is not trained. Use it as ``x * self.<buffer_name> +
    f_x``.

    Args:
        network: the module to register the buffer on (usually ``self``).
        buffer_name: the attribute name of the buffer.
        num_res_layers: total number of residual branches in the stack.
        output_change_scale: ``"O(logn)"``/``"default"``, ``"O(n)"`` or ``"O(1)"``.
            Default: ``"default"``.

    Example (in a Post-LN layer as in :func:`as_module`, the shortcut becomes
    ``x * self.attn_omega + f_x``)::

        >>> import torch
        >>> import torch.nn as nn
        >>> import admin_torch
        >>> layer = nn.Module()
        >>> admin_torch.as_buffer(layer, "attn_omega", 12)
        >>> list(layer.state_dict())
        ['attn_omega']
        >>> x, f_x = torch.randn(10, 2, 16), torch.randn(10, 2, 16)
        >>> (x * layer.attn_omega + f_x).shape
        torch.Size([10, 2, 16])
    """
    _check_network(network)
    omega = calculate_init(num_res_layers, output_change_scale)
    network.register_buffer(buffer_name, torch.tensor(omega))


def as_parameter(
    network: nn.Module,
    parameter_name: str,
    num_res_layers: int,
    embed_dim: int,
    output_change_scale: str = "default",
) -> None:
    """Register ``omega`` from :func:`calculate_init` as a trainable vector.

    The parameter has shape ``(embed_dim,)``, every entry set to ``omega``, and
    multiplies the last dimension of the shortcut. Use it as
    ``x * self.<parameter_name> + f_x``.

    Args:
        network: the module to register the parameter on (usually ``self``).
        parameter_name: the attribute name of the parameter.
        num_res_layers: total number of residual branches in the stack.
        embed_dim: hidden size of the shortcut.
        output_change_scale: ``"O(logn)"``/``"default"``, ``"O(n)"`` or ``"O(1)"``.
            Default: ``"default"``.

    Example (as :func:`as_buffer`, with a trainable omega per channel)::

        >>> import torch.nn as nn
        >>> import admin_torch
        >>> layer = nn.Module()
        >>> admin_torch.as_parameter(layer, "attn_omega", 12, embed_dim=16)
        >>> layer.attn_omega.shape, layer.attn_omega.requires_grad
        (torch.Size([16]), True)
        >>> round(layer.attn_omega[0].item(), 4) == round(
        ...     admin_torch.calculate_init(12), 4
        ... )
        True
    """
    _check_network(network)
    size = check_embed_dim(embed_dim)
    omega = calculate_init(num_res_layers, output_change_scale)
    network.register_parameter(parameter_name, nn.Parameter(torch.full((size,), omega)))
