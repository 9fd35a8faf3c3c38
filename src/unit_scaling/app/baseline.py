"""A standard-parametrisation (SP) decoder in plain torch, for comparisons.

The same architecture as :class:`unit_scaling.TransformerDecoder` — embedding,
pre-norm RMSNorm, fused-QKV causal attention through
``F.scaled_dot_product_attention``, SwiGLU MLP, RMSNorm, readout, cross-entropy —
written with plain ``torch.nn`` and initialised the way GPT-2/nanoGPT are
(``N(0, 0.02)``, residual output projections ``N(0, 0.02/sqrt(2·layers))``).
Benchmarks, the demo and the experiments use it as the baseline that u-μP is
measured against.
"""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["StandardTransformerDecoder"]


class _Layer(nn.Module):
    def __init__(self, hidden_size: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.linear_qkv = nn.Linear(hidden_size, 3 * hidden_size, bias=False)
        self.linear_o = nn.Linear(hidden_size, hidden_size, bias=False)
        self.linear_1 = nn.Linear(hidden_size, 4 * hidden_size, bias=False)
        self.linear_gate = nn.Linear(hidden_size, 4 * hidden_size, bias=False)
        self.linear_2 = nn.Linear(4 * hidden_size, hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        batch, seq, hidden = x.shape
        q, k, v = (
            self.linear_qkv(F.rms_norm(x, (hidden,)))
            .view(batch, seq, 3, self.heads, hidden // self.heads)
            .permute(2, 0, 3, 1, 4)
        )
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.linear_o(a.transpose(1, 2).reshape(batch, seq, hidden))
        y = F.rms_norm(x, (hidden,))
        out: Tensor = x + self.linear_2(self.linear_1(y) * F.silu(self.linear_gate(y)))
        return out


class StandardTransformerDecoder(nn.Module):
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
        super().__init__()
        if hidden_size % heads:
            raise ValueError(
                f"hidden_size={hidden_size} must be a multiple of heads={heads}"
            )
        self.embedding = nn.Embedding(vocab_size, hidden_size)
        self.layers = nn.Sequential(
            *(_Layer(hidden_size, heads) for _ in range(layers))
        )
        self.projection = nn.Linear(hidden_size, vocab_size, bias=False)
        for name, param in self.named_parameters():
            residual_out = name.endswith(("linear_o.weight", "linear_2.weight"))
            std = init_std / math.sqrt(2 * layers) if residual_out else init_std
            nn.init.normal_(param, std=std)

    def forward(self, input_ids: Tensor) -> Tensor:
        """Logits ``(..., seq, vocab_size)`` for token ids ``(..., seq)``."""
        x = self.layers(self.embedding(input_ids))
        logits: Tensor = self.projection(F.rms_norm(x, (x.shape[-1],)))
        return logits

    def loss(self, input_ids: Tensor) -> Tensor:
        """Mean next-token cross-entropy of ``input_ids`` ``(batch, seq + 1)``."""
        logits = self(input_ids[:, :-1])
        return F.cross_entropy(logits.flatten(end_dim=-2), input_ids[:, 1:].flatten())
