"""Mixture-of-experts language models from Hugging Face configs.

The builders and inputs of the ``moe`` rows of :mod:`._catalogue`.
"""

from __future__ import annotations

from typing import Any

from ._common import GQA, T5_LIKE, WIDTH, causal_lm, conditional_generation

_EXPERTS = 4
_MOE_LM: dict[str, Any] = dict(GQA, num_experts_per_tok=2)

mixtral = causal_lm("MixtralForCausalLM", _MOE_LM, num_local_experts=_EXPERTS)
qwen2_moe = causal_lm(
    "Qwen2MoeForCausalLM",
    _MOE_LM,
    moe_intermediate_size=WIDTH,
    shared_expert_intermediate_size=2 * WIDTH,
    num_experts=_EXPERTS,
)
olmoe = causal_lm(
    "OlmoeForCausalLM",
    _MOE_LM,
    intermediate_size=WIDTH,
    num_experts=2 * _EXPERTS,
    eos_token_id=0,
)
switch_transformers = conditional_generation(
    "SwitchTransformersForConditionalGeneration",
    T5_LIKE,
    num_sparse_encoder_layers=1,
    num_sparse_decoder_layers=1,
    num_experts=_EXPERTS,
    expert_capacity=16,  # fewer than the tokens routed: some overflow
    router_jitter_noise=0.0,  # multiplicative noise from the global RNG
)
