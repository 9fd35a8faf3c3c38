"""Convolutional image models from Hugging Face configs."""

from __future__ import annotations

import functools

from torch import nn

from ._common import TRANSFORMERS, WIDTH, image_inputs, last_hidden_state, noisy_biases
from ._model import ZooModel

__all__ = ["MODELS"]


def _resnet() -> nn.Module:
    from transformers import ResNetConfig, ResNetModel

    config = ResNetConfig(
        embedding_size=WIDTH // 2,
        hidden_sizes=[2 * WIDTH, 4 * WIDTH],  # bottlenecks 4 times narrower
        depths=[1, 1],
        layer_type="bottleneck",
    )
    return noisy_biases(ResNetModel(config))


def _convnext() -> nn.Module:
    from transformers import ConvNextConfig, ConvNextModel

    config = ConvNextConfig(
        hidden_sizes=[WIDTH, 2 * WIDTH],
        depths=[2, 2],
        num_stages=2,
        drop_path_rate=0.0,
    )
    return noisy_biases(ConvNextModel(config))


def _mobilenet_v2() -> nn.Module:
    from transformers import MobileNetV2Config, MobileNetV2Model

    # The 17 inverted-residual blocks are fixed; the multiplier narrows them all,
    # and finegrained_output=False the last convolution too.
    config = MobileNetV2Config(depth_multiplier=0.35, finegrained_output=False)
    return noisy_biases(MobileNetV2Model(config))


def _bit() -> nn.Module:
    from transformers import BitConfig, BitModel

    config = BitConfig(
        embedding_size=WIDTH // 2,
        hidden_sizes=[2 * WIDTH, 4 * WIDTH],
        depths=[1, 1],
        layer_type="preactivation",
        global_padding="SAME",
        num_groups=8,
    )
    return noisy_biases(BitModel(config))


_conv = functools.partial(
    ZooModel,
    family="conv",
    inputs=image_inputs,
    output=last_hidden_state,
    requires=TRANSFORMERS,
)

MODELS = (
    _conv(
        name="resnet",
        build=_resnet,
        features=("batch-norm", "bottleneck", "relu", "max-pool", "inplace-ops"),
        description="ResNet-50 style: bottleneck blocks with batch norm",
    ),
    _conv(
        name="convnext",
        build=_convnext,
        features=(
            "depthwise-conv",
            "layer-scale",
            "channels-last-layernorm",
            "patchify-stem",
        ),
        description="ConvNeXt: 7x7 depthwise convolutions, LayerNorm, layer scale",
    ),
    _conv(
        name="mobilenet-v2",
        build=_mobilenet_v2,
        # It downsamples 32x: at 32 pixels its last batch norms would normalise
        # two values per channel.
        inputs=functools.partial(image_inputs, sizes=((2, 96), (3, 128))),
        features=(
            "depthwise-conv",
            "batch-norm",
            "relu6",
            "inverted-residual",
            "same-padding",
        ),
        description="MobileNetV2: inverted residuals of depthwise convolutions, ReLU6",
    ),
    _conv(
        name="bit",
        build=_bit,
        features=(
            "group-norm",
            "weight-standardization",
            "pre-activation",
            "same-padding",
        ),
        description="BiT: pre-activation ResNetV2, group norm, standardized weights",
    ),
)
