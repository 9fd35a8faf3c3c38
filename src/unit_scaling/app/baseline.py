"""A standard-parametrisation (SP) decoder in plain torch, for comparisons.

The same architecture as :class:`unit_scaling.TransformerDecoder` — embedding,
pre-norm RMSNorm, fused-QKV causal attention through
``F.scaled_dot_product_attention``, SwiGLU MLP, RMSNorm, readout, cross-entropy —
written with plain ``torch.nn`` (:class:`unit_scaling.export.PlainTransformerDecoder`,
the architecture a trained ``TransformerDecoder`` exports to) and initialised
the way GPT-2/nanoGPT are (``N(0, 0.02)``, residual output projections
``N(0, 0.02/sqrt(2·layers))``). Benchmarks, the demo and the experiments use it
as the baseline that u-μP is measured against.
"""

from __future__ import annotations

import math

from torch import nn

from ..export import PlainTransformerDecoder

__all__ = ["StandardTransformerDecoder"]


class StandardTransformerDecoder(PlainTransformerDecoder):
    """The u-μP decoder's architecture in plain torch, standard parametrisation.

    Args:
        hidden_size, vocab_size, layers, heads: as for
            :class:`unit_scaling.TransformerDecoder`.
        init_std: standard deviation of every weight at initialisation.

    Example::

        >>> model = StandardTransformerDecoder(64, 256, layers=2, heads=4)
        >>> model.loss(torch.randint(256, (2, 17))).shape
        torch.Size([])
    """

    def __init__(
        self,
        hidden_size: int,
        vocab_size: int,
        layers: int,
        heads: int,
        init_std: float = 0.02,
    ) -> None:
        super().__init__(hidden_size, vocab_size, layers, heads)
        for name, param in self.named_parameters():
            residual_out = name.endswith(("linear_o.weight", "linear_2.weight"))
            std = init_std / math.sqrt(2 * layers) if residual_out else init_std
            nn.init.normal_(param, std=std)
