"""Causal language models: Hugging Face decoders and a nanoGPT written here."""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._common import (
    HEADS,
    LAYERS,
    MAX_POSITIONS,
    TRANSFORMERS,
    VOCAB,
    WIDTH,
    first,
    language_model,
    lm_inputs,
    logits,
)
from ._model import Inputs, ZooModel

__all__ = ["MODELS", "NanoGPT"]

# Shared by the configs of Llama-like decoders (and others that name sizes alike).
_LLAMA_LIKE: dict[str, Any] = dict(
    vocab_size=VOCAB,
    use_cache=False,
    hidden_size=WIDTH,
    intermediate_size=2 * WIDTH,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    max_position_embeddings=MAX_POSITIONS,
)


def _gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=MAX_POSITIONS,
        n_embd=WIDTH,
        n_layer=LAYERS,
        n_head=HEADS,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
    )
    return language_model(GPT2LMHeadModel(config))


def _llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**_LLAMA_LIKE, num_key_value_heads=HEADS // 2)
    return language_model(LlamaForCausalLM(config))


def _gpt_neox() -> nn.Module:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    config = GPTNeoXConfig(
        **_LLAMA_LIKE,
        use_parallel_residual=True,
        rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.25},
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    return language_model(GPTNeoXForCausalLM(config))


def _gptj() -> nn.Module:
    from transformers import GPTJConfig, GPTJForCausalLM

    config = GPTJConfig(
        vocab_size=VOCAB,
        n_positions=MAX_POSITIONS,
        n_embd=WIDTH,
        n_layer=LAYERS,
        n_head=HEADS,
        rotary_dim=8,  # of a head dimension of 16
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
    )
    return language_model(GPTJForCausalLM(config))


def _bloom() -> nn.Module:
    from transformers import BloomConfig, BloomForCausalLM

    config = BloomConfig(
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        n_layer=LAYERS,
        n_head=HEADS,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cache=False,
    )
    return language_model(BloomForCausalLM(config))


def _gemma2() -> nn.Module:
    from transformers import Gemma2Config, Gemma2ForCausalLM

    # Soft-capping needs eager attention, which Hugging Face picks itself.
    config = Gemma2Config(
        **_LLAMA_LIKE,
        num_key_value_heads=HEADS // 2,
        head_dim=WIDTH // HEADS,
        query_pre_attn_scalar=WIDTH // HEADS,
        sliding_window=8,  # shorter than the sequence, so the window masks
    )
    return language_model(Gemma2ForCausalLM(config))


def _phi() -> nn.Module:
    from transformers import PhiConfig, PhiForCausalLM

    config = PhiConfig(
        **_LLAMA_LIKE,
        rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.5},
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attention_dropout=0.0,
    )
    return language_model(PhiForCausalLM(config))


def _qwen2() -> nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**_LLAMA_LIKE, num_key_value_heads=HEADS // 2)
    return language_model(Qwen2ForCausalLM(config))


def _qwen3() -> nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        **_LLAMA_LIKE, num_key_value_heads=HEADS // 2, head_dim=WIDTH // HEADS
    )
    return language_model(Qwen3ForCausalLM(config))


def _mistral() -> nn.Module:
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        **_LLAMA_LIKE, num_key_value_heads=HEADS // 2, sliding_window=8
    )
    return language_model(MistralForCausalLM(config))


def _opt() -> nn.Module:
    from transformers import OPTConfig, OPTForCausalLM

    config = OPTConfig(
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        num_hidden_layers=LAYERS,
        ffn_dim=2 * WIDTH,
        num_attention_heads=HEADS,
        max_position_embeddings=MAX_POSITIONS,
        word_embed_proj_dim=WIDTH,
        dropout=0.0,
        attention_dropout=0.0,
        use_cache=False,
    )
    return language_model(OPTForCausalLM(config))


