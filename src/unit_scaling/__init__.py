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
    Conv1d,
    CrossEntropyLoss,
    DepthModuleList,
    DepthSequential,
    Dropout,
    Embedding,
    LayerNorm,
    Linear,
    LinearReadout,
    RMSNorm,
    SiLU,
    Softmax,
    TransformerDecoder,
    TransformerLayer,
    TransformerStack,
)
from .parameter import MupType, Parameter

__version__ = "0.1.0"

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
    "MupType",
    "Parameter",
    "RMSNorm",
    "SiLU",
    "Softmax",
    "TransformerDecoder",
    "TransformerLayer",
    "TransformerStack",
    "__version__",
    "constraints",
    "core",
    "functional",
    "optim",
    "scale",
    "transformer_residual_scaling_rule",
]
