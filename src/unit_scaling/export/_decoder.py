"""The plain-torch twin of :class:`unit_scaling.TransformerDecoder`, and the
fold of a trained decoder's scales into it."""

from __future__ import annotations

import math
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import functional as U
from .._standins import normal, seeded
from ..modules.transformer import TransformerDecoder, TransformerLayer
from ._graph import (
    AttentionSite,
    attention_ratios,
    attention_scale_at,
    attention_temperature,
)
from ._probe import proportion
from ._report import PlainExport, Unfolded, evaluating, measured_export

__all__ = ["PlainTransformerDecoder", "export_decoder"]


class _Layer(nn.Module):
    def __init__(self, hidden_size: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.linear_qkv = nn.Linear(hidden_size, 3 * hidden_size, bias=False)
        self.linear_o = nn.Linear(hidden_size, hidden_size, bias=False)
        self.linear_1 = nn.Linear(hidden_size, 4 * hidden_size, bias=False)
        self.linear_gate = nn.Linear(hidden_size, 4 * hidden_size, bias=False)
        self.linear_2 = nn.Linear(4 * hidden_size, hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        batch, seq, hidden = x.shape
        q, k, v = (
            self.linear_qkv(F.rms_norm(x, (hidden,)))
            .view(batch, seq, 3, self.heads, hidden // self.heads)
            .permute(2, 0, 3, 1, 4)
        )
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.linear_o(a.transpose(1, 2).reshape(batch, seq, hidden))
        y = F.rms_norm(x, (hidden,))
        out: Tensor = x + self.linear_2(self.linear_1(y) * F.silu(self.linear_gate(y)))
        return out


class PlainTransformerDecoder(nn.Module):
    """:class:`unit_scaling.TransformerDecoder`'s architecture in plain torch.

    Embedding → ``layers`` pre-norm layers (parameter-free RMSNorm, fused-QKV
    causal attention through ``F.scaled_dot_product_attention`` at its default
    temperature ``d^-1/2``, SwiGLU MLP, plain residual adds) → RMSNorm →
    readout. :func:`~unit_scaling.export.to_plain` folds a trained
    ``TransformerDecoder`` into it. Its parameters are named after the flat
    layout the baselines use: ``layers.{i}.linear_qkv.weight`` holds what the
    unit-scaled model calls ``layers.{i}.mhsa.linear_qkv.weight``, and likewise
    ``linear_o``, ``linear_1``, ``linear_gate``, ``linear_2``. Weights keep
    torch's default initialisation.

    Args:
        hidden_size: model width.
        vocab_size: number of tokens.
        layers: number of transformer layers.
        heads: attention heads (a divisor of ``hidden_size``).

    Raises:
        ValueError: if ``heads`` does not divide ``hidden_size``.

    Example::

        >>> model = PlainTransformerDecoder(64, 256, layers=2, heads=4)
        >>> model(torch.randint(256, (2, 16))).shape
        torch.Size([2, 16, 256])
    """

    def __init__(
        self, hidden_size: int, vocab_size: int, layers: int, heads: int
    ) -> None:
        super().__init__()
        if hidden_size % heads:
            raise ValueError(
                f"hidden_size={hidden_size} must be a multiple of heads={heads}"
            )
        self.embedding = nn.Embedding(vocab_size, hidden_size)
        self.layers = nn.Sequential(
            *(_Layer(hidden_size, heads) for _ in range(layers))
        )
        self.projection = nn.Linear(hidden_size, vocab_size, bias=False)

    def forward(self, input_ids: Tensor) -> Tensor:
        """Logits ``(..., seq, vocab_size)`` for token ids ``(..., seq)``."""
        x = self.layers(self.embedding(input_ids))
        logits: Tensor = self.projection(F.rms_norm(x, (x.shape[-1],)))
        return logits

    def loss(self, input_ids: Tensor) -> Tensor:
        """Mean next-token cross-entropy of ``input_ids`` ``(batch, seq + 1)``."""
        logits = self(input_ids[:, :-1])
        return F.cross_entropy(logits.flatten(end_dim=-2), input_ids[:, 1:].flatten())


def _scale(module: nn.Module, x: Tensor) -> float:
    """``s`` with ``module(x) = s * F.linear(x, W)`` (a unit-scaled linear). A
    layer converted to FP8 is read as the ``uu`` layer it was: its weights are
    the trained high-precision master weights, exported as such."""
    assert isinstance(module.weight, Tensor)
    forward = next(
        (
            cls.forward
            for cls in type(module).__mro__
            if issubclass(cls, nn.Module)
            and cls.__module__.startswith("unit_scaling.modules.")
        ),
        type(module).forward,
    )
    s = proportion(forward(module, x), F.linear(x, module.weight))
    assert s is not None, f"{type(module).__name__} is not a scaled F.linear"
    return s


def export_decoder(
    decoder: TransformerDecoder,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    seq_len: int | None,
) -> PlainExport:
    """:func:`~unit_scaling.export.to_plain` of a ``TransformerDecoder``."""
    example = args[0] if args else kwargs.get("input_ids")
    if example is None:
        if seq_len is None:
            raise ValueError(
                "to_plain(TransformerDecoder) folds the attention scale at one "
                "sequence length: pass example token ids, e.g. "
                "to_plain(model, (input_ids,)), or seq_len=..."
            )
        example = torch.randint(
            decoder.embedding.num_embeddings,
            (1, seq_len),
            generator=seeded(0),
            device="cpu",
        ).to(decoder.embedding.weight.device)
    seq_len = int(example.shape[-1])
    vocab, hidden = decoder.embedding.weight.shape
    stack = [cast(TransformerLayer, layer) for layer in decoder.layers]
    site = AttentionSite(
        "U.scaled_dot_product_attention",
        hidden // stack[0].mhsa.heads,
        seq_len,
        "none",
        True,
        0.0,
        None,
        stack[0].mhsa.mult,
    )
    plain = PlainTransformerDecoder(hidden, vocab, len(stack), stack[0].mhsa.heads)
    plain.to(decoder.embedding.weight)
    with torch.no_grad():
        ratios = _ratios(decoder, stack, site)
        own = dict(plain.named_parameters())
        for name, p in decoder.named_parameters():
            name = name.replace(".mhsa.", ".").replace(".mlp.", ".")
            own[name].copy_(p * ratios[name])
    with evaluating(decoder):
        output = decoder(example)
    unfolded, notes = [], []
    loss_mult = getattr(decoder, "loss_mult", 1.0)
    if loss_mult != 1:
        unfolded.append(
            Unfolded(
                "U.cross_entropy in TransformerDecoder.loss",
                "loss_mult multiplies the logits inside the loss only; forward's "
                "logits are folded as they are",
                loss_mult,
                f"compute the plain model's loss on logits * {loss_mult:g}",
            )
        )
    if any(layer.dropout.p for layer in stack):
        notes.append("the plain twin has no dropout: it matches the decoder in eval")
    return measured_export(
        decoder,
        plain,
        ((example,), {}),
        output,
        seq_len,
        attention_ratios([site], seq_len),
        folded={k: v for k, v in ratios.items() if v != 1},
        unfolded=unfolded,
        notes=notes,
    )


def _residual_weights(tau: float) -> tuple[float, float]:
    """``(a, b)`` of ``U.residual_add(r, s, tau) = a r + b s``."""
    one = torch.ones(1, dtype=torch.float64, device="cpu")
    zero = torch.zeros(1, dtype=torch.float64, device="cpu")
    return (
        float(U.residual_add(one, zero, tau)),
        float(U.residual_add(zero, one, tau)),
    )


def _ratios(
    decoder: TransformerDecoder, stack: list[TransformerLayer], site: AttentionSite
) -> dict[str, float]:
    """Each parameter's factor (plain / unit-scaled), by the twin's names.

    The plain residual stream is ``stream`` times the unit-scaled one: 1 after
    the embedding, ``1/b`` more after each ``U.residual_add`` (``a r + b s``),
    whose branch must then deliver ``stream * a``. Norms have no gains, so each
    branch starts from ratio ``1/s`` (the norm's own scale); the query and key
    ratios make up the temperatures, ``c`` and the gate's temperature fold into
    the projections after them.
    """
    weight = decoder.embedding.weight
    hidden = weight.shape[1]
    g = seeded(0)
    x = normal((4, hidden), g, weight.device, weight.dtype)
    ids = torch.arange(min(weight.shape[0], 16), device=weight.device).unsqueeze(0)
    s_embedding = proportion(decoder.embedding(ids), F.embedding(ids, weight))
    s_norm = proportion(decoder.final_norm(x), F.rms_norm(x, (hidden,)))
    assert s_embedding is not None and s_norm is not None
    ratios = {"embedding.weight": getattr(decoder, "embedding_mult", 1.0) * s_embedding}
    stream = 1.0
    for i, layer in enumerate(stack):
        mhsa, mlp = layer.mhsa, layer.mlp
        if layer.mhsa_norm.weight is not None or layer.mlp_norm.weight is not None:
            raise ValueError(
                f"layer {i} has RMSNorm gains; the plain twin's norms have none"
            )
        if mlp.linear_1.out_features != 4 * hidden or not mhsa.is_causal:
            raise ValueError(
                f"layer {i} is not the twin's architecture (causal attention, MLP "
                "expansion 4)"
            )
        head_dim = hidden // mhsa.heads
        # the query and the key share the ratio sqrt(t_u / t_p)
        r_qk = math.sqrt(attention_temperature(site) * math.sqrt(head_dim))
        c = attention_scale_at(site, site.key_length)
        assert c is not None
        a, b = _residual_weights(layer.mhsa_tau)
        stream /= b
        ratios[f"layers.{i}.linear_qkv.weight"] = (
            r_qk * s_norm * _scale(mhsa.linear_qkv, x)
        )
        ratios[f"layers.{i}.linear_o.weight"] = (
            stream * a * _scale(mhsa.linear_o, x) * c / r_qk
        )
        a, b = _residual_weights(layer.mlp_tau)
        stream /= b
        gate = normal((4, 8), g, "cpu", torch.float64)
        glu = proportion(
            U.silu_glu(gate, gate, mlp.mult), gate * F.silu(mlp.mult * gate)
        )
        assert glu is not None  # U.silu_glu = glu * x * silu(mult * g)
        ratios[f"layers.{i}.linear_1.weight"] = s_norm * _scale(mlp.linear_1, x)
        ratios[f"layers.{i}.linear_gate.weight"] = (
            mlp.mult * s_norm * _scale(mlp.linear_gate, x)
        )
        ratios[f"layers.{i}.linear_2.weight"] = (
            stream * a * glu * _scale(mlp.linear_2, x.repeat(1, 4))
        )
    ratios["projection.weight"] = (
        getattr(decoder, "readout_mult", 1.0) * s_norm * _scale(decoder.projection, x)
    )
    return ratios
