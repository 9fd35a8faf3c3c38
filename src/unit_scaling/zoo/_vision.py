"""Vision transformers from Hugging Face configs, on unit-normal images."""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from ._common import (
    HEADS,
    IMAGES,
    LAYERS,
    TRANSFORMERS,
    WIDTH,
    generator,
    image_inputs,
    last_hidden_state,
    noisy_biases,
)
from ._model import Inputs, ZooModel

__all__ = ["MODELS"]

_PATCH = 4
_VIT_LIKE: dict[str, Any] = dict(
    hidden_size=WIDTH,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    image_size=IMAGES[0][1],
    patch_size=_PATCH,
)
_BERT_DROPOUT: dict[str, Any] = dict(
    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
)
# Swin's 4 x 4 windows tile the patch grids of both variants at both stages (16
# and 8 patches a side, then 24 and 12), so both shift windows and neither pads.
_SWIN_IMAGES = ((2, 64), (3, 96))


def _vit() -> nn.Module:
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(**_VIT_LIKE, **_BERT_DROPOUT, intermediate_size=2 * WIDTH)
    return noisy_biases(ViTModel(config, add_pooling_layer=False))


def _swin() -> nn.Module:
    from transformers import SwinConfig, SwinModel

    config = SwinConfig(
        image_size=_SWIN_IMAGES[0][1],
        patch_size=_PATCH,
        embed_dim=WIDTH,
        depths=[2, 2],
        num_heads=[HEADS, 2 * HEADS],
        window_size=4,
        mlp_ratio=2.0,
        drop_path_rate=0.0,
        **_BERT_DROPOUT,
    )
    return noisy_biases(SwinModel(config, add_pooling_layer=False))


def _clip_vision() -> nn.Module:
    from transformers import CLIPVisionConfig, CLIPVisionModel

    config = CLIPVisionConfig(
        **_VIT_LIKE, intermediate_size=2 * WIDTH, attention_dropout=0.0
    )
    return noisy_biases(CLIPVisionModel(config))


def _dinov2() -> nn.Module:
    from transformers import Dinov2Config, Dinov2Model

    config = Dinov2Config(**_VIT_LIKE, **_BERT_DROPOUT, mlp_ratio=2)
    return noisy_biases(Dinov2Model(config))


def _beit() -> nn.Module:
    from transformers import BeitConfig, BeitModel

    config = BeitConfig(
        **_VIT_LIKE,
        **_BERT_DROPOUT,
        intermediate_size=2 * WIDTH,
        use_relative_position_bias=True,
        layer_scale_init_value=0.1,
        drop_path_rate=0.0,
    )
    return noisy_biases(BeitModel(config, add_pooling_layer=False))


def _interpolated(seed: int, variant: int) -> Inputs:
    """Images whose second size needs the position embeddings interpolated (asked
    for in both variants, so both trace the same code)."""
    args, kwargs = image_inputs(seed, variant)
    return args, {**kwargs, "interpolate_pos_encoding": True}


def _swin_inputs(seed: int, variant: int) -> Inputs:
    batch, side = _SWIN_IMAGES[variant]
    pixels = torch.randn(batch, 3, side, side, generator=generator(seed))
    return (), {"pixel_values": pixels}


_vision = functools.partial(
    ZooModel, family="vision", output=last_hidden_state, requires=TRANSFORMERS
)

MODELS = (
    _vision(
        name="vit",
        build=_vit,
        inputs=_interpolated,
        features=("patch-embedding", "cls-token", "interpolated-positions"),
        description="ViT: patch embedding, class token, learned positions",
    ),
    _vision(
        name="swin",
        build=_swin,
        inputs=_swin_inputs,
        features=(
            "windowed-attention",
            "shifted-windows",
            "relative-position-bias",
            "patch-merging",
        ),
        # Tracing one shape takes 2 s, but tracing the second with dynamic shapes
        # takes a minute, in sympy, on the window partitions' shape arithmetic.
        slow=True,
        description="Swin: shifted-window attention, relative position bias",
    ),
    _vision(
        name="clip-vision",
        build=_clip_vision,
        inputs=_interpolated,
        features=("patch-embedding", "cls-token", "quick-gelu", "pre-layernorm"),
        description="CLIP image tower: ViT with quick GELU and a pre-LayerNorm",
    ),
    _vision(
        name="dinov2",
        build=_dinov2,
        inputs=image_inputs,
        features=("layer-scale", "cls-token", "interpolated-positions"),
        description="DINOv2: ViT with layer scale, positions interpolated to the image",
    ),
    _vision(
        name="beit",
        build=_beit,
        inputs=_interpolated,
        features=("relative-position-bias", "layer-scale", "cls-token"),
        description="BEiT: per-layer relative position bias and layer scale",
    ),
)
