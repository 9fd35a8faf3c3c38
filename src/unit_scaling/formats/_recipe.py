"""Recipes: which format each operand of each of a matrix product's three GEMMs
takes, and the options around them (Hadamard transform, per-tensor scale, layers
kept in high precision)."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from ._block import (
    MXFP4,
    MXFP6_E2M3,
    MXFP6_E3M2,
    MXFP8_E4M3,
    MXFP8_E5M2,
    NVFP4,
    BlockFormat,
    ScaleRule,
)

__all__ = [
    "MXFP4_RECIPE",
    "MXFP6_RECIPE",
    "MXFP8_E5M2_GRADIENTS_RECIPE",
    "MXFP8_RECIPE",
    "NVFP4_RECIPE",
    "Product",
    "Recipe",
    "random_hadamard",
    "recipe_with_rule",
]

Product = Literal["linear", "readout", "matmul", "attention", "conv"]
"""The kinds of matrix product a recipe may quantise: ``"linear"``, a product with
a parameter (linear layers, ``addmm``, a matmul or einsum with a weight);
``"readout"``, the u-μP readout (:func:`unit_scaling.functional.linear_readout`);
``"matmul"``, a product of two activations; ``"attention"``, the two products
inside ``scaled_dot_product_attention``; ``"conv"``, a convolution or its
transpose."""

_PRODUCTS: tuple[Product, ...] = ("linear", "readout", "matmul", "attention", "conv")
Operands = tuple[BlockFormat | None, BlockFormat | None]


@dataclass(frozen=True)
class Recipe:
    """The block formats of a matrix product's three GEMMs, operand by operand.

    For a product :math:`y = x W^T` (a linear layer; for ``y = L R`` read ``L``
    for ``x`` and ``R^T`` for ``W``), each GEMM's operands are quantised along
    that GEMM's contraction axis:

    .. math::
        y = Q_1(x)\\, Q_2(W)^T, \\qquad
        \\partial x = Q_3(\\partial y)\\, Q_4(W), \\qquad
        \\partial W = Q_5(\\partial y)^T\\, Q_6(x)

    ``Q1``, ``Q2`` along ``W``'s input features, ``Q3``, ``Q4`` along its output
    features, ``Q5``, ``Q6`` along the tokens (every leading axis of ``x``). A
    format's rounding (``BlockFormat.with_rounding``) and block shape
    (``block_dims=2``: square tiles, so ``W`` and ``W^T`` quantise alike) are the
    operand's; ``None`` keeps an operand in high precision. Biases, masks and the
    bias gradient stay in high precision.

    Args:
        forward: ``(Q1, Q2)``, the formats of ``(x, W)`` in the forward GEMM.
        grad_input: ``(Q3, Q4)``, of ``(∂y, W)`` in the input-gradient GEMM.
        grad_weight: ``(Q5, Q6)``, of ``(∂y, x)`` in the weight-gradient GEMM.
        products: the kinds of product quantised (see :data:`Product`); the
            others keep their precision.
        hadamard: apply a random 16x16 Hadamard transform
            (:func:`random_hadamard`) to both operands of the weight-gradient GEMM
            along its contraction (the tokens), in consecutive groups of 16 (a
            shorter tail is left as it is). It cancels in the product, up to
            quantisation, and spreads outliers across each block.
        tensor_amax: the amax from which formats with a per-tensor scale (E4M3
            block scales, as NVFP4) compute it: ``None`` for each tensor's
            current amax, or a number for a static scale.
        high_precision: module paths (``fnmatch`` patterns, e.g.
            ``"transformer.h.11.*"``) whose products keep their precision.
        high_precision_last: the fraction of the model's blocks (the items of
            its longest ``nn.ModuleList``), counted from the last and rounded
            up, whose products keep their precision.
        high_precision_head: keep the output head's products in high
            precision: the module a Hugging Face model's
            ``get_output_embeddings()`` returns, else the model's last
            ``nn.Linear`` (in registration order).

    Example::

        >>> recipe = Recipe(forward=(MXFP4, MXFP4), grad_input=(None, None),
        ...                 grad_weight=(None, None))
        >>> print(recipe)
        Recipe(E2M1FNN-RN/32/E8M0-floor x E2M1FNN-RN/32/E8M0-floor; -; -)
    """

    forward: Operands
    grad_input: Operands
    grad_weight: Operands
    products: frozenset[Product] = frozenset(_PRODUCTS)
    hadamard: bool = False
    tensor_amax: float | None = None
    high_precision: tuple[str, ...] = ()
    high_precision_last: float = 0.0
    high_precision_head: bool = False

    def __post_init__(self) -> None:
        for name in ("forward", "grad_input", "grad_weight"):
            pair = getattr(self, name)
            if not (
                isinstance(pair, tuple)
                and len(pair) == 2
                and all(f is None or isinstance(f, BlockFormat) for f in pair)
            ):
                raise TypeError(
                    f"{name} must be a pair of BlockFormat (or None for high "
                    f"precision), got {pair!r}"
                )
        products = frozenset(self.products)
        unknown = sorted(products - set(_PRODUCTS))
        if unknown:
            raise ValueError(
                f"products must be among {_PRODUCTS}, got unknown {unknown}"
            )
        object.__setattr__(self, "products", products)
        if isinstance(self.high_precision, str):
            raise TypeError(
                "high_precision must be a tuple of module-path patterns, got the "
                f"string {self.high_precision!r}: write ({self.high_precision!r},)"
            )
        object.__setattr__(self, "high_precision", tuple(self.high_precision))
        if not 0 <= self.high_precision_last <= 1:
            raise ValueError(
                "high_precision_last must be a fraction of the blocks in [0, 1], "
                f"got {self.high_precision_last}"
            )

    def keeping(self, *patterns: str) -> Recipe:
        """This recipe with the products of modules matching ``patterns`` kept in
        high precision too.

        Example::

            >>> MXFP8_RECIPE.keeping("lm_head").high_precision
            ('lm_head',)
        """
        return dataclasses.replace(
            self, high_precision=(*self.high_precision, *patterns)
        )

    def __str__(self) -> str:
        def pair(formats: Operands) -> str:
            if formats == (None, None):
                return "-"
            return " x ".join(str(f) if f else "high" for f in formats)

        gemms = (self.forward, self.grad_input, self.grad_weight)
        return f"Recipe({'; '.join(pair(g) for g in gemms)})"


@functools.lru_cache(maxsize=16)
def _hadamard(size: int, seed: int) -> Tensor:
    matrix = torch.ones(1, 1, device="cpu")  # cached; moved where it is used
    while matrix.shape[0] < size:  # Sylvester's construction
        matrix = torch.cat(
            [torch.cat([matrix, matrix], 1), torch.cat([matrix, -matrix], 1)], 0
        )
    generator = torch.Generator(device="cpu").manual_seed(seed)
    signs = torch.randint(0, 2, (size,), generator=generator, device="cpu") * 2 - 1
    randomised: Tensor = matrix * signs * size**-0.5
    return randomised


def random_hadamard(
    size: int = 16,
    seed: int = 0,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """A randomised Hadamard matrix :math:`H = n^{-1/2} H_n \\operatorname{diag}(s)`:
    Sylvester's :math:`H_n` with its columns' signs :math:`s` drawn from a CPU
    generator seeded with ``seed``. It is orthogonal, :math:`H H^T = I`, so
    :math:`(a H)(b H)^T = a b^T` for row vectors ``a``, ``b``.

    Args:
        size: a power of two.
        seed: the seed of the signs.
        device: where the matrix is made (drawn on the CPU, then moved).
        dtype: its dtype.

    Example::

        >>> h = random_hadamard(4)
        >>> torch.allclose(h @ h.T, torch.eye(4))
        True
    """
    if size < 1 or size & (size - 1):
        raise ValueError(f"size must be a power of two, got {size}")
    matrix: Tensor = _hadamard(size, seed).to(device=device, dtype=dtype)
    return matrix


def _rceil(fmt: BlockFormat) -> BlockFormat:
    return dataclasses.replace(fmt, scale_rule="rceil")


_MXFP8_E4M3 = _rceil(MXFP8_E4M3)
MXFP8_RECIPE = Recipe(
    forward=(_MXFP8_E4M3, _MXFP8_E4M3),
    grad_input=(_MXFP8_E4M3, _MXFP8_E4M3),
    grad_weight=(_MXFP8_E4M3, _MXFP8_E4M3),
)
"""MXFP8 with E4M3 elements everywhere, gradients included, and NVIDIA's
round-up scale rule (``"rceil"``): Transformer Engine's MXFP8 default. A scale
per block of 32 gives gradients the range that E5M2's extra exponent bit gave
them under one scale per tensor, so E4M3's extra mantissa bit is worth more.
Every matrix product is quantised.

