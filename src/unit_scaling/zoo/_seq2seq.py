"""Encoder-decoder models from Hugging Face configs: text and speech.

The builders and inputs of the ``encoder-decoder`` rows of :mod:`._catalogue`.
"""

from __future__ import annotations

from typing import Any

import torch

from ._common import (
    HEADS,
    LAYERS,
    MAX_POSITIONS,
    SEQ2SEQ,
    T5_LIKE,
    VOCAB,
    WIDTH,
    conditional_generation,
    generator,
    padding_mask,
    token_ids,
)
from ._model import Inputs

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

t5 = conditional_generation("T5ForConditionalGeneration", T5_LIKE)
bart = conditional_generation(
    "BartForConditionalGeneration", _BART_LIKE, max_position_embeddings=MAX_POSITIONS
)
whisper = conditional_generation(
    "WhisperForConditionalGeneration",
    _BART_LIKE,
    num_mel_bins=_MEL_BINS,
    max_source_positions=_WHISPER_POSITIONS,
    max_target_positions=MAX_POSITIONS,
    suppress_tokens=None,
    begin_suppress_tokens=None,
)
speech_to_text = conditional_generation(
    "Speech2TextForConditionalGeneration",
    _BART_LIKE,
    max_source_positions=MAX_POSITIONS,
    max_target_positions=MAX_POSITIONS,
    conv_channels=WIDTH,
    input_feat_per_channel=_SPEECH_FEATURES,
)


def whisper_inputs(seed: int, variant: int) -> Inputs:
    gen = generator(seed)
    batch, _, target = SEQ2SEQ[variant]
    frames = 2 * _WHISPER_POSITIONS
    features = torch.randn(batch, _MEL_BINS, frames, generator=gen)
    return (), {
        "input_features": features,
        "decoder_input_ids": token_ids(gen, batch, target),
    }


def speech_to_text_inputs(seed: int, variant: int) -> Inputs:
    gen = generator(seed)
    batch, _, target = SEQ2SEQ[variant]
    frames = _SPEECH_FRAMES[variant]
    return (), {
        "input_features": torch.randn(batch, frames, _SPEECH_FEATURES, generator=gen),
        "attention_mask": padding_mask(batch, frames),
        "decoder_input_ids": token_ids(gen, batch, target),
    }
