"""The capture step that prepares a module: layers TorchDynamo cannot see into
rewritten as the functions they compute (:func:`prepare`).

TorchDynamo records ``nn.MultiheadAttention`` as one opaque call, which unit
scaling cannot see into; :class:`AttentionFunctions` computes the same function
with ``F.linear`` and ``F.scaled_dot_product_attention`` on the same parameters,
and is validated numerically against the layer before it replaces it. (Layers
other libraries write by hand, such as RMSNorm, tanh GELU or GPT-2's ``Conv1D``,
need no such rewrite: the graph rules of ``_unit.patterns`` and ``_unit.recognise``
recognise what they compute.) User-listed classes in ``replace=`` are swapped
for :class:`CallReplacement` here too.

The engine runs this step on its copy of the module, before anything is
captured, for a transform that asks for it (``Transform.rewrite``).
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..._standins import normal, seeded
from ..._torch_internals import mha_packed_projection
from .fallbacks import fell_back

__all__ = ["LibraryRewrite", "Prepared", "prepare", "rewrite_library_modules"]

logger = logging.getLogger("unit_scaling.transforms.unit_scale")


def _additive(mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """A boolean "masked out" mask (nn.MultiheadAttention's convention) as
    additive ``-inf``; float masks are already additive."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
        mask, float("-inf")
    )


class AttentionFunctions(nn.Module):
    """:class:`torch.nn.MultiheadAttention` written with ``F.linear`` and
    ``F.scaled_dot_product_attention`` on the same parameters.

    TorchDynamo records ``nn.MultiheadAttention`` as one opaque call, which unit
    scaling cannot see into; this module computes the same function with the ops
    it recognises. Attention weights (``need_weights=True``) are computed
    separately and returned unscaled, as torch's layer does.
    """

    # nn.TransformerEncoderLayer/TransformerEncoder read this to decide on their
    # fused fast path, which would bypass this module: keep them off it.
    _qkv_same_embed_dim = False

    def __init__(self, mha: nn.MultiheadAttention) -> None:
        super().__init__()
        self.embed_dim, self.num_heads = mha.embed_dim, mha.num_heads
        self.dropout, self.batch_first = mha.dropout, mha.batch_first
        self.packed = mha_packed_projection(mha)
        self.in_proj_weight = mha.in_proj_weight
        self.q_proj_weight = mha.q_proj_weight
        self.k_proj_weight = mha.k_proj_weight
        self.v_proj_weight = mha.v_proj_weight
        self.in_proj_bias = mha.in_proj_bias
        self.out_proj = mha.out_proj

    def _project(
        self, query: Tensor, key: Tensor, value: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        biases = (
            self.in_proj_bias.chunk(3)
            if self.in_proj_bias is not None
            else (None, None, None)
        )
        if self.packed and query is key and key is value:
            qkv = F.linear(query, self.in_proj_weight, self.in_proj_bias)
            q, k, v = qkv.chunk(3, dim=-1)
            return q, k, v
        if self.packed:
            weights = self.in_proj_weight.chunk(3)
        else:
            weights = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)
        q, k, v = (
            F.linear(x, w, b)
            for x, w, b in zip((query, key, value), weights, biases, strict=True)
        )
        return q, k, v

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = True,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        if not self.batch_first:
            query, key, value = (x.transpose(0, 1) for x in (query, key, value))
        batch, target, _ = query.shape
        source = key.shape[1]
        heads, head_dim = self.num_heads, self.embed_dim // self.num_heads
        q, k, v = (
            x.reshape(batch, -1, heads, head_dim).transpose(1, 2)
            for x in self._project(query, key, value)
        )
        mask = _additive(attn_mask, q.dtype)
        if mask is not None:
            mask = (
                mask.view(batch, heads, target, source)
                if mask.dim() == 3
                else (mask.view(1, 1, target, source))
            )
        padding = _additive(key_padding_mask, q.dtype)
        if padding is not None:
            padding = padding.view(batch, 1, 1, source)
            mask = padding if mask is None else mask + padding
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=is_causal and mask is None,
        )
        out = self.out_proj(out.transpose(1, 2).reshape(batch, target, self.embed_dim))
        if not self.batch_first:
            out = out.transpose(0, 1)
        weights = None
        if need_weights:
            weights = attention_weights(q, k, mask, is_causal and mask is None)
            weights = weights.mean(dim=1) if average_attn_weights else weights
        return out, weights


def attention_weights(
    q: Tensor, k: Tensor, mask: Tensor | None, is_causal: bool
) -> Tensor:
    """Softmax attention probabilities (kept opaque while tracing)."""
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    if is_causal:
        causal = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device)
        scores = scores.masked_fill(~causal.tril(), float("-inf"))
    if mask is not None:
        scores = scores + mask
    weights: Tensor = scores.softmax(dim=-1)
    return weights


