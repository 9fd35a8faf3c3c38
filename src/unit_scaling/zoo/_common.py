"""Sizes, inputs, output pickers and Hugging Face helpers the families share."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from ._model import Inputs

if TYPE_CHECKING:
    from transformers import PreTrainedModel

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


def lm_inputs(seed: int, variant: int) -> Inputs:
    """Token ids alone, as a Hugging Face language model takes them."""
    return (), {"input_ids": token_ids(generator(seed), *TOKENS[variant])}


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
    batch, side = sizes[variant]
    pixels = torch.randn(batch, 3, side, side, generator=generator(seed))
    return (), {"pixel_values": pixels}


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


def language_model(model: PreTrainedModel, loss_type: str = "ForCausalLM") -> nn.Module:
    """:func:`noisy_biases` of a Hugging Face language model, given the loss type
    its class name does not imply: without one, it logs from ``forward``, which
    breaks graph capture."""
    model.loss_type = loss_type
    return noisy_biases(model)
