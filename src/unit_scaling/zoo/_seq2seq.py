"""Encoder-decoder models from Hugging Face configs: text and speech."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from transformers import PreTrainedModel

from ._common import (
    HEADS,
    LAYERS,
    MAX_POSITIONS,
    SEQ2SEQ,
    TRANSFORMERS,
    VOCAB,
    WIDTH,
    generator,
    language_model,
    logits,
    padding_mask,
    seq2seq_inputs,
    token_ids,
)
from ._model import Inputs, ZooModel

__all__ = ["MODELS"]

# Whisper's encoder takes exactly 2 * max_source_positions frames (its convolution
# front end halves them), so its variants differ in batch and target length only.
_WHISPER_POSITIONS = 16
_MEL_BINS = 80
_SPEECH_FRAMES = (32, 48)  # Speech2Text takes any length; it subsamples by 4
_SPEECH_FEATURES = 16
_BART_LIKE: dict[str, Any] = dict(
    vocab_size=VOCAB,
    d_model=WIDTH,
    encoder_layers=LAYERS,
    decoder_layers=LAYERS,
    encoder_attention_heads=HEADS,
    decoder_attention_heads=HEADS,
    encoder_ffn_dim=2 * WIDTH,
    decoder_ffn_dim=2 * WIDTH,
    dropout=0.0,
    attention_dropout=0.0,
    activation_dropout=0.0,
    pad_token_id=1,
    bos_token_id=0,
    eos_token_id=2,
    decoder_start_token_id=2,
    use_cache=False,
)


def _conditional_generation(model: PreTrainedModel) -> nn.Module:
    return language_model(model, "ForConditionalGeneration")


def _t5() -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        vocab_size=VOCAB,
        d_model=WIDTH,
        d_kv=WIDTH // HEADS,
        d_ff=2 * WIDTH,
        num_layers=LAYERS,
        num_decoder_layers=LAYERS,
        num_heads=HEADS,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=32,
        dropout_rate=0.0,
        use_cache=False,
    )
    return _conditional_generation(T5ForConditionalGeneration(config))


def _bart() -> nn.Module:
    from transformers import BartConfig, BartForConditionalGeneration

    config = BartConfig(**_BART_LIKE, max_position_embeddings=MAX_POSITIONS)
    return _conditional_generation(BartForConditionalGeneration(config))


def _whisper() -> nn.Module:
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    config = WhisperConfig(
        **_BART_LIKE,
        num_mel_bins=_MEL_BINS,
        max_source_positions=_WHISPER_POSITIONS,
        max_target_positions=MAX_POSITIONS,
        suppress_tokens=None,
        begin_suppress_tokens=None,
    )
    return _conditional_generation(WhisperForConditionalGeneration(config))


def _speech_to_text() -> nn.Module:
    from transformers import Speech2TextConfig, Speech2TextForConditionalGeneration

    config = Speech2TextConfig(
        **_BART_LIKE,
        max_source_positions=MAX_POSITIONS,
        max_target_positions=MAX_POSITIONS,
        conv_channels=WIDTH,
        input_feat_per_channel=_SPEECH_FEATURES,
    )
    return _conditional_generation(Speech2TextForConditionalGeneration(config))


def _whisper_inputs(seed: int, variant: int) -> Inputs:
    gen = generator(seed)
    batch, _, target = SEQ2SEQ[variant]
    frames = 2 * _WHISPER_POSITIONS
    features = torch.randn(batch, _MEL_BINS, frames, generator=gen)
    return (), {
        "input_features": features,
        "decoder_input_ids": token_ids(gen, batch, target),
    }


def _speech_to_text_inputs(seed: int, variant: int) -> Inputs:
    gen = generator(seed)
    batch, _, target = SEQ2SEQ[variant]
    frames = _SPEECH_FRAMES[variant]
    return (), {
        "input_features": torch.randn(batch, frames, _SPEECH_FEATURES, generator=gen),
        "attention_mask": padding_mask(batch, frames),
        "decoder_input_ids": token_ids(gen, batch, target),
    }


MODELS = (
    ZooModel(
        "t5",
        "encoder-decoder",
        _t5,
        seq2seq_inputs,
        logits,
        features=(
            "relative-position-bias",
            "cross-attention",
            "rms-norm",
            "unscaled-attention",
            "scaled-tied-lm-head",
            "padding-mask",
        ),
        requires=TRANSFORMERS,
        description="T5: bucketed relative position bias, attention without 1/√d",
    ),
    ZooModel(
        "bart",
        "encoder-decoder",
        _bart,
        seq2seq_inputs,
        logits,
        features=(
            "cross-attention",
            "learned-positions",
            "position-offset",
            "post-norm",
            "padding-mask",
        ),
        requires=TRANSFORMERS,
        description="BART: post-norm encoder-decoder with learned positions",
    ),
    ZooModel(
        "whisper",
        "encoder-decoder",
        _whisper,
        _whisper_inputs,
        logits,
        features=("speech", "conv-frontend", "cross-attention", "sinusoidal-positions"),
        requires=TRANSFORMERS,
        description="Whisper: conv front end on log-mel features, pre-norm seq2seq",
    ),
    ZooModel(
        "speech-to-text",
        "encoder-decoder",
        _speech_to_text,
        _speech_to_text_inputs,
        logits,
        features=(
            "speech",
            "conv-frontend",
            "glu",
            "cross-attention",
            "sinusoidal-positions",
            "padding-mask",
        ),
        requires=TRANSFORMERS,
        description="Speech2Text: strided GLU convolutions subsample filter banks",
    ),
)
