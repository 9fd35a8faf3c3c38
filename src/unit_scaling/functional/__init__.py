"""Unit-scaled versions of :mod:`torch.nn.functional` and :mod:`torch` ops.

Each function mirrors its torch counterpart's signature (extra keyword arguments
such as ``constraint`` and ``mult`` come last) and, given unit-normal inputs and a
unit-normal output gradient, returns an output and input gradients of RMS ≈ 1.
A torch argument that a function cannot honour raises ``ValueError`` when given a
non-default value.

Conventionally imported as ``import unit_scaling.functional as U``.
"""

from ._torch_map import torch_map
from .activation import dropout, gelu, relu, sigmoid, silu, silu_glu, softmax, tanh
from .adaptive_pooling import (
    adaptive_avg_pool1d,
    adaptive_avg_pool2d,
    adaptive_avg_pool3d,
    adaptive_max_pool1d,
    adaptive_max_pool2d,
    adaptive_max_pool3d,
)
from .attention import scaled_dot_product_attention
from .conv import conv1d, conv2d, conv3d
from .conv_transpose import conv_transpose1d, conv_transpose2d, conv_transpose3d
from .grouped import grouped_mm
from .interpolation import interpolate
from .linear import bmm, einsum, linear, linear_readout, matmul
from .losses import cross_entropy, mse_loss
from .normalization import batch_norm, group_norm, instance_norm, layer_norm, rms_norm
from .pooling import (
    avg_pool1d,
    avg_pool2d,
    avg_pool3d,
    max_pool1d,
    max_pool2d,
    max_pool3d,
)
from .reductions import mean, sum
from .residual import add, residual_add, residual_apply, residual_split
from .routing import gather, index_add, index_select, scatter_add
from .softcap import softcap
from .sparse import embedding

__all__ = [
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "adaptive_avg_pool3d",
    "adaptive_max_pool1d",
    "adaptive_max_pool2d",
    "adaptive_max_pool3d",
    "add",
    "avg_pool1d",
    "avg_pool2d",
    "avg_pool3d",
    "batch_norm",
    "bmm",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "cross_entropy",
    "dropout",
    "einsum",
    "embedding",
    "gather",
    "gelu",
    "group_norm",
    "grouped_mm",
    "index_add",
    "index_select",
    "instance_norm",
    "interpolate",
    "layer_norm",
    "linear",
    "linear_readout",
    "matmul",
    "max_pool1d",
    "max_pool2d",
    "max_pool3d",
    "mean",
    "mse_loss",
    "relu",
    "residual_add",
    "residual_apply",
    "residual_split",
    "rms_norm",
    "scaled_dot_product_attention",
    "scatter_add",
    "sigmoid",
    "silu",
    "silu_glu",
    "softcap",
    "softmax",
    "sum",
    "tanh",
    "torch_map",
]
