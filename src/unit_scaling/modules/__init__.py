"""Unit-scaled :mod:`torch.nn` modules; each holds parameters and calls one ``U.*``."""

from .activation import GELU, Dropout, SiLU, Softmax
from .conv import (
    Conv1d,
    Conv2d,
    Conv3d,
    ConvTranspose1d,
    ConvTranspose2d,
    ConvTranspose3d,
)
from .depth import DepthModuleList, DepthSequential
from .linear import Linear, LinearReadout
from .loss import CrossEntropyLoss
from .normalization import (
    BatchNorm1d,
    BatchNorm2d,
    BatchNorm3d,
    GroupNorm,
    InstanceNorm1d,
    InstanceNorm2d,
    InstanceNorm3d,
    LayerNorm,
    RMSNorm,
)
from .pooling import (
    AdaptiveAvgPool1d,
    AdaptiveAvgPool2d,
    AdaptiveAvgPool3d,
    AdaptiveMaxPool1d,
    AdaptiveMaxPool2d,
    AdaptiveMaxPool3d,
    AvgPool1d,
    AvgPool2d,
    AvgPool3d,
    MaxPool1d,
    MaxPool2d,
    MaxPool3d,
)
from .sparse import Embedding
from .transformer import (
    MHSA,
    MLP,
    TransformerDecoder,
    TransformerLayer,
    TransformerStack,
)
from .upsampling import Upsample

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
    "RMSNorm",
    "SiLU",
    "Softmax",
    "TransformerDecoder",
    "TransformerLayer",
    "TransformerStack",
    "Upsample",
]
