"""A zoo of small model architectures with random weights, to test transforms on.

Each :class:`ZooModel` builds a small version of an architecture from its config
(Hugging Face ``transformers``, ``diffusers``) or from plain torch code, with
random weights and nothing downloaded, and gives inputs for it at two shape sets.
Tests, benchmarks and the command line share the zoo::

    from unit_scaling import zoo

    for name in zoo.names():
        entry = zoo.get(name)
        if entry.available():
            model = entry.make(seed=0)
            out = entry.run(model, seed=0, variant=0)  # the main float output
            out.backward(torch.randn_like(out))

Families (:data:`Family`) and what they exercise:

- ``decoder``: causal LMs. Grouped- and multi-query attention, rotary (full,
  partial, interleaved), ALiBi, learned positions, parallel residuals, logit
  soft-capping, sandwich norms, sliding windows, QK-norm, biased QKV.
- ``moe``: routed experts (top-k, shared expert, Switch's top-1 with capacity).
- ``encoder``: BERT-like encoders fed padded batches; DeBERTa's disentangled
  relative attention.
- ``encoder-decoder``: T5's relative position bias, BART, and speech models
  (Whisper, Speech2Text) with convolutional front ends.
- ``vision``: ViT-like models, Swin's shifted windows, layer scale, relative
  position bias.
- ``conv``: batch norm, group norm with weight standardization, depthwise
  convolutions.
- ``diffusion``: U-Nets (group norm, timestep embeddings, self- and
  cross-attention) and DiT (adaLN-Zero).
- ``ssm``: Mamba and Mamba-2 on their torch paths.
- ``torch``: plain ``torch.nn``: an MLP, ``nn.TransformerEncoder``,
  ``nn.Transformer``, an ``nn.Sequential`` root, and user code with in-place ops.

Sizes are small (width 64, 2 layers, vocabulary 128; variant 0 a batch of 2
sequences of 16 tokens or 32-pixel images, variant 1 a batch of 3 of 24 tokens or
48 pixels, unless an architecture needs otherwise), so building a model and
running both variants forward and backward takes well under a second. Models
marked :attr:`ZooModel.slow` are those whose tracing is heavy.

Hugging Face models keep the attention and experts implementations the library
picks (SDPA where supported, eager where a feature such as soft-capping needs
it; ``grouped_mm`` experts). Every bias of a Hugging Face or diffusers model gets
``N(0, 0.02²)`` noise, since most are initialised to zero and a zero bias hides a
transform that mishandles one. Models that need ``transformers`` or
``diffusers`` list them in :attr:`ZooModel.requires`; install both with
``pip install 'torch-unit-scaling[zoo]'``.
"""

from __future__ import annotations

from . import _catalogue
from ._model import FAMILIES, Family, Inputs, ZooModel
from ._sized import HF_SIZES, hf_model

__all__ = [
    "HF_SIZES",
    "MODELS",
    "Family",
    "Inputs",
    "ZooModel",
    "get",
    "hf_model",
    "names",
]

MODELS: dict[str, ZooModel] = {model.name: model for model in _catalogue.MODELS}
"""Every zoo model by name, grouped by family in the order of :data:`Family`."""


def get(name: str) -> ZooModel:
    """The zoo model called ``name``.

    Raises:
        ValueError: for an unknown name, listing the valid ones.

    Example::

        >>> from unit_scaling import zoo
        >>> zoo.get("gpt2").family
        'decoder'
    """
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(
            f"no zoo model is called {name!r}: choose one of {', '.join(MODELS)}"
        ) from None


def names(family: str | None = None, *, include_slow: bool = True) -> list[str]:
    """Names of the zoo models, of one ``family`` if given, in registry order.

    Args:
        family: keep only this family (one of :data:`Family`); ``None`` for all.
        include_slow: whether to keep models marked ``slow``.

    Raises:
        ValueError: for an unknown family, listing the valid ones.

    Example::

        >>> from unit_scaling import zoo
        >>> zoo.names("ssm", include_slow=False)
        ['mamba2']
    """
    if family is not None and family not in FAMILIES:
        raise ValueError(
            f"no zoo family is called {family!r}: choose one of {', '.join(FAMILIES)}"
        )
    return [
        model.name
        for model in MODELS.values()
        if (family is None or model.family == family)
        and (include_slow or not model.slow)
    ]
