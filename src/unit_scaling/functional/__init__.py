"""Unit-scaled versions of :mod:`torch.nn.functional` and :mod:`torch` ops.

Each function mirrors its torch counterpart's signature (extra keyword arguments
such as ``constraint`` and ``mult`` come last) and, given unit-normal inputs and a
unit-normal output gradient, returns an output and input gradients of RMS ≈ 1.
A torch argument that a function cannot honour raises ``ValueError`` when given a
non-default value.

Conventionally imported as ``import unit_scaling.functional as U``.
"""

from ._torch_map import torch_map
from .activations import dropout, gelu, relu, sigmoid, silu, silu_glu, softmax, tanh
from .attention import scaled_dot_product_attention
from .conv import conv1d, conv2d
from .linear import bmm, einsum, linear, linear_readout, matmul
from .losses import cross_entropy, mse_loss
from .normalization import group_norm, layer_norm, rms_norm
from .reductions import mean, sum
from .residual import add, residual_add, residual_apply, residual_split
from .sparse import embedding

__all__ = [
    "add",
    "bmm",
    "conv1d",
    "conv2d",
    "cross_entropy",
    "dropout",
    "einsum",
    "embedding",
    "gelu",
    "group_norm",
    "layer_norm",
    "linear",
    "linear_readout",
    "matmul",
    "mean",
    "mse_loss",
    "relu",
    "residual_add",
    "residual_apply",
    "residual_split",
    "rms_norm",
    "scaled_dot_product_attention",
    "sigmoid",
    "silu",
    "silu_glu",
    "softmax",
    "sum",
    "tanh",
    "torch_map",
]
