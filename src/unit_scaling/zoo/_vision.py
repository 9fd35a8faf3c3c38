"""Vision transformers from Hugging Face configs, on unit-normal images.

The builders and inputs of the ``vision`` rows of :mod:`._catalogue`.
"""

from __future__ import annotations

import functools
from typing import Any

from ._common import BERT_DROPOUT, HEADS, IMAGES, TRUNK, WIDTH, hf, image_inputs
from ._model import Inputs

_PATCH = 4
_VIT_LIKE: dict[str, Any] = dict(TRUNK, image_size=IMAGES[0][1], patch_size=_PATCH)
# Swin's 4 x 4 windows tile the patch grids of both variants at both stages (16
# and 8 patches a side, then 24 and 12), so both shift windows and neither pads.
_SWIN_IMAGES = ((2, 64), (3, 96))

vit = hf("ViTModel", _VIT_LIKE, BERT_DROPOUT, intermediate_size=2 * WIDTH, pooler=False)
swin = hf(
    "SwinModel",
    BERT_DROPOUT,
    image_size=_SWIN_IMAGES[0][1],
    patch_size=_PATCH,
    embed_dim=WIDTH,
    depths=[2, 2],
    num_heads=[HEADS, 2 * HEADS],
    window_size=4,
    mlp_ratio=2.0,
    drop_path_rate=0.0,
    pooler=False,
)
clip_vision = hf(
    "CLIPVisionModel", _VIT_LIKE, intermediate_size=2 * WIDTH, attention_dropout=0.0
)
dinov2 = hf("Dinov2Model", _VIT_LIKE, BERT_DROPOUT, mlp_ratio=2)
beit = hf(
    "BeitModel",
    _VIT_LIKE,
    BERT_DROPOUT,
    intermediate_size=2 * WIDTH,
    use_relative_position_bias=True,
    layer_scale_init_value=0.1,
    drop_path_rate=0.0,
    pooler=False,
)

swin_inputs = functools.partial(image_inputs, sizes=_SWIN_IMAGES)


def interpolated(seed: int, variant: int) -> Inputs:
    """Images whose second size needs the position embeddings interpolated (asked
    for in both variants, so both trace the same code)."""
    args, kwargs = image_inputs(seed, variant)
    return args, {**kwargs, "interpolate_pos_encoding": True}
