"""Block-scaled formats: OCP Microscaling (MX) and NVIDIA's NVFP4, simulated exactly.

Where the references disagree (with each other or with the OCP MX v1.0
specification), this module follows, and its tests check against:

1. All-zero blocks (every rule but ``"nearest"``): scale code 0 (``2^-127``), as
   torchao, ``microxcaling`` and Transformer Engine; the specification leaves
   the scale free. NVFP4: block scale 0, as Transformer Engine (torchao clamps
   its block scales to at least ``2^-6``, E4M3's smallest normal, and gives an
   all-zero tensor NaN block scales, from ``0 / 0``).
2. A block whose scale is ``2^-127`` but which is not all zero (``"floor"``,
   ``"ceil"``, ``"even"``): elements are ``V / 2^-127`` as the specification
   says; torchao divides by ``2^-126`` (float32's smallest normal), halving them.
   ``"rceil"``: elements are ``V * 1``, as Transformer Engine's ``exp2f_rcp``
   (and torchao, which copies it): such blocks (amax at most ``max * 2^-127``)
   flush to zero, as NVIDIA's kernels do.
3. ``"rceil"``'s ``ceil(log2(amax / max))`` is exact here, on the float32
   quotient, as NVIDIA's ``cvt.rp.satfinite.ue8m0x2.f32``; torchao's CPU
   fallback takes ``ceil`` of a float32 ``log2``, which rounds to the power of
   two below when the quotient is within ~``2^-22`` relative of one above it
   (then it saturates the block's largest element, which NVIDIA never does).
4. Infinite amax: ``"floor"``, ``"ceil"``, ``"even"`` give the NaN scale 0xFF
   (the whole block decodes to NaN), as ``microxcaling``, the specification's
   reference (the power of two ``floor(log2(inf))`` is not representable);
   torchao reads infinity's exponent bits as ``2^128`` and stores the finite
   scale ``2^(128 - emax)``, saturating the infinity. ``"rceil"``: code 254
   (``2^127``), as ``cvt.rp.satfinite`` and torchao, infinities saturating.
   NaN anywhere in a block: code 0xFF for every rule, as all references.
5. Element codes of NaN in a format without NaN (E3M2, E2M3, E2M1, INT8): code
   0, as Transformer Engine's E2M1 reference (torchao's cast gives a meaningless
   code; the block's NaN scale makes the elements irrelevant in any case).
6. NVFP4 follows the order of operations of Transformer Engine's reference
   (``quantization_ref_nvfp4.py``): global encode scale ``448*6 / amax``,
   block scale ``amax_b * (enc * fp32(1/6))`` rounded to E4M3, element scale
   ``1 / (s_b * (1 / enc))``; torchao (``nvfp4_quantize``) divides in another
   order (``(amax_b / 6) / (amax / 2688)``, elements ``x * ((1/pts) / s_b)``),
   which changes the last bit of some block scales and hence elements.
   Transformer Engine's reference encodes ``-0.0`` as ``+0`` (code 0); this
   module and torchao keep its sign (code 8).
7. INT8 saturates symmetrically at ``127/64`` (code -128 unused), as
   ``microxcaling``; torchao has no MXINT8.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from ._block_native import native_quantise
from ._codes import (
    E8M0_BIAS,
    E8M0_NAN,
    ElementFormat,
    e8m0_values,
    element_codes,
    element_emax,
    element_mantissa_bits,
    element_table,
    pow2,
)
from ._fp import FP8_E4M3, FP8_E5M2, FPFormat, Rounding
from ._int import IntFormat

__all__ = [
    "FP4_E2M1",
    "FP6_E2M3",
    "FP6_E3M2",
    "INT8",
    "MXFP4",
    "MXFP6_E2M3",
    "MXFP6_E3M2",
    "MXFP8_E4M3",
    "MXFP8_E5M2",
    "MXINT8",
    "NVFP4",
    "BlockEncoding",
    "BlockFormat",
]

ScaleRule = Literal["floor", "ceil", "even", "rceil", "nearest"]
_E8M0_RULES = ("floor", "ceil", "even", "rceil")
_FLOAT32_MAX = torch.finfo(torch.float32).max
_E4M3_MAX = 448.0


@dataclass(frozen=True)
class BlockFormat:
    """A block-scaled format: blocks of elements along a contraction axis share
    one scale, and each element is rounded onto ``element`` after dividing by it.

    MX (``scale="e8m0"``): a block ``V`` gets the power of two
    :math:`X = 2^{s}` and elements :math:`P_i = q(V_i / X)`, with, for
    :math:`a = \\max_i |V_i|` and :math:`e_{max}` the exponent of the element's
    largest power of two, the scale rule

    - ``"floor"`` (OCP MX v1.0): :math:`s = \\lfloor \\log_2 a \\rfloor - e_{max}`,
      which can saturate a block's largest values;
    - ``"ceil"``: :math:`s = \\lceil \\log_2 a \\rceil - e_{max}`;
    - ``"even"``: ``"floor"`` of ``a`` rounded (half up) to the element's
      mantissa width, so a largest value that rounds up is not saturated;
    - ``"rceil"`` (NVIDIA): :math:`s = \\lceil \\log_2 (a / \\max) \\rceil`, with
      ``a / max`` in float32, which never saturates;

    clamped to E8M0's range :math:`[-127, 127]`, with NaN (code 0xFF) for a
    block holding NaN. NVFP4 (``scale="e4m3"``, ``scale_rule="nearest"``): the
    block scale is ``amax / max`` relative to a float32 per-tensor scale
    ``amax_tensor / (448 * max)``, rounded to nearest E4M3.

    A contraction length that is not a multiple of ``block_size`` is padded
    with zeros to the next multiple (which changes no block's amax), and the
    padding is dropped from the result. ``block_dims=2`` makes square blocks of
    ``block_size`` x ``block_size`` over the last two axes, so a matrix and its
    transpose quantise alike (NVIDIA's recipe for NVFP4 weights).

    Args:
        element: the element format: an :class:`FPFormat` or :class:`IntFormat`
            of at most 8 bits; its rounding is the elements' rounding.
        block_size: elements per block along the contraction axis.
        scale: ``"e8m0"`` (MX) or ``"e4m3"`` (NVFP4, with a per-tensor scale).
        scale_rule: as above; ``"nearest"`` with ``"e4m3"`` only.
        block_dims: 1 (blocks along the contraction axis) or 2 (square blocks).

    Example::

        >>> x = torch.tensor([[1.0, 0.1, -3.3, 500.0]])
        >>> MXFP4.quantise(x)
        tensor([[  0.,   0.,  -0., 384.]])
        >>> dataclasses.replace(MXFP4, block_size=2).quantise(x).tolist()
        [[1.0, 0.125, -0.0, 384.0]]
        >>> str(NVFP4)
        'E2M1FNN-RN/16/E4M3-nearest'
    """

    element: ElementFormat
    block_size: int = 32
    scale: Literal["e8m0", "e4m3"] = "e8m0"
    scale_rule: ScaleRule = "floor"
    block_dims: Literal[1, 2] = 1

    def __post_init__(self) -> None:
        if not isinstance(self.element, FPFormat | IntFormat):
            raise TypeError(
                "element must be an FPFormat or IntFormat, got "
                f"{type(self.element).__name__}"
            )
        if self.element.bits > 8:
            raise ValueError(
                f"element must have at most 8 bits, got {self.element} "
                f"({self.element.bits} bits): block formats store bytes"
            )
        if not isinstance(self.block_size, int) or isinstance(self.block_size, bool):
            raise TypeError(
                f"block_size must be an int, got {type(self.block_size).__name__}"
            )
        if self.block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {self.block_size}")
        if self.scale not in ("e8m0", "e4m3"):
            raise ValueError(f"scale must be 'e8m0' or 'e4m3', got {self.scale!r}")
        rules = _E8M0_RULES if self.scale == "e8m0" else ("nearest",)
        if self.scale_rule not in rules:
            raise ValueError(
                f"scale_rule for an {self.scale!r} scale must be one of {rules}, "
                f"got {self.scale_rule!r}"
            )
        if self.block_dims not in (1, 2):
            raise ValueError(f"block_dims must be 1 or 2, got {self.block_dims!r}")

    @property
    def rounding(self) -> Rounding:
        """The elements' rounding, ``"nearest"`` or ``"stochastic"``."""
        return self.element.rounding

    def with_rounding(self, rounding: Rounding) -> BlockFormat:
        """This format with its elements rounded by ``rounding``.

        Example::

            >>> MXFP4.with_rounding("stochastic").rounding
            'stochastic'
        """
        element = dataclasses.replace(self.element, rounding=rounding)
        return dataclasses.replace(self, element=element)

    def __str__(self) -> str:
        size = str(self.block_size)
        if self.block_dims == 2:
            size = f"{size}x{size}"
        return f"{self.element}/{size}/{self.scale.upper()}-{self.scale_rule}"

    def quantise(
        self, x: Tensor, axis: int = -1, *, tensor_amax: float | Tensor | None = None
    ) -> Tensor:
        """The values the hardware computes with: ``x`` rounded to this format
        along contraction axis ``axis``, in ``x``'s dtype, without gradient.

        Inputs are read as float32 (float64 is rounded to it, as hardware
        quantisers read float32); the dequantised values are exact in float32
        (NVFP4: one rounding, of the product by the per-tensor scale), and
        rounded again only if ``x``'s dtype cannot hold them.

        Args:
            x: a floating-point tensor of at least one dimension.
            axis: the contraction axis, along which blocks run (with
                ``block_dims=2``, one of the last two axes).
            tensor_amax: NVFP4 only: the amax from which the per-tensor scale
                is computed (default: ``x``'s own, as NVIDIA's recipe). A static
                value here makes a static per-tensor scale.

        Example::

            >>> MXFP8_E4M3.quantise(torch.tensor([0.3, 100.0]))  # 100 * 4 ties
            tensor([ 0.3125, 96.0000])
        """
        if isinstance(x, Tensor) and x.is_floating_point() and x.dtype != torch.float64:
            fast = _quantise_native(self, x, axis, tensor_amax)
            if fast is not None:
                return fast
        blocked = quantise_blocks(self, x, axis, tensor_amax)
        values = blocked.elements * blocked.scales.unsqueeze(-1)
        if blocked.tensor_scale is not None:
            values = values * blocked.tensor_scale
        return _unblock(values, blocked.layout).to(x.dtype)

    def encode(
        self, x: Tensor, axis: int = -1, *, tensor_amax: float | Tensor | None = None
    ) -> BlockEncoding:
        """The bytes the hardware stores for ``x``: element and scale codes.

        Arguments as :meth:`quantise`, of which ``encode(x).decode(x.dtype)`` is
        the value (with round-to-nearest elements).

        Example::

            >>> enc = MXFP4.encode(torch.tensor([1.0, -3.0, 0.4]))
            >>> enc.elements, enc.scales
            (tensor([ 4, 15,  2], dtype=torch.uint8), tensor([126], dtype=torch.uint8))
        """
        blocked = quantise_blocks(self, x, axis, tensor_amax)
        elements = _unblock(
            element_codes(self.element, blocked.elements), blocked.layout
        )
        return BlockEncoding(
            self,
            elements,
            _unblock_scales(blocked.scale_codes, blocked.layout),
            blocked.tensor_scale,
            blocked.layout.axis,
        )


@dataclass(frozen=True)
class BlockEncoding:
    """The stored form of a block-quantised tensor, from :meth:`BlockFormat.encode`.

    Attributes:
        format: the :class:`BlockFormat`.
        elements: ``uint8`` element codes, in the input's shape: FP codes as sign,
            exponent, mantissa in the low bits (E2M1 in 4, E3M2/E2M3 in 6), INT8
            two's complement.
        scales: ``uint8`` scale codes, in the input's shape with the contraction
            axis (``block_dims=2``: the last two axes) counting blocks: E8M0
            (``2^(code - 127)``, 0xFF NaN) or ``torch.float8_e4m3fn`` bits.
        tensor_scale: NVFP4's float32 per-tensor decode scale (else ``None``).
        axis: the contraction axis, non-negative.

    Example::

        >>> enc = NVFP4.encode(torch.tensor([[6.0, -1.0, 0.1]]))
        >>> enc.elements.tolist(), enc.scales.view(torch.float8_e4m3fn).tolist()
        ([[7, 10, 0]], [[448.0]])
        >>> enc.decode()  # one rounding: by the per-tensor scale 1 / (448 * 6 / 6)
        tensor([[ 6.0000, -1.0000,  0.0000]])
    """

    format: BlockFormat
    elements: Tensor
    scales: Tensor
    tensor_scale: Tensor | None
    axis: int

    def decode(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """The values these codes stand for, in ``dtype``."""
        fmt = self.format
        table = element_table(fmt.element).to(self.elements.device)
        values, layout = to_blocks(table[self.elements.long()], fmt, self.axis)
        if fmt.scale == "e8m0":
            scales = e8m0_values(_block_scales(self.scales, layout))
        else:
            scales = _block_scales(self.scales, layout).view(torch.float8_e4m3fn)
        out = values * scales.float().unsqueeze(-1)
        if self.tensor_scale is not None:
            out = out * self.tensor_scale
        return _unblock(out, layout).to(dtype)


class _Layout(NamedTuple):
    """How a tensor was cut into blocks: ``(*lead, *grid, elements)``."""

    dims: int  # 1 or 2
    axis: int  # the contraction axis, non-negative
    shape: tuple[int, ...]  # the input's, with a 1-D axis moved last
    padded: tuple[int, ...]  # the last ``dims`` sizes after padding


class _Blocked(NamedTuple):
    elements: Tensor  # float32 element values, (*lead, *grid, elements)
    scales: Tensor  # float32 block scales, (*lead, *grid)
    scale_codes: Tensor  # uint8, (*lead, *grid)
    tensor_scale: Tensor | None
    layout: _Layout


def normalise_axis(x: Tensor, fmt: BlockFormat, axis: int) -> int:
    if not isinstance(axis, int) or isinstance(axis, bool):
        raise TypeError(f"axis must be an int, got {type(axis).__name__}")
    if x.dim() < fmt.block_dims:
        raise ValueError(
            f"x must have at least {fmt.block_dims} dimension(s) for {fmt}, "
            f"got shape {tuple(x.shape)}"
        )
    if not -x.dim() <= axis < x.dim():
        raise ValueError(f"axis {axis} is out of range for shape {tuple(x.shape)}")
    axis %= x.dim()
    if fmt.block_dims == 2 and axis < x.dim() - 2:
        raise ValueError(
            f"axis must be one of the last two axes for 2-D blocks, got {axis} "
            f"for shape {tuple(x.shape)}: move the contraction axis there first"
        )
    return axis


def to_blocks(x: Tensor, fmt: BlockFormat, axis: int) -> tuple[Tensor, _Layout]:
    """``x`` as ``(*lead, *grid, elements)``, zero-padded to whole blocks."""
    b = fmt.block_size
    if fmt.block_dims == 1:
        x = x.movedim(axis, -1)
    sizes = x.shape[-fmt.block_dims :]
    padded = tuple(-(-n // b) * b for n in sizes)
    pad: list[int] = []
    for n, p in zip(reversed(sizes), reversed(padded), strict=True):
        pad += [0, p - n]
    if any(pad):
        x = torch.nn.functional.pad(x, pad)
    lead = x.shape[: x.dim() - fmt.block_dims]
    if fmt.block_dims == 1:
        blocks = x.reshape(*lead, padded[0] // b, b)
    else:
        rows, cols = padded[0] // b, padded[1] // b
        blocks = x.reshape(*lead, rows, b, cols, b).transpose(-3, -2)
        blocks = blocks.reshape(*lead, rows, cols, b * b)
    return blocks, _Layout(fmt.block_dims, axis, (*lead, *sizes), padded)


def _unblock(blocks: Tensor, layout: _Layout) -> Tensor:
    """The inverse of :func:`_blocks`: padding dropped, axes restored."""
    lead = layout.shape[: len(layout.shape) - layout.dims]
    b = blocks.shape[-1] if layout.dims == 1 else math.isqrt(blocks.shape[-1])
    if layout.dims == 1:
        x = blocks.reshape(*lead, layout.padded[0])[..., : layout.shape[-1]]
        return x.movedim(-1, layout.axis)
    rows, cols = layout.padded[0] // b, layout.padded[1] // b
    x = blocks.reshape(*lead, rows, cols, b, b).transpose(-3, -2)
    x = x.reshape(*lead, *layout.padded)
    return x[..., : layout.shape[-2], : layout.shape[-1]]


def _unblock_scales(scales: Tensor, layout: _Layout) -> Tensor:
    return scales.movedim(-1, layout.axis) if layout.dims == 1 else scales


def _block_scales(scales: Tensor, layout: _Layout) -> Tensor:
    return scales.movedim(layout.axis, -1) if layout.dims == 1 else scales


def quantise_blocks(
    fmt: BlockFormat, x: Tensor, axis: int, tensor_amax: float | Tensor | None
) -> _Blocked:
    if not isinstance(x, Tensor) or not x.is_floating_point():
        kind = x.dtype if isinstance(x, Tensor) else type(x).__name__
        raise TypeError(f"x must be a floating-point tensor, got {kind}")
    if tensor_amax is not None and fmt.scale != "e4m3":
        raise ValueError(
            f"tensor_amax only applies to formats with a per-tensor scale (E4M3 "
            f"block scales, as NVFP4); {fmt} has none"
        )
    axis = normalise_axis(x, fmt, axis)
    blocks, layout = to_blocks(x.detach().float(), fmt, axis)
    amax = (
        blocks.abs().amax(-1) if blocks.numel() else blocks.new_zeros(blocks.shape[:-1])
    )
    if fmt.scale == "e8m0":
        codes = _e8m0_codes(fmt, amax)
        scales = e8m0_values(codes)
        if fmt.scale_rule == "rceil":
            # Transformer Engine's exp2f_rcp: 1 for the smallest scale (see 2.)
            inverse = torch.where(codes == 0, 1.0, pow2(E8M0_BIAS - codes))
        else:
            inverse = pow2(E8M0_BIAS - codes)
        inverse = torch.where(codes == E8M0_NAN, math.nan, inverse)
        elements = fmt.element.quantise(blocks * inverse.unsqueeze(-1))
        return _Blocked(elements, scales, codes.to(torch.uint8), None, layout)
    return _nvfp4_blocks(fmt, x, blocks, amax, tensor_amax, layout)


def _e8m0_codes(fmt: BlockFormat, amax: Tensor) -> Tensor:
    """int32 E8M0 codes of blocks with float32 ``amax``, by the format's rule."""
    element = fmt.element
    if fmt.scale_rule == "rceil":
        limit = torch.tensor(
            element.max_absolute_value, dtype=torch.float32, device=amax.device
        )
        descale = amax / limit
        exponent = _log2(descale, ceil=True)
        codes = (exponent + E8M0_BIAS).clamp(0, 254)
        codes = torch.where(descale == 0, 0, codes)
        codes = torch.where(descale.isinf(), 254, codes)  # satfinite
        return torch.where(descale.isnan(), E8M0_NAN, codes)
    rounded = amax
    if fmt.scale_rule == "even":
        # Round amax half up to the element's significant bits: a largest value
        # that rounds up to the next power of two gets the larger scale (up to
        # 2^128, beyond float32, for amax near its largest value).
        shift = 23 - element_mantissa_bits(element) - 1
        if shift >= 0:
            bits = (amax.view(torch.int32) + (1 << shift)) & 0x7F800000
            rounded = torch.where(amax.isfinite(), bits.view(torch.float32), amax)
    log2 = _log2(rounded, ceil=fmt.scale_rule == "ceil")
    log2 = torch.where(rounded.isinf(), 128, log2)
    log2 = torch.where(rounded == 0, -E8M0_BIAS, log2)  # subnormal, for "even"
    codes = (log2 - element_emax(element) + E8M0_BIAS).clamp(0, 254)
    codes = torch.where(amax == 0, 0, codes)
    return torch.where(amax.isfinite(), codes, E8M0_NAN)


def _log2(a: Tensor, ceil: bool) -> Tensor:
    """Exact ``floor`` (or ``ceil``) of ``log2(a)`` for finite positive float32
    ``a``, subnormals included, as int32 (other inputs: any value)."""
    fraction, exponent = torch.frexp(a)  # a = fraction * 2^exponent, [0.5, 1)
    exponent = exponent.int() - 1
    return exponent + (fraction > 0.5).int() if ceil else exponent


def _tensor_scales(
    fmt: BlockFormat, x: Tensor, tensor_amax: float | Tensor | None
) -> tuple[Tensor, Tensor]:
    """NVFP4's float32 per-tensor encode scale ``448 * max / amax`` and its
    inverse, the decode scale, from ``x``'s amax or ``tensor_amax``."""
    f32 = torch.float32
    device = x.device
    if tensor_amax is None:
        global_amax = (
            x.detach().abs().amax().float()
            if x.numel()
            else torch.zeros((), dtype=f32, device=device)
        )
    else:
        global_amax = torch.as_tensor(tensor_amax, dtype=f32, device=device)
        if global_amax.numel() != 1:
            raise ValueError(
                f"tensor_amax must be one number, got shape {tuple(global_amax.shape)}"
            )
        global_amax = global_amax.reshape(())
    elem_max = torch.tensor(fmt.element.max_absolute_value, dtype=f32, device=device)
    fp32_max = torch.tensor(_FLOAT32_MAX, dtype=f32, device=device)
    one = torch.tensor(1.0, dtype=f32, device=device)
    encode = torch.minimum(torch.div(_E4M3_MAX * elem_max, global_amax), fp32_max)
    encode = torch.where(encode == 0, one, encode)
    return encode, torch.div(one, encode)


def _quantise_native(
    fmt: BlockFormat, x: Tensor, axis: int, tensor_amax: float | Tensor | None
) -> Tensor | None:
    """:meth:`BlockFormat.quantise` by the C++ kernel where it serves, else
    ``None`` (errors are left to the eager path, which raises them)."""
    if fmt.block_dims != 1 or not isinstance(axis, int) or isinstance(axis, bool):
        return None
    if not -x.dim() <= axis < x.dim() or (
        tensor_amax is not None and fmt.scale != "e4m3"
    ):
        return None
    encode = decode = None
    if fmt.scale == "e4m3":
        if isinstance(tensor_amax, Tensor) and tensor_amax.numel() != 1:
            return None
        encode, decode = _tensor_scales(fmt, x, tensor_amax)
    return native_quantise(fmt, x, axis % x.dim(), encode, decode)


def _nvfp4_blocks(
    fmt: BlockFormat,
    x: Tensor,
    blocks: Tensor,
    amax: Tensor,
    tensor_amax: float | Tensor | None,
    layout: _Layout,
) -> _Blocked:
    """E4M3 block scales under a float32 per-tensor scale, in the order of
    Transformer Engine's reference (see the module's note 6)."""
    f32 = torch.float32
    device = blocks.device
    encode, decode = _tensor_scales(fmt, x, tensor_amax)
    elem_max = torch.tensor(fmt.element.max_absolute_value, dtype=f32, device=device)
    fp32_max = torch.tensor(_FLOAT32_MAX, dtype=f32, device=device)
    one = torch.tensor(1.0, dtype=f32, device=device)
    block_scale = amax * (encode * torch.div(one, elem_max))
    block_scale = torch.minimum(block_scale, fp32_max).clamp(-_E4M3_MAX, _E4M3_MAX)
    block_scale = block_scale.to(torch.float8_e4m3fn)
    scales = block_scale.float()
    inverse = torch.minimum(torch.div(one, scales * decode), fp32_max)
    elements = fmt.element.quantise(blocks * inverse.unsqueeze(-1))
    return _Blocked(elements, scales, block_scale.view(torch.uint8), decode, layout)


FP6_E3M2 = FPFormat(3, 2, "nearest", finite=True, nan=False)
"""OCP MX FP6 E3M2: max 28, no infinities or NaN; round to nearest."""

FP6_E2M3 = FPFormat(2, 3, "nearest", finite=True, nan=False)
"""OCP MX FP6 E2M3: max 7.5, no infinities or NaN; round to nearest."""

FP4_E2M1 = FPFormat(2, 1, "nearest", finite=True, nan=False)
"""OCP MX FP4 E2M1: values 0, 0.5, 1, 1.5, 2, 3, 4, 6; round to nearest."""

INT8 = IntFormat(8, "nearest")
"""OCP MX INT8: ``k / 64`` for ``|k| <= 127``; round to nearest."""

MXFP8_E4M3 = BlockFormat(FP8_E4M3)
"""OCP MXFP8 with E4M3 elements: blocks of 32, E8M0 scales, the OCP floor rule."""

MXFP8_E5M2 = BlockFormat(FP8_E5M2)
"""OCP MXFP8 with E5M2 elements: blocks of 32, E8M0 scales, the OCP floor rule."""

MXFP6_E3M2 = BlockFormat(FP6_E3M2)
"""OCP MXFP6 with E3M2 elements: blocks of 32, E8M0 scales, the OCP floor rule."""

MXFP6_E2M3 = BlockFormat(FP6_E2M3)
"""OCP MXFP6 with E2M3 elements: blocks of 32, E8M0 scales, the OCP floor rule."""

MXFP4 = BlockFormat(FP4_E2M1)
"""OCP MXFP4: E2M1 elements in blocks of 32, E8M0 scales, the OCP floor rule."""

MXINT8 = BlockFormat(INT8)
"""OCP MXINT8: INT8 elements in blocks of 32, E8M0 scales, the OCP floor rule."""

NVFP4 = BlockFormat(FP4_E2M1, 16, scale="e4m3", scale_rule="nearest")
"""NVIDIA's NVFP4: E2M1 elements in blocks of 16, E4M3 block scales times a float32
per-tensor scale. NVIDIA's recipe quantises weights in 16x16 blocks:
``dataclasses.replace(NVFP4, block_dims=2)``."""
