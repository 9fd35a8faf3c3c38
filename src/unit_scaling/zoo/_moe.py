"""Mixture-of-experts language models from Hugging Face configs."""

from __future__ import annotations

from typing import Any

from torch import nn

from ._common import (
    HEADS,
    LAYERS,
    MAX_POSITIONS,
    TRANSFORMERS,
    VOCAB,
    WIDTH,
    language_model,
    lm_inputs,
    logits,
    seq2seq_inputs,
)
from ._model import ZooModel

__all__ = ["MODELS"]

_EXPERTS = 4
_MOE_LM: dict[str, Any] = dict(
    vocab_size=VOCAB,
    use_cache=False,
    hidden_size=WIDTH,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    num_key_value_heads=HEADS // 2,
    max_position_embeddings=MAX_POSITIONS,
    num_experts_per_tok=2,
)


def _mixtral() -> nn.Module:
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(
        **_MOE_LM, intermediate_size=2 * WIDTH, num_local_experts=_EXPERTS
    )
    return language_model(MixtralForCausalLM(config))


def _qwen2_moe() -> nn.Module:
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    config = Qwen2MoeConfig(
        **_MOE_LM,
        intermediate_size=2 * WIDTH,
        moe_intermediate_size=WIDTH,
        shared_expert_intermediate_size=2 * WIDTH,
        num_experts=_EXPERTS,
    )
    return language_model(Qwen2MoeForCausalLM(config))


def _olmoe() -> nn.Module:
    from transformers import OlmoeConfig, OlmoeForCausalLM

    config = OlmoeConfig(
        **_MOE_LM, intermediate_size=WIDTH, num_experts=2 * _EXPERTS, eos_token_id=0
    )
    return language_model(OlmoeForCausalLM(config))


def _switch_transformers() -> nn.Module:
    from transformers import (
        SwitchTransformersConfig,
        SwitchTransformersForConditionalGeneration,
    )

    config = SwitchTransformersConfig(
        vocab_size=VOCAB,
        d_model=WIDTH,
        d_kv=WIDTH // HEADS,
        d_ff=2 * WIDTH,
        num_layers=LAYERS,
        num_decoder_layers=LAYERS,
        num_sparse_encoder_layers=1,
        num_sparse_decoder_layers=1,
        num_heads=HEADS,
        num_experts=_EXPERTS,
        expert_capacity=16,  # fewer than the tokens routed: some overflow
        router_jitter_noise=0.0,  # multiplicative noise from the global RNG
        relative_attention_num_buckets=8,
        relative_attention_max_distance=32,
        dropout_rate=0.0,
        use_cache=False,
    )
    model = SwitchTransformersForConditionalGeneration(config)
    return language_model(model, "ForConditionalGeneration")


MODELS = (
    ZooModel(
        "mixtral",
        "moe",
        _mixtral,
        lm_inputs,
        logits,
        features=("top-k-routing", "gqa", "rotary", "rms-norm", "swiglu"),
        requires=TRANSFORMERS,
        description="Mixtral: top-2 of 4 SwiGLU experts after Mistral attention",
    ),
    ZooModel(
        "qwen2-moe",
        "moe",
        _qwen2_moe,
        lm_inputs,
        logits,
        features=("top-k-routing", "shared-expert", "gqa", "biased-qkv"),
        requires=TRANSFORMERS,
        description="Qwen2-MoE: routed experts plus a gated shared expert",
    ),
    ZooModel(
        "olmoe",
        "moe",
        _olmoe,
        lm_inputs,
        logits,
        features=("top-k-routing", "qk-norm", "gqa"),
        requires=TRANSFORMERS,
        description="OLMoE: top-2 of 8 experts, RMSNorm on queries and keys",
    ),
    ZooModel(
        "switch-transformers",
        "moe",
        _switch_transformers,
        seq2seq_inputs,
        logits,
        features=(
            "top-1-routing",
            "expert-capacity",
            "cross-attention",
            "relative-position-bias",
            "padding-mask",
        ),
        requires=TRANSFORMERS,
        # Routing by capacity breaks the graph at each expert (20 breaks), so a
        # torch.compile of both variants takes over a minute.
        slow=True,
        description="Switch Transformer: T5 encoder-decoder with top-1 expert layers",
    ),
)
