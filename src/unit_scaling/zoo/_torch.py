"""Models written with plain ``torch.nn``, as users write them.

The builders and inputs of the ``torch`` rows of :mod:`._catalogue`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._common import (
    HEADS,
    IMAGES,
    LAYERS,
    SEQ2SEQ,
    TOKENS,
    WIDTH,
    generator,
    images,
    padding_mask,
)
from ._model import Inputs

_CLASSES = 10


class MLP(nn.Module):
    """Two-layer GELU MLP: the toy model every implementation handles."""

    def __init__(self, width: int = WIDTH, hidden: int = 4 * WIDTH) -> None:
        super().__init__()
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.down(F.gelu(self.up(x)))
        return out


class Encoder(nn.Module):
    """``nn.TransformerEncoder`` (batch first, post-norm) with a padding mask."""

    def __init__(
        self, width: int = WIDTH, heads: int = HEADS, layers: int = LAYERS
    ) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(
            width, heads, dim_feedforward=2 * width, dropout=0.0, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        out: Tensor = self.encoder(x, src_key_padding_mask=padding_mask)
        return out


class _InplaceBlock(nn.Module):
    """A pre-norm residual MLP written with the in-place ops user code is full of."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.act = nn.ReLU(inplace=True)
        self.down = nn.Linear(4 * width, width)
        self.gate = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        h = self.up(self.norm(x))
        h.mul_(0.5)  # a linear's output: its backward does not need it
        h = self.act(h)
        h = self.down(h)
        h = F.dropout(h, p=0.0, training=self.training, inplace=False)
        h += F.gelu(self.gate(F.silu(x, inplace=False)), approximate="tanh")
        h.add_(x)  # the residual, in place
        return h


class UserInplace(nn.Module):
    """Residual MLP blocks written with in-place ops: ``h += ...``, ``add_``,
    ``mul_``, ``nn.ReLU(inplace=True)``, and functional calls with explicit
    ``inplace=False``."""

    def __init__(self, width: int = WIDTH, layers: int = LAYERS) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_InplaceBlock(width) for _ in range(layers))
        self.norm = nn.LayerNorm(width)

    def forward(self, x: Tensor) -> Tensor:
        for block in self.blocks:
            x = block(x)
        out: Tensor = self.norm(x)
        return out


def sequential() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, WIDTH // 2, 3, padding=1),
        nn.BatchNorm2d(WIDTH // 2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(WIDTH // 2, WIDTH, 3, padding=1),
        nn.BatchNorm2d(WIDTH),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(WIDTH, _CLASSES),
    )


def nn_transformer() -> nn.Module:
    return nn.Transformer(
        WIDTH,
        HEADS,
        num_encoder_layers=LAYERS,
        num_decoder_layers=LAYERS,
        dim_feedforward=2 * WIDTH,
        dropout=0.0,
        batch_first=True,
    )


def features(seed: int, variant: int) -> Inputs:
    batch, seq = TOKENS[variant]
    return (torch.randn(batch, seq, WIDTH, generator=generator(seed)),), {}


def padded_features(seed: int, variant: int) -> Inputs:
    (x,), _ = features(seed, variant)
    batch, seq = TOKENS[variant]
    return (x,), {"padding_mask": padding_mask(batch, seq) == 0}  # True: padding


def transformer_inputs(seed: int, variant: int) -> Inputs:
    gen = generator(seed)
    batch, source, target = SEQ2SEQ[variant]
    src = torch.randn(batch, source, WIDTH, generator=gen)
    tgt = torch.randn(batch, target, WIDTH, generator=gen)
    causal = nn.Transformer.generate_square_subsequent_mask(target)
    return (src, tgt), {"tgt_mask": causal, "tgt_is_causal": True}


def pixels(seed: int, variant: int) -> Inputs:
    return (images(generator(seed), *IMAGES[variant]),), {}
