"""Bidirectional text encoders from Hugging Face configs, fed padded batches."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ._common import (
    HEADS,
    LAYERS,
    MAX_POSITIONS,
    TOKENS,
    TRANSFORMERS,
    VOCAB,
    WIDTH,
    generator,
    last_hidden_state,
    noisy_biases,
    padding_mask,
    token_ids,
)
from ._model import Inputs, ZooModel

__all__ = ["MODELS"]

_BERT_LIKE: dict[str, Any] = dict(
    vocab_size=VOCAB,
    hidden_size=WIDTH,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    intermediate_size=2 * WIDTH,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)

# DeBERTa-v3 attends content-to-position and position-to-content over
# log-bucketed relative positions with keys shared between the two; the config
# class reads these options without declaring them.
_DEBERTA_V3: dict[str, Any] = dict(
    position_buckets=16, share_att_key=True, norm_rel_ebd="layer_norm"
)


def _bert() -> nn.Module:
    from transformers import BertConfig, BertModel

    config = BertConfig(**_BERT_LIKE, max_position_embeddings=MAX_POSITIONS)
    return noisy_biases(BertModel(config, add_pooling_layer=False))


def _roberta() -> nn.Module:
    from transformers import RobertaConfig, RobertaModel

    # Positions count from pad_token_id + 1, past the padding index.
    config = RobertaConfig(**_BERT_LIKE, max_position_embeddings=MAX_POSITIONS + 2)
    return noisy_biases(RobertaModel(config, add_pooling_layer=False))


def _distilbert() -> nn.Module:
    from transformers import DistilBertConfig, DistilBertModel

    config = DistilBertConfig(
        vocab_size=VOCAB,
        dim=WIDTH,
        n_layers=LAYERS,
        n_heads=HEADS,
        hidden_dim=2 * WIDTH,
        max_position_embeddings=MAX_POSITIONS,
        dropout=0.0,
        attention_dropout=0.0,
    )
    return noisy_biases(DistilBertModel(config))


def _deberta_v2() -> nn.Module:
    from transformers import DebertaV2Config, DebertaV2Model

    config = DebertaV2Config(
        **_BERT_LIKE,
        **_DEBERTA_V3,
        max_position_embeddings=MAX_POSITIONS,
        relative_attention=True,
        pos_att_type=["p2c", "c2p"],
        position_biased_input=False,
        type_vocab_size=0,
    )
    return noisy_biases(DebertaV2Model(config))


def _padded_inputs(
    pad_token_id: int, token_types: bool
) -> Callable[[int, int], Inputs]:
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


_encoder = functools.partial(
    ZooModel, family="encoder", output=last_hidden_state, requires=TRANSFORMERS
)

MODELS = (
    _encoder(
        name="bert",
        build=_bert,
        inputs=_padded_inputs(pad_token_id=0, token_types=True),
        features=("padding-mask", "learned-positions", "token-types", "post-norm"),
        description="BERT: post-norm encoder, learned positions and segment embeddings",
    ),
    _encoder(
        name="roberta",
        build=_roberta,
        inputs=_padded_inputs(pad_token_id=1, token_types=False),
        features=("padding-mask", "learned-positions", "position-offset", "post-norm"),
        description="RoBERTa: BERT with positions counted from the padding mask",
    ),
    _encoder(
        name="distilbert",
        build=_distilbert,
        inputs=_padded_inputs(pad_token_id=0, token_types=False),
        features=("padding-mask", "learned-positions", "post-norm"),
        description="DistilBERT: BERT without segment embeddings",
    ),
    _encoder(
        name="deberta-v2",
        build=_deberta_v2,
        inputs=_padded_inputs(pad_token_id=0, token_types=False),
        features=(
            "padding-mask",
            "relative-attention",
            "disentangled-attention",
            "post-norm",
        ),
        description="DeBERTa-v3: disentangled content and relative-position attention",
    ),
)
