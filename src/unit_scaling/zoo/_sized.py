"""Hugging Face models at a named size, built from configs with random weights:
the one place the report, benchmarks, experiments and tests build them."""

from __future__ import annotations

from typing import Any, Literal

from torch import nn

__all__ = ["HF_SIZES", "Size", "hf_model"]

Size = Literal["tiny", "small"]


def _sizes(
    width: int, mlp: int, layers: int, heads: int, **more: Any
) -> dict[str, Any]:
    """Config keywords of a transformer's sizes, in the names most configs use."""
    return dict(
        hidden_size=width,
        intermediate_size=mlp,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        **more,
    )


# Per family: the model class (in ``transformers``), the loss the model computes
# with ``labels=`` (named, else transformers logs in forward: a graph break),
# and each size's config. "small" is the published small model of the family.
HF_SIZES: dict[str, tuple[str, str, dict[str, dict[str, Any]]]] = {
    "gpt2": (
        "GPT2LMHeadModel",
        "ForCausalLM",
        {
            "tiny": dict(n_layer=2, n_embd=64, n_head=4),
            "small": dict(n_layer=12, n_embd=768, n_head=12),
        },
    ),
    "llama": (
        "LlamaForCausalLM",
        "ForCausalLM",
        {
            "tiny": _sizes(64, 172, layers=2, heads=4, num_key_value_heads=2),
            "small": _sizes(768, 2048, layers=12, heads=12, num_key_value_heads=4),
        },
    ),
    "bert": (
        "BertForMaskedLM",
        "ForMaskedLM",
        {
            "tiny": _sizes(64, 256, layers=2, heads=4),
            "small": _sizes(768, 3072, layers=12, heads=12),
        },
    ),
}
"""Family -> (model class, loss type, config keywords of each size)."""


def hf_model(family: str, size: Size = "tiny", **config: Any) -> nn.Module:
    """A Hugging Face ``family`` model (``"gpt2"``, ``"llama"``, ``"bert"``) of
    ``size`` (``"tiny"``: 2 layers of width 64; ``"small"``: the published small
    model's shape) with random weights; ``config`` overrides or adds config
    keywords (``vocab_size=256``, ``use_cache=False``, dropouts, ...).

    GPT-2 and Llama are causal LMs (``*ForCausalLM``, ``GPT2LMHeadModel``), BERT
    a masked LM (its encoder alone is ``model.bert``). Needs ``transformers``.

    Example::

        >>> model = hf_model("gpt2", vocab_size=256, use_cache=False)
        >>> model.config.n_layer, model.config.n_embd, type(model).__name__
        (2, 64, 'GPT2LMHeadModel')
    """
    if family not in HF_SIZES:
        raise ValueError(
            f"unknown family {family!r}: expected one of {sorted(HF_SIZES)}"
        )
    class_name, loss_type, sizes = HF_SIZES[family]
    if size not in sizes:
        raise ValueError(f"unknown size {size!r}: expected one of {sorted(sizes)}")
    import transformers

    model_class = getattr(transformers, class_name)
    model: nn.Module = model_class(
        model_class.config_class(**{**sizes[size], **config})
    )
    model.loss_type = loss_type  # type: ignore[assignment]
    return model
