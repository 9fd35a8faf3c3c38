"""Real FP8 training with static unit scales: ``convert_to_float8_training``.

A unit-scaled linear layer's operands already sit near unit scale, so its three
matrix products can run in FP8 through ``torch._scaled_mm`` with **no per-tensor
scale bookkeeping**: a saturating cast of each operand, then one scaled GEMM
whose dequantisation scale is the op's own static scale (``alpha`` forward,
``beta_x`` and ``beta_W`` backward). No amax reduction, no extra pass over a
tensor, no host synchronisation — unlike dynamic ("current") scaling, which
reduces every operand to its absolute maximum before each GEMM.

The GEMMs, for ``y = alpha (x Wᵀ + b)``:

* forward: ``E4M3(x) @ E4M3(W)ᵀ`` with scale ``alpha``;
* input gradient: ``E5M2(g) @ E4M3(W)`` with scale ``beta_x``;
* weight gradient: ``E5M2(g)ᵀ @ E4M3(x)`` with scale ``beta_W``
  (E5M2 × E5M2 is not a cuBLAS FP8 GEMM).

Casts saturate (to ±448 for E4M3, ±57344 for E5M2), as the simulation in
:func:`unit_scaling.transforms.simulate_fp8` does, so a real FP8 layer computes
what the simulated one computes, up to the order of accumulation.

Example::

    >>> model = uu.TransformerDecoder(64, 256, layers=2, heads=4)
    >>> model = convert_to_float8_training(model)
    >>> type(model.layers[0].mlp.linear_1).__name__
    'Float8Linear'
    >>> model.loss(torch.randint(256, (2, 33))).shape
    torch.Size([])
"""

from __future__ import annotations

from ._attention import scaled_dot_product_attention
from ._config import Float8Config
from ._convert import convert_to_float8_training
from ._linear import linear, linear_readout
from ._modules import Float8Linear, Float8LinearReadout, Float8MHSA

__all__ = [
    "Float8Config",
    "Float8Linear",
    "Float8LinearReadout",
    "Float8MHSA",
    "convert_to_float8_training",
    "linear",
    "linear_readout",
    "scaled_dot_product_attention",
]
