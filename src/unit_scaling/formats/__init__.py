"""Number formats and quantisation, to simulate low-precision training.

:class:`FPFormat` describes a sign-exponent-mantissa format (E4M3, E5M2, ...) and
rounds tensors onto it, saturating at its largest value, keeping subnormals, with
round-to-nearest-even or stochastic rounding. Values are simulated: the result is a
tensor of the input's dtype holding only values the format can represent.

Three encodings are supported. The default is IEEE-like: the top exponent is
reserved for infinities and NaN, so E4M3 reaches ``240``. ``finite=True`` is the
encoding of the OCP 8-bit E4M3 format used by hardware (``torch.float8_e4m3fn``):
no infinities, the top exponent holds numbers, and only its all-ones mantissa is
NaN, so E4M3 reaches ``448``. ``finite=True, nan=False`` makes every code a number,
as the OCP MX FP6 and FP4 elements (:data:`FP6_E3M2`, :data:`FP6_E2M3`,
:data:`FP4_E2M1`). OCP E5M2 is IEEE-like. :data:`FP8_E4M3` and :data:`FP8_E5M2`
are the OCP FP8 formats with round-to-nearest; they round exactly as the native
casts. :class:`IntFormat` is a fixed-point element (:data:`INT8`, MXINT8's).

:class:`BlockFormat` is a block-scaled format: OCP Microscaling (:data:`MXFP8_E4M3`,
:data:`MXFP8_E5M2`, :data:`MXFP6_E3M2`, :data:`MXFP6_E2M3`, :data:`MXFP4`,
:data:`MXINT8`) and NVIDIA's :data:`NVFP4`. Its ``quantise`` gives the values the
hardware computes with, its ``encode`` the bytes it stores.

A :class:`Recipe` names the block format of each operand of each of a matrix
product's three GEMMs (forward, input gradient, weight gradient), each quantised
along its own contraction: :data:`MXFP8_RECIPE`, :data:`MXFP8_E5M2_GRADIENTS_RECIPE`,
:data:`MXFP6_RECIPE`, :data:`MXFP4_RECIPE` and NVIDIA's :data:`NVFP4_RECIPE`.
:func:`quantised_linear`, :func:`quantised_matmul`, :func:`quantised_einsum` and
:func:`quantised_attention` compute products that way;
:func:`unit_scaling.transforms.simulate_format` applies a recipe to a model.
:func:`quantisation_statistics` measures what a block format does to a tensor
(flushed and saturated fractions, MSE and SQNR, blocks' dynamic range), as
``track_scales(model, block_format=...)`` does for every tensor of a model.

Quantisation is one fused pass over memory: a kernel compiled with ``torch.compile``
lazily, once per input dtype (the format is passed as data, so all formats share
it), for tensors of at least ``2**16`` elements. Smaller tensors, code being traced
by ``torch.compile`` (which fuses the kernel into its own graph), and machines where
compilation fails run the same kernel eagerly.
"""

from ._block import (
    FP4_E2M1,
    FP6_E2M3,
    FP6_E3M2,
    INT8,
    MXFP4,
    MXFP6_E2M3,
    MXFP6_E3M2,
    MXFP8_E4M3,
    MXFP8_E5M2,
    MXINT8,
    NVFP4,
    BlockEncoding,
    BlockFormat,
)
from ._fp import FP8_E4M3, FP8_E5M2, FPFormat, format_to_tuple, tuple_to_format
from ._int import IntFormat
from ._products import (
    quantised_attention,
    quantised_conv,
    quantised_einsum,
    quantised_linear,
    quantised_matmul,
)
from ._recipe import (
    MXFP4_RECIPE,
    MXFP6_RECIPE,
    MXFP8_E5M2_GRADIENTS_RECIPE,
    MXFP8_RECIPE,
    NVFP4_RECIPE,
    Product,
    Recipe,
    random_hadamard,
    recipe_with_rule,
)
from ._statistics import QuantisationStatistics, quantisation_statistics

__all__ = [
    "FP4_E2M1",
    "FP6_E2M3",
    "FP6_E3M2",
    "FP8_E4M3",
    "FP8_E5M2",
    "INT8",
    "MXFP4",
    "MXFP4_RECIPE",
    "MXFP6_E2M3",
    "MXFP6_E3M2",
    "MXFP6_RECIPE",
    "MXFP8_E4M3",
    "MXFP8_E5M2",
    "MXFP8_E5M2_GRADIENTS_RECIPE",
    "MXFP8_RECIPE",
    "MXINT8",
    "NVFP4",
    "NVFP4_RECIPE",
    "BlockEncoding",
    "BlockFormat",
    "FPFormat",
    "IntFormat",
    "Product",
    "QuantisationStatistics",
    "Recipe",
    "format_to_tuple",
    "quantisation_statistics",
    "quantised_attention",
    "quantised_conv",
    "quantised_einsum",
    "quantised_linear",
    "quantised_matmul",
    "random_hadamard",
    "recipe_with_rule",
    "tuple_to_format",
]