MXFP8 and MXFP6 recipes take the round-up rule, not the OCP specification's
``"floor"`` (the rule of the :data:`MXFP8_E4M3`-style constants; MXFP4's recipe
keeps it, see :data:`MXFP4_RECIPE`): ``"floor"`` clips a
block's largest element when its mantissa is above the element's largest
(1.75 for E4M3, 1.5 for E2M1), by up to 12.5% (E4M3) or 25% (E2M1), and in
training that error is systematic. The gradient of a cross-entropy loss is the
plainest case: its largest element, ``p - 1`` at the target, is just below 1 in
magnitude, so ``"floor"`` shrinks it in every row (on the u-μP decoder at
initialisation, MXFP8 changes the weight gradients by 14-17% with ``"floor"``,
6-9% with ``"rceil"`` and 8-13% in per-tensor FP8). ``recipe_with_rule``
makes any recipe's formats follow another rule."""

_MXFP8_E5M2 = _rceil(MXFP8_E5M2)
MXFP8_E5M2_GRADIENTS_RECIPE = Recipe(
    forward=(_MXFP8_E4M3, _MXFP8_E4M3),
    grad_input=(_MXFP8_E5M2, _MXFP8_E4M3),
    grad_weight=(_MXFP8_E5M2, _MXFP8_E4M3),
)
"""MXFP8 with E4M3 weights and activations and E5M2 gradients (the incoming
gradient ``∂y`` in both backward GEMMs), round-up scales: the split of
per-tensor FP8 (:func:`unit_scaling.transforms.simulate_fp8`), for comparison
with it."""

