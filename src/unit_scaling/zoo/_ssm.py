"""State-space language models from Hugging Face configs (their torch paths)."""

from __future__ import annotations

from torch import nn

from ._common import (
    LAYERS,
    TRANSFORMERS,
    VOCAB,
    WIDTH,
    generator,
    language_model,
    lm_inputs,
    logits,
    token_ids,
)
from ._model import Inputs, ZooModel

__all__ = ["MODELS"]

# Without CUDA kernels, Mamba scans one step at a time in Python (and traced,
# with torch's associative_scan), so its sequences stay short.
_MAMBA_TOKENS = ((2, 8), (3, 12))
_MAMBA2_CHUNK = 8  # shorter than the sequences: the chunked scan crosses chunks
_STATE = 16
_HEAD_DIM = 16


def _mamba() -> nn.Module:
    from transformers import MambaConfig, MambaForCausalLM

    config = MambaConfig(
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        state_size=_STATE,
        num_hidden_layers=LAYERS,
        use_cache=False,
    )
    return language_model(MambaForCausalLM(config))


def _mamba2() -> nn.Module:
    from transformers import Mamba2Config, Mamba2ForCausalLM

    config = Mamba2Config(
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        num_heads=2 * WIDTH // _HEAD_DIM,  # of the expanded width
        head_dim=_HEAD_DIM,
        state_size=_STATE,
        n_groups=1,
        num_hidden_layers=LAYERS,
        chunk_size=_MAMBA2_CHUNK,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
    )
    return language_model(Mamba2ForCausalLM(config))


def _mamba_inputs(seed: int, variant: int) -> Inputs:
    return (), {"input_ids": token_ids(generator(seed), *_MAMBA_TOKENS[variant])}


MODELS = (
    ZooModel(
        "mamba",
        "ssm",
        _mamba,
        _mamba_inputs,
        logits,
        features=("selective-scan", "causal-conv1d", "gated-mlp", "rms-norm"),
        requires=TRANSFORMERS,
        slow=True,
        description="Mamba: selective state-space scan, sequential on CPU",
    ),
    ZooModel(
        "mamba2",
        "ssm",
        _mamba2,
        lm_inputs,
        logits,
        features=("chunked-scan", "causal-conv1d", "gated-rms-norm", "multi-head-ssm"),
        requires=TRANSFORMERS,
        description="Mamba-2: state-space duality, scanned chunk by chunk in torch",
    ),
)
