"""Unit-scaled :mod:`torch.nn` modules; each holds parameters and calls one ``U.*``."""

from .activation import GELU, Dropout, SiLU, Softmax
from .depth import DepthModuleList, DepthSequential
from .linear import Conv1d, Linear, LinearReadout
from .loss import CrossEntropyLoss
from .normalization import LayerNorm, RMSNorm
from .sparse import Embedding
from .transformer import (
    MHSA,
    MLP,
    TransformerDecoder,
    TransformerLayer,
    TransformerStack,
)

__all__ = [
    "GELU",
    "MHSA",
    "MLP",
    "Conv1d",
    "CrossEntropyLoss",
    "DepthModuleList",
    "DepthSequential",
    "Dropout",
    "Embedding",
    "LayerNorm",
    "Linear",
    "LinearReadout",
    "RMSNorm",
    "SiLU",
    "Softmax",
    "TransformerDecoder",
    "TransformerLayer",
    "TransformerStack",
]