def _falcon() -> nn.Module:
    from transformers import FalconConfig, FalconForCausalLM

    config = FalconConfig(
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        multi_query=True,
        parallel_attn=True,
        alibi=True,
        bias=True,
        ffn_hidden_size=4 * WIDTH,
        max_position_embeddings=MAX_POSITIONS,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cache=False,
    )
    return language_model(FalconForCausalLM(config))


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


def _positional_ids(seed: int, variant: int) -> Inputs:
    _, kwargs = lm_inputs(seed, variant)
    return (kwargs["input_ids"],), {}


_decoder = functools.partial(
    ZooModel, family="decoder", inputs=lm_inputs, output=logits, requires=TRANSFORMERS
)

MODELS = (
    _decoder(
        name="gpt2",
        build=_gpt2,
        features=(
            "learned-positions",
            "conv1d-linear",
            "fused-qkv",
            "gelu-tanh",
            "tied-lm-head",
        ),
        description="GPT-2: pre-norm, learned positions, Conv1D projections",
    ),
    _decoder(
        name="llama",
        build=_llama,
        features=("rotary", "gqa", "rms-norm", "swiglu"),
        description="Llama: RMSNorm, rotary, SwiGLU, grouped-query attention",
    ),
    _decoder(
        name="gpt-neox",
        build=_gpt_neox,
        features=("parallel-residual", "partial-rotary", "fused-qkv"),
        description="GPT-NeoX / Pythia: parallel attention and MLP, quarter rotary",
    ),
    _decoder(
        name="gptj",
        build=_gptj,
        features=(
            "parallel-residual",
            "partial-rotary",
            "interleaved-rotary",
            "eager-attention",
        ),
        description="GPT-J: parallel attention and MLP after one LayerNorm",
    ),
    _decoder(
        name="bloom",
        build=_bloom,
        features=("alibi", "fused-qkv", "embedding-layernorm", "tied-lm-head"),
        description="BLOOM: ALiBi position biases, LayerNorm on the embedding",
    ),
    _decoder(
        name="gemma2",
        build=_gemma2,
        features=(
            "softcap",
            "sandwich-norm",
            "gqa",
            "sliding-window",
            "rms-norm",
            "geglu",
            "scaled-embedding",
            "eager-attention",
        ),
        description="Gemma 2: logit soft-capping, sandwich norms, local/global layers",
    ),
    _decoder(
        name="phi",
        build=_phi,
        features=("parallel-residual", "partial-rotary", "biased-qkv", "lm-head-bias"),
        description="Phi-1/2: parallel residual, rotary on half, biased projections",
    ),
    _decoder(
        name="qwen2",
        build=_qwen2,
        features=("biased-qkv", "gqa", "rotary", "rms-norm", "swiglu"),
        description="Qwen2: Llama with biased QKV projections",
    ),
    _decoder(
        name="qwen3",
        build=_qwen3,
        features=("qk-norm", "gqa", "rotary", "rms-norm", "swiglu"),
        description="Qwen3: Llama with RMSNorm on queries and keys",
    ),
    _decoder(
        name="mistral",
        build=_mistral,
        features=("sliding-window", "gqa", "rotary", "rms-norm", "swiglu"),
        description="Mistral: Llama with sliding-window attention",
    ),
    _decoder(
        name="opt",
        build=_opt,
        features=("learned-positions", "position-offset", "relu"),
        description="OPT: learned positions (offset by 2), ReLU MLP",
    ),
    _decoder(
        name="falcon",
        build=_falcon,
        features=("multi-query", "parallel-residual", "alibi"),
        description="Falcon-7B style: multi-query attention, parallel residual, ALiBi",
    ),
    ZooModel(
        "nanogpt",
        "decoder",
        NanoGPT,
        _positional_ids,
        first,
        features=("learned-positions", "tied-lm-head", "user-code", "tuple-output"),
        description="nanoGPT: user code calling F.scaled_dot_product_attention",
    ),
)
