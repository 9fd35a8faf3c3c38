"""A unit-scaled, u-μP transformer: MLP, attention, layer, stack and decoder."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

from .. import functional as U
from ..core.functional import transformer_residual_scaling_rule
from ._base import check_sizes
from .activation import Dropout
from .depth import DepthSequential
from .linear import Linear, LinearReadout
from .normalization import RMSNorm
from .sparse import Embedding

__all__ = ["MHSA", "MLP", "TransformerDecoder", "TransformerLayer", "TransformerStack"]


class MLP(nn.Module):
    """Unit-scaled SwiGLU feed-forward block.

    .. math:: y = W_2 \\,\\mathrm{silu\\_glu}(W_1 x, W_{gate} x)

    Its three linears take their natural scales (``constraint=None``): the up
    projections' backward scale is :math:`(e\\,d)^{-1/2}` against a forward
    :math:`d^{-1/2}`, the down projection's :math:`d^{-1/2}` against
    :math:`(e\\,d)^{-1/2}`, so along every path through the block the two
    mismatches cancel (``sqrt(e) / sqrt(e)``) and the input gradient is still the
    true gradient, while the output, the inner activations and every weight
    gradient are unit-scaled for any expansion factor ``e``. (Constraining each
    linear to its output scale, as a lone ``uu.Linear`` is, would leave the up
    projections' weight gradients at ``e^(-1/2)``.) The input gradient sums the
    value and gate paths: RMS ``sqrt(2)``.

    Args:
        hidden_size: model width.
        expansion_factor: inner width is ``expansion_factor * hidden_size``.
        mult: temperature of the gating SiLU (see :func:`U.silu_glu`).

    Example::

        >>> MLP(64)(torch.randn(2, 5, 64)).shape
        torch.Size([2, 5, 64])
    """

    def __init__(
        self, hidden_size: int, expansion_factor: int = 4, mult: float = 1.0
    ) -> None:
        super().__init__()
        check_sizes("MLP", hidden_size=hidden_size, expansion_factor=expansion_factor)
        intermediate_size = expansion_factor * hidden_size
        self.linear_1 = Linear(hidden_size, intermediate_size, constraint=None)
        self.linear_gate = Linear(hidden_size, intermediate_size, constraint=None)
        self.linear_2 = Linear(intermediate_size, hidden_size, constraint=None)
        self.mult = mult

    def forward(self, input: Tensor) -> Tensor:
        z = U.silu_glu(self.linear_1(input), self.linear_gate(input), mult=self.mult)
        out: Tensor = self.linear_2(z)
        return out

    def extra_repr(self) -> str:
        return f"mult={self.mult}"


class MHSA(nn.Module):
    """Unit-scaled multi-head self-attention with a fused QKV projection.

    Attention uses :func:`U.scaled_dot_product_attention`, whose softmax
    temperature is ``mult / head_size`` (u-μP) rather than ``head_size^-½``.

    Args:
        hidden_size: model width (divisible by ``heads``).
        heads: number of attention heads.
        is_causal: apply a causal mask.
        dropout_p: attention dropout probability (training only).
        mult: attention temperature multiplier.

    Example::

        >>> MHSA(64, heads=4, is_causal=True)(torch.randn(2, 10, 64)).shape
        torch.Size([2, 10, 64])
    """

    def __init__(
        self,
        hidden_size: int,
        heads: int,
        is_causal: bool,
        dropout_p: float = 0.0,
        mult: float = 1.0,
    ) -> None:
        super().__init__()
        if heads < 1 or hidden_size % heads:
            raise ValueError(
                f"MHSA: hidden_size={hidden_size} must be a positive multiple of "
                f"heads={heads}"
            )
        self.heads = heads
        self.is_causal = is_causal
        self.dropout_p = dropout_p
        self.mult = mult
        self.linear_qkv = Linear(hidden_size, 3 * hidden_size)
        self.linear_o = Linear(hidden_size, hidden_size)

    def forward(self, input: Tensor) -> Tensor:
        if input.dim() != 3:
            raise ValueError(
                "MHSA: expected input of shape (batch, seq, hidden), got "
                f"{tuple(input.shape)}"
            )
        batch, seq, hidden = input.shape
        q, k, v = (
            self.linear_qkv(input)
            .view(batch, seq, 3, self.heads, hidden // self.heads)
            .permute(2, 0, 3, 1, 4)
        )
        attention = self._attention(
            q,
            k,
            v,
            dropout_p=self.dropout_p if self.training else 0.0,
            is_causal=self.is_causal,
            mult=self.mult,
        )
        out: Tensor = self.linear_o(
            attention.transpose(1, 2).reshape(batch, seq, hidden)
        )
        return out

    def _attention(self, *args: Any, **kwargs: Any) -> Tensor:
        """The attention function (a subclass may run another one)."""
        return U.scaled_dot_product_attention(*args, **kwargs)

    def extra_repr(self) -> str:
        return (
            f"heads={self.heads}, is_causal={self.is_causal}, "
            f"dropout_p={self.dropout_p}, mult={self.mult}"
        )


class TransformerLayer(nn.Module):
    """A pre-norm transformer layer with u-μP residual branches.

    .. math::
        x \\leftarrow \\mathrm{residual\\_apply}(\\mathrm{MHSA} \\circ
        \\mathrm{RMSNorm}, x, \\tau_{mhsa}), \\quad
        x \\leftarrow \\mathrm{residual\\_apply}(\\mathrm{MLP} \\circ
        \\mathrm{RMSNorm}, x, \\tau_{mlp})

    Args:
        hidden_size: model width.
        heads: attention heads.
        mhsa_tau: residual weight of the attention branch.
        mlp_tau: residual weight of the MLP branch.
        is_causal: causal attention.
        dropout_p: dropout on attention probabilities and branch outputs.
        mhsa_mult: attention temperature multiplier.
        mlp_mult: SwiGLU gate temperature multiplier.

    Example::

        >>> layer = TransformerLayer(64, 4, mhsa_tau=0.5, mlp_tau=0.5, is_causal=True)
        >>> layer(torch.randn(2, 10, 64)).shape
        torch.Size([2, 10, 64])
    """

    def __init__(
        self,
        hidden_size: int,
        heads: int,
        mhsa_tau: float,
        mlp_tau: float,
        is_causal: bool,
        dropout_p: float = 0.0,
        mhsa_mult: float = 1.0,
        mlp_mult: float = 1.0,
    ) -> None:
        super().__init__()
        self.mhsa_tau = mhsa_tau
        self.mlp_tau = mlp_tau
        self.mhsa_norm = RMSNorm(hidden_size)
        self.mhsa = MHSA(hidden_size, heads, is_causal, dropout_p, mhsa_mult)
        self.mlp_norm = RMSNorm(hidden_size)
        self.mlp = MLP(hidden_size, mult=mlp_mult)
        self.dropout = Dropout(dropout_p)

    def _mhsa_branch(self, x: Tensor) -> Tensor:
        out: Tensor = self.dropout(self.mhsa(self.mhsa_norm(x)))
        return out

    def _mlp_branch(self, x: Tensor) -> Tensor:
        out: Tensor = self.dropout(self.mlp(self.mlp_norm(x)))
        return out

    def forward(self, input: Tensor) -> Tensor:
        x = U.residual_apply(self._mhsa_branch, input, self.mhsa_tau)
        return U.residual_apply(self._mlp_branch, x, self.mlp_tau)

    def extra_repr(self) -> str:
        return f"mhsa_tau={self.mhsa_tau:.4g}, mlp_tau={self.mlp_tau:.4g}"


class TransformerStack(DepthSequential):
    """``layers`` transformer layers whose residual weights follow one rule.

    Layer ``i`` gets ``mhsa_tau = residual_scaling(2i, 2·layers)`` and
    ``mlp_tau = residual_scaling(2i + 1, 2·layers)``; being a
    :class:`DepthSequential`, it tags every parameter with
    ``mup_scaling_depth = layers``.

    Args:
        layers: number of transformer layers.
        hidden_size, heads, is_causal, dropout_p, mhsa_mult, mlp_mult: see
            :class:`TransformerLayer`.
        residual_scaling: ``tau(index, branches)``; default
            :func:`unit_scaling.transformer_residual_scaling_rule`.

    Example::

        >>> stack = TransformerStack(2, 64, 4, is_causal=True)
        >>> stack[0].mlp.linear_1.weight.mup_scaling_depth
        2
    """

    def __init__(
        self,
        layers: int,
        hidden_size: int,
        heads: int,
        is_causal: bool,
        dropout_p: float = 0.0,
        mhsa_mult: float = 1.0,
        mlp_mult: float = 1.0,
        residual_scaling: Callable[[int, int], float] | None = None,
    ) -> None:
        if layers < 1:
            raise ValueError(f"TransformerStack: layers={layers} must be >= 1")
        tau = residual_scaling or transformer_residual_scaling_rule()
        super().__init__(
            *(
                TransformerLayer(
                    hidden_size,
                    heads,
                    mhsa_tau=tau(2 * i, 2 * layers),
                    mlp_tau=tau(2 * i + 1, 2 * layers),
                    is_causal=is_causal,
                    dropout_p=dropout_p,
                    mhsa_mult=mhsa_mult,
                    mlp_mult=mlp_mult,
                )
                for i in range(layers)
            )
        )


class TransformerDecoder(nn.Module):
    """A unit-scaled, u-μP causal language model.

    Embedding → :class:`TransformerStack` (causal) → RMSNorm →
    :class:`LinearReadout`. Every tensor is unit-scaled at initialisation, so the
    model trains in FP8/FP16 without loss scaling; train it with
    :class:`unit_scaling.optim.AdamW` for u-μP learning rates.

    The keyword-only multipliers are u-μP's tunable hyperparameters (the ones its
    independent search sweeps; 1 is u-μP's default for each, and gives the model
    its unit scale). Each is stored under its name; the residual ones and the two
    temperatures are read when the model is built, so set them then.

    Args:
        hidden_size: model width.
        vocab_size: number of tokens.
        layers: number of transformer layers.
        heads: attention heads.
        dropout_p: dropout probability.
        residual_scaling: a custom ``tau(index, branches)`` rule (see
            :class:`TransformerStack`); by default
            ``transformer_residual_scaling_rule(residual_mult, residual_attn_ratio)``.
            Give this or the two residual multipliers, not both.
        embedding_mult: multiplies the embedding's output in the forward pass
            (μP's embedding multiplier); being a plain multiply, it multiplies the
            embedding table's gradient too. u-μP's residual rule makes it largely
            redundant with ``residual_mult``: both weigh the embedding against the
            residual branches.
        residual_mult: u-μP's α_res, the weight of every residual branch
            relative to the embedding (the skip).
        residual_attn_ratio: u-μP's α_res-attn-ratio, the weight of the
            attention branches relative to the MLP ones.
        mhsa_mult: u-μP's α_attn-softmax, the attention softmax temperature (see
            :class:`MHSA`).
        mlp_mult: u-μP's α_ffn-act, the temperature of the SwiGLU gate (see
            :class:`MLP`).
        readout_mult: multiplies the logits in the forward pass (μP's output
            multiplier); being a plain multiply, it multiplies the gradients of
            the readout's weight and input too. In the loss it acts as
            ``loss_mult`` does (the loss depends on their product), but it also
            scales the logits :meth:`forward` returns.
        loss_mult: u-μP's α_loss-softmax, the softmax temperature of the loss: it
            multiplies the logits inside :meth:`loss` only (see
            :func:`U.cross_entropy`).

    Raises:
        ValueError: a multiplier that is not a positive, finite number, or
            ``residual_scaling`` given together with a residual multiplier.

    Example::

        >>> model = TransformerDecoder(hidden_size=64, vocab_size=256, layers=2,
        ...                            heads=4)
        >>> tokens = torch.randint(256, (2, 17))
        >>> model(tokens[:, :-1]).shape
        torch.Size([2, 16, 256])
        >>> model.loss(tokens).shape
        torch.Size([])
        >>> TransformerDecoder(64, 256, layers=2, heads=4, residual_mult=0.5,
        ...                    readout_mult=2.0).extra_repr()
        'residual_mult=0.5, readout_mult=2.0'
    """

    def __init__(
        self,
        hidden_size: int,
        vocab_size: int,
        layers: int,
        heads: int,
        dropout_p: float = 0.0,
        residual_scaling: Callable[[int, int], float] | None = None,
        *,
        embedding_mult: float = 1.0,
        residual_mult: float = 1.0,
        residual_attn_ratio: float = 1.0,
        mhsa_mult: float = 1.0,
        mlp_mult: float = 1.0,
        readout_mult: float = 1.0,
        loss_mult: float = 1.0,
    ) -> None:
        super().__init__()
        multipliers = {
            "embedding_mult": embedding_mult,
            "residual_mult": residual_mult,
            "residual_attn_ratio": residual_attn_ratio,
            "mhsa_mult": mhsa_mult,
            "mlp_mult": mlp_mult,
            "readout_mult": readout_mult,
            "loss_mult": loss_mult,
        }
        _check_multipliers(multipliers)
        if residual_scaling is None:
            residual_scaling = transformer_residual_scaling_rule(
                residual_mult, residual_attn_ratio
            )
        elif residual_mult != 1 or residual_attn_ratio != 1:
            raise ValueError(
                "TransformerDecoder: got both a residual_scaling rule and "
                f"residual_mult={residual_mult!r}, "
                f"residual_attn_ratio={residual_attn_ratio!r}; give one or the "
                "other (a custom rule can take them itself, as "
                "transformer_residual_scaling_rule(residual_mult, "
                "residual_attn_ratio) does)"
            )
        self.embedding_mult = embedding_mult
        self.residual_mult = residual_mult
        self.residual_attn_ratio = residual_attn_ratio
        self.mhsa_mult = mhsa_mult
        self.mlp_mult = mlp_mult
        self.readout_mult = readout_mult
        self.loss_mult = loss_mult
        self.embedding = Embedding(vocab_size, hidden_size)
        self.layers = TransformerStack(
            layers,
            hidden_size,
            heads,
            is_causal=True,
            dropout_p=dropout_p,
            mhsa_mult=mhsa_mult,
            mlp_mult=mlp_mult,
            residual_scaling=residual_scaling,
        )
        self.final_norm = RMSNorm(hidden_size)
        self.projection = LinearReadout(hidden_size, vocab_size)

    def forward(self, input_ids: Tensor) -> Tensor:
        """Logits ``(batch, seq, vocab_size)`` for token ids ``(batch, seq)``."""
        x = self.embedding(input_ids)
        if self.embedding_mult != 1:  # skipped at 1: the default adds no op
            x = x * self.embedding_mult
        logits: Tensor = self.projection(self.final_norm(self.layers(x)))
        if self.readout_mult != 1:
            logits = logits * self.readout_mult
        return logits

    def loss(self, input_ids: Tensor) -> Tensor:
        """Mean next-token cross-entropy of ``input_ids`` ``(batch, seq + 1)``.

        Position ``t`` predicts token ``t + 1``; the last token is only a target.
        """
        if input_ids.dim() != 2 or input_ids.shape[1] < 2:
            raise ValueError(
                "TransformerDecoder.loss: expected input_ids of shape (batch, seq+1) "
                f"with seq+1 >= 2, got {tuple(input_ids.shape)}"
            )
        logits = self(input_ids[:, :-1])
        return U.cross_entropy(
            logits.flatten(end_dim=-2), input_ids[:, 1:].flatten(), mult=self.loss_mult
        )

    def extra_repr(self) -> str:
        # The temperatures show in the MHSA and MLP reprs.
        shown = (
            "embedding_mult",
            "residual_mult",
            "residual_attn_ratio",
            "readout_mult",
            "loss_mult",
        )
        return ", ".join(
            f"{name}={getattr(self, name)}"
            for name in shown
            if getattr(self, name) != 1
        )


def _check_multipliers(multipliers: dict[str, float]) -> None:
    for name, value in multipliers.items():
        number = isinstance(value, numbers.Real) and not isinstance(value, bool)
        if not (number and 0 < value < math.inf):
            raise ValueError(
                f"TransformerDecoder: {name} must be a positive, finite number "
                f"(a u-μP multiplier; 1 is the default), got {name}={value!r}"
            )
