"""Unit scaling and u-μP for PyTorch.

Every activation, weight and gradient at RMS ≈ 1 at initialisation, learning rates
that transfer across width and depth, and tools to see and simulate low-precision
numerics. Conventionally imported as ``import unit_scaling as uu``.

Example::

    >>> import unit_scaling as uu
    >>> model = uu.TransformerDecoder(hidden_size=64, vocab_size=256, layers=2, heads=4)
    >>> opt = uu.optim.AdamW(model.parameters(), lr=2**-4)
"""

from . import constraints, core, functional, optim, scale
from .core.functional import transformer_residual_scaling_rule
from .modules import (
    GELU,
    MHSA,
    MLP,
    AdaptiveAvgPool1d,
    AdaptiveAvgPool2d,
    AdaptiveAvgPool3d,
    AdaptiveMaxPool1d,
    AdaptiveMaxPool2d,
    AdaptiveMaxPool3d,
    AvgPool1d,
    AvgPool2d,
    AvgPool3d,
    BatchNorm1d,
    BatchNorm2d,
    BatchNorm3d,
    Conv1d,
    Conv2d,
    Conv3d,
    ConvTranspose1d,
    ConvTranspose2d,
    ConvTranspose3d,
    CrossEntropyLoss,
    DepthModuleList,
    DepthSequential,
    Dropout,
    Embedding,
    GroupNorm,
    InstanceNorm1d,
    InstanceNorm2d,
    InstanceNorm3d,
    LayerNorm,
    Linear,
    LinearReadout,
    MaxPool1d,
    MaxPool2d,
    MaxPool3d,
    RMSNorm,
    SiLU,
    Softmax,
    TransformerDecoder,
    TransformerLayer,
    TransformerStack,
    Upsample,
)
from .parameter import MupType, Parameter

__version__ = "0.1.0"

__all__ = [
    "GELU",
    "MHSA",
    "MLP",
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "AdaptiveAvgPool3d",
    "AdaptiveMaxPool1d",
    "AdaptiveMaxPool2d",
    "AdaptiveMaxPool3d",
    "AvgPool1d",
    "AvgPool2d",
    "AvgPool3d",
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNorm3d",
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "ConvTranspose3d",
    "CrossEntropyLoss",
    "DepthModuleList",
    "DepthSequential",
    "Dropout",
    "Embedding",
    "GroupNorm",
    "InstanceNorm1d",
    "InstanceNorm2d",
    "InstanceNorm3d",
    "LayerNorm",
    "Linear",
    "LinearReadout",
    "MaxPool1d",
    "MaxPool2d",
    "MaxPool3d",
    "MupType",
    "Parameter",
    "RMSNorm",
    "SiLU",
    "Softmax",
    "TransformerDecoder",
    "TransformerLayer",
    "TransformerStack",
    "Upsample",
    "__version__",
    "constraints",
    "core",
    "functional",
    "optim",
    "scale",
    "transformer_residual_scaling_rule",
]
