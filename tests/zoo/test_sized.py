"""``zoo.hf_model``: Hugging Face models at a named size, from configs."""

from __future__ import annotations

import pytest

from unit_scaling import zoo

pytest.importorskip("transformers")


@pytest.mark.parametrize("family", sorted(zoo.HF_SIZES))
def test_tiny_models_have_the_tiny_shape_and_a_named_loss(family: str) -> None:
    model = zoo.hf_model(family, vocab_size=256)
    config = model.config  # type: ignore[union-attr]
    assert config.vocab_size == 256
    assert getattr(config, "num_hidden_layers", getattr(config, "n_layer", None)) == 2
    assert getattr(config, "hidden_size", getattr(config, "n_embd", None)) == 64
    assert model.loss_type in ("ForCausalLM", "ForMaskedLM")


def test_overrides_replace_the_size_keywords() -> None:
    model = zoo.hf_model("gpt2", n_embd=128, n_head=8, vocab_size=256)
    assert (model.config.n_embd, model.config.n_head) == (128, 8)  # type: ignore[union-attr]


def test_bad_family_or_size() -> None:
    with pytest.raises(
        ValueError, match=r"unknown family 'gpt3'.*'bert', 'gpt2', 'llama'"
    ):
        zoo.hf_model("gpt3")
    with pytest.raises(ValueError, match=r"unknown size 'huge'.*'small', 'tiny'"):
        zoo.hf_model("gpt2", "huge")  # type: ignore[arg-type]
