"""Argument checks shared by the residual module and the Admin factory."""

from __future__ import annotations

__all__ = ["check_embed_dim"]


def check_embed_dim(embed_dim: int | None) -> int:
    """``embed_dim`` as a positive int; a clear error if it is missing or bad."""
    if embed_dim is None:
        raise ValueError(
            "embed_dim is required when omega is a trainable parameter "
            "(as_parameter=True): pass the hidden size of the shortcut, "
            "e.g. embed_dim=512"
        )
    if isinstance(embed_dim, bool) or not isinstance(embed_dim, int):
        raise TypeError(f"embed_dim must be an int, got {type(embed_dim).__name__}")
    if embed_dim <= 0:
        raise ValueError(f"embed_dim must be positive, got {embed_dim}")
    return embed_dim
