"""Convolutional image models from Hugging Face configs.

The builders and inputs of the ``conv`` rows of :mod:`._catalogue`.
"""

from __future__ import annotations

import functools
from typing import Any

from ._common import WIDTH, hf, image_inputs

# Two stages of one block each (ResNet's bottlenecks are 4 times narrower).
_RESNET_LIKE: dict[str, Any] = dict(
    embedding_size=WIDTH // 2, hidden_sizes=[2 * WIDTH, 4 * WIDTH], depths=[1, 1]
)

resnet = hf("ResNetModel", _RESNET_LIKE, layer_type="bottleneck")
convnext = hf(
    "ConvNextModel",
    hidden_sizes=[WIDTH, 2 * WIDTH],
    depths=[2, 2],
    num_stages=2,
    drop_path_rate=0.0,
)
# The 17 inverted-residual blocks are fixed; the multiplier narrows them all, and
# finegrained_output=False the last convolution too.
mobilenet_v2 = hf("MobileNetV2Model", depth_multiplier=0.35, finegrained_output=False)
bit = hf(
    "BitModel",
    _RESNET_LIKE,
    layer_type="preactivation",
    global_padding="SAME",
    num_groups=8,
)

# MobileNetV2 downsamples 32x: at 32 pixels its last batch norms would normalise
# two values per channel.
mobilenet_v2_inputs = functools.partial(image_inputs, sizes=((2, 96), (3, 128)))
