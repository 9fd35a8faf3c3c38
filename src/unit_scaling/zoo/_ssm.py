"""State-space language models from Hugging Face configs (their torch paths).

The builders and inputs of the ``ssm`` rows of :mod:`._catalogue`.
"""

from __future__ import annotations

import functools
from typing import Any

from ._common import LAYERS, VOCAB, WIDTH, causal_lm, lm_inputs

# Without CUDA kernels, Mamba scans one step at a time in Python (and traced,
# with torch's associative_scan), so its sequences stay short.
_MAMBA_TOKENS = ((2, 8), (3, 12))
_MAMBA2_CHUNK = 8  # shorter than the sequences: the chunked scan crosses chunks
_HEAD_DIM = 16
_SSM: dict[str, Any] = dict(
    vocab_size=VOCAB,
    hidden_size=WIDTH,
    state_size=16,
    num_hidden_layers=LAYERS,
    use_cache=False,
)

mamba = causal_lm("MambaForCausalLM", _SSM)
mamba2 = causal_lm(
    "Mamba2ForCausalLM",
    _SSM,
    num_heads=2 * WIDTH // _HEAD_DIM,  # of the expanded width
    head_dim=_HEAD_DIM,
    n_groups=1,
    chunk_size=_MAMBA2_CHUNK,
    pad_token_id=0,
    bos_token_id=0,
    eos_token_id=0,
)

mamba_inputs = functools.partial(lm_inputs, sizes=_MAMBA_TOKENS)
