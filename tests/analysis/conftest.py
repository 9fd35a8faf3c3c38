"""Shared models and scales graphs for the analysis tests.

``NanoGPT`` is a GPT-2-style decoder written the nanoGPT way (learned positions,
pre-LayerNorm, fused QKV, GELU MLP, tied-free readout), small enough that tracking
it takes about a second.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # before pyplot is imported anywhere

import matplotlib.pyplot as plt
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.fx import Graph

import unit_scaling.functional as U
from unit_scaling.analysis import example_batch, scales_graph
from unit_scaling.transforms import unit_scale


class _Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width)
        self.c_attn = nn.Linear(width, 3 * width)
        self.attn_proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width)
        self.c_fc = nn.Linear(width, 4 * width)
        self.mlp_proj = nn.Linear(4 * width, width)

    def forward(self, x: Tensor) -> Tensor:
        batch, seq, width = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(width, dim=2)
        q, k, v = (
            t.view(batch, seq, self.heads, width // self.heads).transpose(1, 2)
            for t in (q, k, v)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(batch, seq, width))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class NanoGPT(nn.Module):
    """A tiny GPT-2-style language model: ``forward(idx) -> logits``."""

    def __init__(
        self, width: int = 32, layers: int = 2, heads: int = 2, block_size: int = 64
    ) -> None:
        super().__init__()
        self.wte = nn.Embedding(256, width)
        self.wpe = nn.Embedding(block_size, width)
        self.h = nn.ModuleList(_Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, 256, bias=False)
        for name, p in self.named_parameters():
            if name.endswith("weight") and p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx: Tensor) -> Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(positions)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


@pytest.fixture(scope="session")
def batch() -> Tensor:
    return example_batch(batch_size=2, seq_len=16)


@pytest.fixture(scope="session")
def plain_graph(batch: Tensor) -> Graph:
    torch.manual_seed(0)
    return scales_graph(NanoGPT(), batch)


def unit_scaled_loss(model: nn.Module, batch: Tensor) -> Tensor:
    """Next-token loss with the unit-scaled cross-entropy (unit logit gradients)."""
    logits = model(batch[:, :-1])
    return U.cross_entropy(logits.flatten(end_dim=-2), batch[:, 1:].flatten())


@pytest.fixture(scope="session")
def unit_scaled_graph(batch: Tensor) -> Graph:
    torch.manual_seed(0)
    return scales_graph(unit_scale(NanoGPT()), batch, loss_fn=unit_scaled_loss)


@pytest.fixture(autouse=True)
def _close_figures() -> object:
    yield
    plt.close("all")
