"""Bidirectional text encoders from Hugging Face configs, fed padded batches.

The builders and inputs of the ``encoder`` rows of :mod:`._catalogue`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ._common import (
    BERT_DROPOUT,
    MAX_POSITIONS,
    TEXT_TRUNK,
    TOKENS,
    WIDTH,
    generator,
    hf,
    padding_mask,
    token_ids,
)
from ._model import Inputs

_BERT_LIKE: dict[str, Any] = dict(
    TEXT_TRUNK, **BERT_DROPOUT, intermediate_size=2 * WIDTH
)

# DeBERTa-v3 attends content-to-position and position-to-content over
# log-bucketed relative positions with keys shared between the two; the config
# class reads these options without declaring them.
_DEBERTA_V3: dict[str, Any] = dict(
    position_buckets=16, share_att_key=True, norm_rel_ebd="layer_norm"
)

bert = hf("BertModel", _BERT_LIKE, pooler=False)
# Positions count from pad_token_id + 1, past the padding index.
roberta = hf(
    "RobertaModel", _BERT_LIKE, max_position_embeddings=MAX_POSITIONS + 2, pooler=False
)
distilbert = hf(
    "DistilBertModel",
    TEXT_TRUNK,
    hidden_dim=2 * WIDTH,
    dropout=0.0,
    attention_dropout=0.0,
)
deberta_v2 = hf(
    "DebertaV2Model",
    _BERT_LIKE,
    _DEBERTA_V3,
    relative_attention=True,
    pos_att_type=["p2c", "c2p"],
    position_biased_input=False,
    type_vocab_size=0,
)


def padded_inputs(pad_token_id: int, token_types: bool) -> Callable[[int, int], Inputs]:
    """Token ids whose padding holds ``pad_token_id``, the attention mask and, if
    ``token_types``, segment ids (the second half of each sequence is segment 1)."""

    def inputs(seed: int, variant: int) -> Inputs:
        batch, seq = TOKENS[variant]
        mask = padding_mask(batch, seq)
        ids = token_ids(generator(seed), batch, seq).masked_fill(
            mask == 0, pad_token_id
        )
        kwargs = {"input_ids": ids, "attention_mask": mask}
        if token_types:
            types = torch.zeros(batch, seq, dtype=torch.long)
            types[:, seq // 2 :] = 1
            kwargs["token_type_ids"] = types
        return (), kwargs

    return inputs
