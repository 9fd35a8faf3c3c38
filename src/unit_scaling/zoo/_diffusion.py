"""Diffusion denoisers from diffusers configs: U-Nets and a diffusion transformer.

The builders and inputs of the ``diffusion`` rows of :mod:`._catalogue`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ._common import IMAGES, generator, images, noisy_biases
from ._model import Inputs

_TIMESTEPS = 1000
_CLASSES = 10
_LATENT_CHANNELS = 4
_LATENTS = ((2, 16), (3, 24))
"""``(batch, side)`` of the latents of variants 0 and 1."""
_TEXT = (8, 12)
"""Text length of the conditioning of variants 0 and 1."""
_TEXT_WIDTH = 32


def _diffusers(class_name: str, **config: Any) -> nn.Module:
    """The diffusers model ``class_name`` with :func:`noisy_biases`; mypy does not
    see their (untyped) classes as modules."""
    import diffusers

    model = getattr(diffusers, class_name)(**config)
    if not isinstance(model, nn.Module):
        raise TypeError(f"{class_name} did not build an nn.Module")
    return noisy_biases(model)


def _unet(
    class_name: str, down_blocks: tuple[str, ...], **config: Any
) -> Callable[[], nn.Module]:
    """A builder of the diffusers U-Net ``class_name`` of two levels (32 and 64
    channels, a block each, group norms of 8 groups) whose up path mirrors
    ``down_blocks``."""
    up_blocks = tuple(block.replace("Down", "Up") for block in reversed(down_blocks))
    return functools.partial(
        _diffusers,
        class_name,
        block_out_channels=(32, 64),
        layers_per_block=1,
        norm_num_groups=8,
        down_block_types=down_blocks,
        up_block_types=up_blocks,
        **config,
    )


unet2d = _unet(
    "UNet2DModel",
    ("DownBlock2D", "AttnDownBlock2D"),
    sample_size=IMAGES[0][1],
    attention_head_dim=16,
)
unet2d_condition = _unet(
    "UNet2DConditionModel",
    ("CrossAttnDownBlock2D", "DownBlock2D"),
    mid_block_type="UNetMidBlock2DCrossAttn",
    sample_size=_LATENTS[0][1],
    cross_attention_dim=_TEXT_WIDTH,
    attention_head_dim=2,  # in this model, the number of heads
)


def dit() -> nn.Module:
    from diffusers.models.embeddings import LabelEmbedding

    model = _diffusers(
        "DiTTransformer2DModel",
        num_attention_heads=4,
        attention_head_dim=16,
        in_channels=_LATENT_CHANNELS,
        num_layers=2,
        sample_size=_LATENTS[0][1],
        patch_size=2,
        num_embeds_ada_norm=_CLASSES,
    )
    # Classifier-free guidance drops class labels at random (from the global RNG)
    # in training, at a rate the config does not expose: a dropout, so zero it.
    for module in model.modules():
        if isinstance(module, LabelEmbedding):
            module.dropout_prob = 0.0
    return model


def _noisy(
    seed: int, variant: int, sizes: tuple[tuple[int, int], ...], channels: int
) -> tuple[torch.Generator, Tensor]:
    """The generator of ``seed`` and the noisy images of ``variant`` drawn from it
    first (``sizes``: ``(batch, side)`` of each variant)."""
    gen = generator(seed)
    return gen, images(gen, *sizes[variant], channels=channels)


def _timesteps(gen: torch.Generator, batch: int) -> Tensor:
    return torch.randint(_TIMESTEPS, (batch,), generator=gen)


def unet2d_inputs(seed: int, variant: int) -> Inputs:
    gen, noisy = _noisy(seed, variant, IMAGES, 3)
    return (noisy, _timesteps(gen, len(noisy))), {}


def unet2d_condition_inputs(seed: int, variant: int) -> Inputs:
    gen, noisy = _noisy(seed, variant, _LATENTS, _LATENT_CHANNELS)
    text = torch.randn(len(noisy), _TEXT[variant], _TEXT_WIDTH, generator=gen)
    return (noisy, _timesteps(gen, len(noisy))), {"encoder_hidden_states": text}


def dit_inputs(seed: int, variant: int) -> Inputs:
    gen, noisy = _noisy(seed, variant, _LATENTS, _LATENT_CHANNELS)
    return (noisy,), {
        "timestep": _timesteps(gen, len(noisy)),
        "class_labels": torch.randint(_CLASSES, (len(noisy),), generator=gen),
    }
