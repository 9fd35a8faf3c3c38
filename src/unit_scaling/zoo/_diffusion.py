"""Diffusion denoisers from diffusers configs: U-Nets and a diffusion transformer."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ._common import DIFFUSERS, IMAGES, generator, noisy_biases, sample
from ._model import Inputs, ZooModel

__all__ = ["MODELS"]

_TIMESTEPS = 1000
_CLASSES = 10
_LATENT_CHANNELS = 4
_LATENTS = ((2, 16), (3, 24))
"""``(batch, side)`` of the latents of variants 0 and 1."""
_TEXT = (8, 12)
"""Text length of the conditioning of variants 0 and 1."""
_TEXT_WIDTH = 32


def _diffusers(model_class: Any, **config: Any) -> nn.Module:
    """A diffusers model; mypy does not see their (untyped) classes as modules."""
    model = model_class(**config)
    if not isinstance(model, nn.Module):
        raise TypeError(f"{model_class.__name__} did not build an nn.Module")
    return noisy_biases(model)


def _unet2d() -> nn.Module:
    from diffusers import UNet2DModel

    return _diffusers(
        UNet2DModel,
        sample_size=IMAGES[0][1],
        block_out_channels=(32, 64),
        layers_per_block=1,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=16,
        norm_num_groups=8,
    )


def _unet2d_condition() -> nn.Module:
    from diffusers import UNet2DConditionModel

    return _diffusers(
        UNet2DConditionModel,
        sample_size=_LATENTS[0][1],
        block_out_channels=(32, 64),
        layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        mid_block_type="UNetMidBlock2DCrossAttn",
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=_TEXT_WIDTH,
        attention_head_dim=2,  # in this model, the number of heads
        norm_num_groups=8,
    )


def _dit() -> nn.Module:
    from diffusers import DiTTransformer2DModel
    from diffusers.models.embeddings import LabelEmbedding

    model = _diffusers(
        DiTTransformer2DModel,
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


def _timesteps(gen: torch.Generator, batch: int) -> torch.Tensor:
    return torch.randint(_TIMESTEPS, (batch,), generator=gen)


def _unet2d_inputs(seed: int, variant: int) -> Inputs:
    gen = generator(seed)
    batch, side = IMAGES[variant]
    noisy = torch.randn(batch, 3, side, side, generator=gen)
    return (noisy, _timesteps(gen, batch)), {}


def _unet2d_condition_inputs(seed: int, variant: int) -> Inputs:
    gen = generator(seed)
    batch, side = _LATENTS[variant]
    noisy = torch.randn(batch, _LATENT_CHANNELS, side, side, generator=gen)
    text = torch.randn(batch, _TEXT[variant], _TEXT_WIDTH, generator=gen)
    return (noisy, _timesteps(gen, batch)), {"encoder_hidden_states": text}


def _dit_inputs(seed: int, variant: int) -> Inputs:
    gen = generator(seed)
    batch, side = _LATENTS[variant]
    noisy = torch.randn(batch, _LATENT_CHANNELS, side, side, generator=gen)
    return (noisy,), {
        "timestep": _timesteps(gen, batch),
        "class_labels": torch.randint(_CLASSES, (batch,), generator=gen),
    }


MODELS = (
    ZooModel(
        "unet2d",
        "diffusion",
        _unet2d,
        _unet2d_inputs,
        sample,
        features=(
            "group-norm",
            "silu",
            "timestep-embedding",
            "skip-connections",
            "spatial-attention",
            "upsampling",
        ),
        requires=DIFFUSERS,
        description="DDPM U-Net: ResNet blocks with group norm and self-attention",
    ),
    ZooModel(
        "unet2d-condition",
        "diffusion",
        _unet2d_condition,
        _unet2d_condition_inputs,
        sample,
        features=(
            "group-norm",
            "cross-attention",
            "geglu",
            "timestep-embedding",
            "skip-connections",
        ),
        requires=DIFFUSERS,
        description="Stable Diffusion U-Net: cross-attention to text on latents",
    ),
    ZooModel(
        "dit",
        "diffusion",
        _dit,
        _dit_inputs,
        sample,
        features=("adaln-zero", "timestep-embedding", "class-embedding", "patchify"),
        requires=DIFFUSERS,
        description="DiT: transformer on latent patches, adaLN-Zero conditioning",
    ),
)