MXFP6_RECIPE = Recipe(
    forward=(_rceil(MXFP6_E2M3), _rceil(MXFP6_E2M3)),
    grad_input=(_rceil(MXFP6_E3M2), _rceil(MXFP6_E2M3)),
    grad_weight=(_rceil(MXFP6_E3M2), _rceil(MXFP6_E2M3)),
)
"""MXFP6: E2M3 weights and activations (one more mantissa bit), E3M2 gradients
(more range, for their heavier tails); round-up scales."""

MXFP4_RECIPE = Recipe(
    forward=(MXFP4, MXFP4),
    grad_input=(MXFP4, MXFP4),
    grad_weight=(MXFP4, MXFP4),
)
"""MXFP4 (E2M1, blocks of 32, E8M0 scales) for every operand of every
product, with the OCP specification's floor scale rule. Unlike MXFP8, MXFP4
trains better with it than with the round-up rule (on the 2-layer decoder at
width 256, 400 steps: +19.0% against +31.7% of FP32's validation loss in u-μP,
+6.0% against +21.9% in SP; ``docs/results/block_formats.md``): E2M1's values
are 0.5-6 with one mantissa bit, and the round-up rule maps a block's amax
into ``(3, 6]``, often leaving the top of that short range unused, where the
floor rule's occasional clipping of the largest element (to 6, at most 25%)
costs less."""


def recipe_with_rule(recipe: Recipe, scale_rule: ScaleRule) -> Recipe:
    """``recipe`` with every E8M0-scaled format's scale rule set to
    ``scale_rule`` (formats with E4M3 scales, NVFP4's, are left as they are).

    Example::

        >>> recipe_with_rule(MXFP8_RECIPE, "floor").forward[0].scale_rule
        'floor'
    """

    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be a Recipe, got {type(recipe).__name__}")

    def change(fmt: BlockFormat | None) -> BlockFormat | None:
        if fmt is None or fmt.scale != "e8m0":
            return fmt
        return dataclasses.replace(fmt, scale_rule=scale_rule)

    def pair(formats: Operands) -> Operands:
        return (change(formats[0]), change(formats[1]))

    return dataclasses.replace(
        recipe,
        forward=pair(recipe.forward),
        grad_input=pair(recipe.grad_input),
        grad_weight=pair(recipe.grad_weight),
    )


_NVFP4_WEIGHT = dataclasses.replace(NVFP4, block_dims=2)
_NVFP4_GRADIENT = NVFP4.with_rounding("stochastic")

NVFP4_RECIPE = Recipe(
    forward=(NVFP4, _NVFP4_WEIGHT),
    grad_input=(_NVFP4_GRADIENT, _NVFP4_WEIGHT),
    grad_weight=(_NVFP4_GRADIENT, NVFP4),
    products=frozenset({"linear"}),
    hadamard=True,
    high_precision_last=0.15,
    high_precision_head=True,
)
"""NVIDIA's NVFP4 pre-training recipe ("Pretraining Large Language Models with
NVFP4", 2025): NVFP4 for the GEMMs of linear layers only, with 16x16 blocks for
weights and 1x16 for activations and gradients; stochastic rounding for the
gradients, round-to-nearest for weights and activations; a random 16x16
Hadamard transform on the weight-gradient GEMM's inputs; each tensor's per-tensor
scale from its current amax. The paper keeps in high precision the attention
products, the output head (``high_precision_head``; the u-μP readout is not a
``"linear"`` product in any case) and about 15% of the linear layers, most of
them at the end of the network: here the linear layers of the last 15% of the
blocks."""