class CallReplacement(nn.Module):
    """A module whose forward calls a user-supplied replacement function.

    The replaced module is kept as a child so its parameters stay registered.
    """

    def __init__(self, original: nn.Module, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.original = original
        self.fn = fn

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


def _attention_probe(module: nn.Module) -> Tensor:
    assert isinstance(module, (nn.MultiheadAttention, AttentionFunctions))
    weight = module.out_proj.weight
    shape = (2, 5, module.embed_dim) if module.batch_first else (5, 2, module.embed_dim)
    x = normal(shape, seeded(0), weight.device, weight.dtype)
    padding = torch.zeros(2, 5, dtype=torch.bool, device=weight.device)
    padding[0, -1] = True
    out: Tensor = module(x, x, x, key_padding_mask=padding, need_weights=False)[0]
    return out


def _candidate(module: nn.Module) -> tuple[nn.Module, Any] | None:
    """A replacement for ``module`` and how to validate it: an input shape, or a
    function that runs a module on a fixed random input."""
    if isinstance(module, nn.MultiheadAttention):
        supported = module.bias_k is None and not module.add_zero_attn
        return (AttentionFunctions(module), _attention_probe) if supported else None
    return None


def _agrees(
    original: nn.Module, replacement: nn.Module, probe: Callable[[nn.Module], Any]
) -> bool:
    """Whether both compute the same on a random input (in eval mode: no
    dropout): ``probe`` runs a module on a fixed input."""
    reference = next(original.parameters(), None)
    if reference is not None and reference.device.type == "meta":
        return False
    modes = {m: m.training for m in (*original.modules(), *replacement.modules())}
    original.eval()
    replacement.eval()
    try:
        with torch.no_grad():
            expected, actual = probe(original), probe(replacement)
    except Exception as error:  # a layer with a different calling convention
        fell_back("library rewrite", type(original).__name__, error)
        return False
    finally:
        for m, mode in modes.items():
            m.training = mode
    return (
        isinstance(expected, Tensor)
        and expected.shape == actual.shape
        and bool(torch.allclose(expected, actual, rtol=1e-4, atol=1e-5))
    )


# Library functions kept whole while tracing, by name. Rotary embeddings rotate
# q and k (an exact, norm-preserving map); kept whole they are one op of unit gain
# (calibration confirms it), instead of a dozen slices and products whose
# intermediate gradients are not meaningful scales.
_OPAQUE_FUNCTION_NAMES = ("apply_rotary_pos_emb",)


def opaque_rewrite_functions() -> tuple[Callable[..., Any], ...]:
    """Functions of our rewrites that must stay whole while tracing."""
    return (attention_weights,)


def opaque_library_functions(module: nn.Module) -> tuple[Callable[..., Any], ...]:
    """Known library functions defined next to ``module``'s submodule classes."""
    found: dict[int, Callable[..., Any]] = {}
    for sub in module.modules():
        defining = sys.modules.get(type(sub).__module__)
        for name in _OPAQUE_FUNCTION_NAMES:
            fn = getattr(defining, name, None)
            if callable(fn):
                found[id(fn)] = fn
    return tuple(found.values())


def rewrite_library_modules(
    module: nn.Module, replacements: dict[type[nn.Module], Callable[..., Any]]
) -> set[type[nn.Module]]:
    """Swap known hand-written layers (and user-listed classes) in ``module``.

    Returns the user-listed classes that matched a submodule.
    """
    matched: set[type[nn.Module]] = set()
    # Instances of one class with the same shapes run the same code: validate once.
    verdicts: dict[tuple[Any, ...], bool] = {}
    for parent_name, parent in list(module.named_modules()):
        for child_name, child in list(parent.named_children()):
            path = f"{parent_name}.{child_name}" if parent_name else child_name
            new: nn.Module | None = None
            for cls, fn in replacements.items():
                if isinstance(child, cls):
                    matched.add(cls)
                    new = CallReplacement(child, fn)
                    logger.info(
                        "replacing module: %s (%s) with %s",
                        path,
                        type(child).__name__,
                        getattr(fn, "__name__", fn),
                    )
                    break
            else:
                found = _candidate(child)
                if found is not None:
                    candidate, probe = found
                    key = (
                        type(child),
                        type(candidate),
                        probe,
                        tuple((p.dtype, p.shape) for p in child.parameters()),
                    )
                    if key not in verdicts:
                        verdicts[key] = _agrees(child, candidate, probe)
                    if verdicts[key]:
                        new = candidate
                        logger.info(
                            "replacing module: %s (%s) with %s",
                            path,
                            type(child).__name__,
                            type(candidate).__name__,
                        )
                    else:
                        logger.info(
                            "keeping module: %s (%s): its output differs from %s",
                            path,
                            type(child).__name__,
                            type(candidate).__name__,
                        )
            if new is not None:
                setattr(parent, child_name, new)
    return matched


@dataclasses.dataclass(frozen=True)
class LibraryRewrite:
    """What :func:`prepare` does to a transform's copy of the module: the known
    library layers rewritten, and each submodule of a class in ``replacements``
    replaced by a call of its function (``unit_scale``'s ``replace=``)."""

    replacements: tuple[tuple[type[nn.Module], Callable[..., Any]], ...] = ()


@dataclasses.dataclass(frozen=True)
class Prepared:
    """What :func:`prepare` found: the functions to keep whole while tracing
    (library functions defined beside the module's layers, and our rewrites'
    own), and the classes of ``replacements`` that matched a submodule."""

    opaque: tuple[Callable[..., Any], ...] = ()
    matched: frozenset[type[nn.Module]] = frozenset()


def prepare(module: nn.Module, rewrite: LibraryRewrite) -> Prepared:
    """Prepare ``module`` (the engine's own copy) for capture, in place."""
    opaque = (*opaque_library_functions(module), *opaque_rewrite_functions())
    matched = rewrite_library_modules(module, dict(rewrite.replacements))
    return Prepared(opaque, frozenset(matched))
