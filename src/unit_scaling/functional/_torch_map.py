"""``torch_map``: each torch function with a unit-scaled equivalent, mapped to it.

The ``unit_scale`` transform traces a model with TorchDynamo and replaces every
``call_function`` node whose target is a key here. The keys are therefore the
objects Dynamo records, which are not always the ones user code calls: Dynamo
records ``F.rms_norm`` as ``torch.rms_norm``, and ``x @ w`` as ``operator.matmul``
(``tests/functional/test_torch_map.py`` checks every key against a real trace).
Tensor methods (``x.softmax(-1)``) are recorded as ``call_method`` nodes, not
functions, and are not covered by this map.

``torch.sum`` and ``torch.mean`` are deliberately absent: real models call them
inside hand-written RMSNorm/LayerNorm and losses, where replacing them with unit-
scaled reductions would change what the model computes. Use ``U.sum``/``U.mean``
explicitly where a unit-scaled reduction is wanted.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from .activation import dropout, gelu, relu, sigmoid, silu, softmax, tanh
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
from .linear import bmm, einsum, linear, matmul
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
from .residual import add
from .routing import gather, index_add, index_select, scatter_add
from .sparse import embedding

__all__ = ["torch_map"]

torch_map: dict[Callable[..., Any], Callable[..., Any]] = {
    # matrix products
    F.linear: linear,
    torch.matmul: matmul,
    operator.matmul: matmul,
    torch.bmm: bmm,
    torch.einsum: einsum,
    **{
        op: grouped_mm
        for op in (getattr(F, "grouped_mm", None), getattr(torch, "_grouped_mm", None))
        if op is not None
    },
    F.conv1d: conv1d,
    F.conv2d: conv2d,
    F.conv3d: conv3d,
    F.conv_transpose1d: conv_transpose1d,
    F.conv_transpose2d: conv_transpose2d,
    F.conv_transpose3d: conv_transpose3d,
    # activations
    F.gelu: gelu,
    F.silu: silu,
    F.relu: relu,
    torch.relu: relu,
    F.tanh: tanh,
    torch.tanh: tanh,
    F.sigmoid: sigmoid,
    torch.sigmoid: sigmoid,
    F.softmax: softmax,
    torch.softmax: softmax,
    F.dropout: dropout,
    F.scaled_dot_product_attention: scaled_dot_product_attention,
    # normalisation and lookups
    F.layer_norm: layer_norm,
    F.rms_norm: rms_norm,
    torch.rms_norm: rms_norm,
    F.group_norm: group_norm,
    F.batch_norm: batch_norm,
    F.instance_norm: instance_norm,
    F.embedding: embedding,
    # pooling and resampling (F.max_pool* and F.adaptive_max_pool* are torch's
    # return_indices dispatchers, which Dynamo records as they are)
    F.avg_pool1d: avg_pool1d,
    F.avg_pool2d: avg_pool2d,
    F.avg_pool3d: avg_pool3d,
    F.max_pool1d: max_pool1d,
    F.max_pool2d: max_pool2d,
    F.max_pool3d: max_pool3d,
    F.adaptive_avg_pool1d: adaptive_avg_pool1d,
    F.adaptive_avg_pool2d: adaptive_avg_pool2d,
    F.adaptive_avg_pool3d: adaptive_avg_pool3d,
    F.adaptive_max_pool1d: adaptive_max_pool1d,
    F.adaptive_max_pool2d: adaptive_max_pool2d,
    F.adaptive_max_pool3d: adaptive_max_pool3d,
    F.interpolate: interpolate,
    # routing (mixture-of-experts dispatch and combination)
    torch.index_add: index_add,
    torch.scatter_add: scatter_add,
    torch.gather: gather,
    torch.index_select: index_select,
    # losses
    F.cross_entropy: cross_entropy,
    F.mse_loss: mse_loss,
    # additions (``x + y`` is ``operator.add``, which the transform handles itself
    # because it must first tell residual adds from plain ones)
    torch.add: add,
}
"""Each torch function (and ``Tensor`` method, by name) that has a unit-scaled
equivalent, mapped to that equivalent: what ``unit_scale`` replaces."""
