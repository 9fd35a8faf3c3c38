"""Sizes, Hugging Face config fields, inputs, output pickers and builders the
families share."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ._model import Inputs

VOCAB = 128
WIDTH = 64
HEADS = 4  # head_dim 16 at WIDTH
LAYERS = 2
MAX_POSITIONS = 64
TOKENS = ((2, 16), (3, 24))
"""``(batch, sequence)`` of variants 0 and 1."""
SEQ2SEQ = ((2, 16, 12), (3, 24, 20))
"""``(batch, source sequence, target sequence)`` of variants 0 and 1."""
IMAGES = ((2, 32), (3, 48))
"""``(batch, side)`` of square images in variants 0 and 1."""

TRANSFORMERS = ("transformers",)
DIFFUSERS = ("diffusers",)

# Hugging Face config fields shared by several models' configs, in the names most
# configs use. A config that names a size otherwise (GPT-2's ``n_embd``,
# DistilBERT's ``dim``) takes these names through its ``attribute_map`` and stores
# the value under its own name, but only after its own ``__init__``: a size that
# the config derives other fields from goes in under its own name (T5_LIKE).
TRUNK: dict[str, Any] = dict(
    hidden_size=WIDTH, num_hidden_layers=LAYERS, num_attention_heads=HEADS
)
"""The sizes of a transformer's layers."""
TEXT_TRUNK: dict[str, Any] = dict(
    TRUNK, vocab_size=VOCAB, max_position_embeddings=MAX_POSITIONS
)
""":data:`TRUNK` with a vocabulary and learned positions."""
DECODER: dict[str, Any] = dict(TEXT_TRUNK, use_cache=False)
"""A causal language model's sizes, without the key-value cache."""
LLAMA_LIKE: dict[str, Any] = dict(DECODER, intermediate_size=2 * WIDTH)
"""A :data:`DECODER` whose MLP width is named ``intermediate_size``."""
GQA: dict[str, Any] = dict(LLAMA_LIKE, num_key_value_heads=HEADS // 2)
"""A :data:`LLAMA_LIKE` decoder with grouped-query attention (2 queries a key)."""
T5_LIKE: dict[str, Any] = dict(
    vocab_size=VOCAB,
    d_model=WIDTH,
    num_layers=LAYERS,  # in its own name: Switch derives its sparse steps from it
    num_heads=HEADS,
    d_kv=WIDTH // HEADS,
    d_ff=2 * WIDTH,
    num_decoder_layers=LAYERS,
    relative_attention_num_buckets=8,
    relative_attention_max_distance=32,
    dropout_rate=0.0,
    use_cache=False,
)
"""T5's encoder-decoder, also the trunk of Switch Transformers."""
BERT_DROPOUT: dict[str, Any] = dict(
    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
)
"""No dropout, in the BERT-like configs' names."""


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def token_ids(gen: torch.Generator, batch: int, seq: int, vocab: int = VOCAB) -> Tensor:
    return torch.randint(vocab, (batch, seq), generator=gen)


def padding_mask(batch: int, seq: int) -> Tensor:
    """A Hugging Face attention mask (1 keep, 0 pad): the first sequence's last
    quarter is padding."""
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[0, seq - seq // 4 :] = 0
    return mask


def images(gen: torch.Generator, batch: int, side: int, channels: int = 3) -> Tensor:
    """Unit-normal square images."""
    return torch.randn(batch, channels, side, side, generator=gen)


def lm_inputs(
    seed: int, variant: int, sizes: tuple[tuple[int, int], ...] = TOKENS
) -> Inputs:
    """Token ids alone, as a Hugging Face language model takes them (``sizes``:
    ``(batch, sequence)`` of each variant)."""
    return (), {"input_ids": token_ids(generator(seed), *sizes[variant])}


def seq2seq_inputs(seed: int, variant: int) -> Inputs:
    """Source ids with a padding mask and target ids, as a Hugging Face
    encoder-decoder takes them."""
    gen = generator(seed)
    batch, source, target = SEQ2SEQ[variant]
    return (), {
        "input_ids": token_ids(gen, batch, source),
        "attention_mask": padding_mask(batch, source),
        "decoder_input_ids": token_ids(gen, batch, target),
    }


def image_inputs(
    seed: int, variant: int, sizes: tuple[tuple[int, int], ...] = IMAGES
) -> Inputs:
    """Unit-normal RGB ``pixel_values``, as a Hugging Face vision model takes them
    (``sizes``: ``(batch, side)`` of each variant)."""
    return (), {"pixel_values": images(generator(seed), *sizes[variant])}


def _tensor(value: Any, where: str) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(
            f"expected a tensor as the model's {where}, got {type(value).__name__}: "
            "does the zoo entry's output picker match what forward returns?"
        )
    return value


def logits(output: Any) -> Tensor:
    return _tensor(output.logits, "logits")


def last_hidden_state(output: Any) -> Tensor:
    return _tensor(output.last_hidden_state, "last_hidden_state")


def sample(output: Any) -> Tensor:
    return _tensor(output.sample, "sample")


def first(output: Any) -> Tensor:
    return _tensor(output[0], "first output")


def identity(output: Any) -> Tensor:
    return _tensor(output, "output")


def noisy_biases(model: nn.Module) -> nn.Module:
    """``model`` with ``N(0, 0.02²)`` noise added to every bias.

    Hugging Face and diffusers initialise most biases to zero, which would hide a
    transform that drops or mishandles one. The noise comes from the global RNG,
    which ``ZooModel.make`` seeds.
    """
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.rpartition(".")[2] == "bias":
                param.add_(torch.randn_like(param), alpha=0.02)
    return model


def hf(
    class_name: str,
    *bases: Mapping[str, Any],
    loss_type: str | None = None,
    pooler: bool = True,
    **fields: Any,
) -> Callable[[], nn.Module]:
    """A builder of the ``transformers`` model ``class_name`` with random weights
    and :func:`noisy_biases`, from its config class given the ``bases`` and then
    the ``fields`` (a later one overrides an earlier).

    ``loss_type`` is the loss of a language model whose class name does not imply
    one: without it, ``forward`` logs, which breaks graph capture. ``pooler=False``
    builds the model without its pooling layer.
    """
    config = {key: value for base in (*bases, fields) for key, value in base.items()}

    def build() -> nn.Module:
        import transformers

        model_class = getattr(transformers, class_name)
        extra = {} if pooler else {"add_pooling_layer": False}
        # A fresh copy for each build, so that no two configs share a nested dict.
        model = model_class(model_class.config_class(**copy.deepcopy(config)), **extra)
        if loss_type is not None:
            model.loss_type = loss_type
        return noisy_biases(model)

    return build


causal_lm = functools.partial(hf, loss_type="ForCausalLM")
"""A builder of a Hugging Face causal language model (see :func:`hf`)."""
conditional_generation = functools.partial(hf, loss_type="ForConditionalGeneration")
"""A builder of a Hugging Face encoder-decoder with an LM head (see :func:`hf`)."""
