"""Causal language models: Hugging Face decoders and a nanoGPT written here.

The builders and inputs of the ``decoder`` rows of :mod:`._catalogue`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._common import (
    DECODER,
    GQA,
    HEADS,
    LAYERS,
    LLAMA_LIKE,
    MAX_POSITIONS,
    TRUNK,
    VOCAB,
    WIDTH,
    causal_lm,
    lm_inputs,
)
from ._model import Inputs

_GPT2_LIKE: dict[str, Any] = dict(
    DECODER,
    resid_pdrop=0.0,
    embd_pdrop=0.0,
    attn_pdrop=0.0,
    bos_token_id=0,
    eos_token_id=0,
)

gpt2 = causal_lm("GPT2LMHeadModel", _GPT2_LIKE)
llama = causal_lm("LlamaForCausalLM", GQA)
gpt_neox = causal_lm(
    "GPTNeoXForCausalLM",
    LLAMA_LIKE,
    use_parallel_residual=True,
    rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.25},
    hidden_dropout=0.0,
    attention_dropout=0.0,
)
gptj = causal_lm("GPTJForCausalLM", _GPT2_LIKE, rotary_dim=8)  # of head_dim 16
bloom = causal_lm(  # ALiBi: no position embeddings
    "BloomForCausalLM",
    TRUNK,
    vocab_size=VOCAB,
    hidden_dropout=0.0,
    attention_dropout=0.0,
    use_cache=False,
)
# Soft-capping needs eager attention, which Hugging Face picks itself.
gemma2 = causal_lm(
    "Gemma2ForCausalLM",
    GQA,
    head_dim=WIDTH // HEADS,
    query_pre_attn_scalar=WIDTH // HEADS,
    sliding_window=8,  # shorter than the sequence, so the window masks
)
phi = causal_lm(
    "PhiForCausalLM",
    LLAMA_LIKE,
    rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.5},
    resid_pdrop=0.0,
    embd_pdrop=0.0,
    attention_dropout=0.0,
)
qwen2 = causal_lm("Qwen2ForCausalLM", GQA)
qwen3 = causal_lm("Qwen3ForCausalLM", GQA, head_dim=WIDTH // HEADS)
mistral = causal_lm("MistralForCausalLM", GQA, sliding_window=8)
opt = causal_lm(
    "OPTForCausalLM",
    DECODER,
    ffn_dim=2 * WIDTH,
    word_embed_proj_dim=WIDTH,
    dropout=0.0,
    attention_dropout=0.0,
)
falcon = causal_lm(
    "FalconForCausalLM",
    DECODER,
    multi_query=True,
    parallel_attn=True,
    alibi=True,
    bias=True,
    ffn_hidden_size=4 * WIDTH,
    hidden_dropout=0.0,
    attention_dropout=0.0,
)


class _CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        batch, seq, width = x.shape
        q, k, v = self.c_attn(x).split(width, dim=2)
        q, k, v = (
            t.view(batch, seq, self.heads, width // self.heads).transpose(1, 2)
            for t in (q, k, v)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out: Tensor = self.c_proj(
            y.transpose(1, 2).contiguous().view(batch, seq, width)
        )
        return out


class _Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = _CausalSelfAttention(width, heads)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class NanoGPT(nn.Module):
    """A nanoGPT-style causal transformer: learned positions, pre-norm blocks,
    ``F.scaled_dot_product_attention(is_causal=True)``, LM head tied to the token
    embedding. Returns ``(logits, loss)``, the loss ``None`` without targets."""

    def __init__(
        self,
        vocab: int = VOCAB,
        width: int = WIDTH,
        heads: int = HEADS,
        layers: int = LAYERS,
        max_seq: int = MAX_POSITIONS,
    ) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(max_seq, width)
        self.h = nn.ModuleList(_Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if name.endswith("weight") and p.dim() == 2:
                nn.init.normal_(p, std=0.02)
            elif name.endswith("bias"):
                nn.init.normal_(p, std=0.02)  # nonzero, so dropping one shows

    def forward(
        self, idx: Tensor, targets: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(positions)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss


def positional_ids(seed: int, variant: int) -> Inputs:
    """:func:`lm_inputs`' token ids, as the one positional argument."""
    _, kwargs = lm_inputs(seed, variant)
    return (kwargs["input_ids"],), {}
