"""Element and scale codes: the bytes a block format stores, and their values.

Rounding happens on values (the formats' ``quantise``); these helpers only
translate values that are already on a format's grid to codes and back, so
hardware-layout comparisons need no second rounding path.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from ._fp import FPFormat
from ._int import IntFormat

ElementFormat = FPFormat | IntFormat

E8M0_NAN = 255
E8M0_BIAS = 127


def element_emax(element: ElementFormat) -> int:
    """The exponent of the element's largest power of two, ``emax_elem`` of the
    OCP MX specification (8 for E4M3, 15 for E5M2, 0 for INT8)."""
    return math.floor(math.log2(element.max_absolute_value))


def element_mantissa_bits(element: ElementFormat) -> int:
    """Fraction bits at the element's top binade (``bits - 2`` for INT)."""
    if isinstance(element, IntFormat):
        return element.bits - 2
    return element.mantissa_bits


def _native_float8(element: ElementFormat) -> torch.dtype | None:
    if not isinstance(element, FPFormat):
        return None
    layout = (element.exponent_bits, element.mantissa_bits, element.finite)
    if layout == (4, 3, True) and element.nan:
        return torch.float8_e4m3fn
    if layout == (5, 2, False):
        return torch.float8_e5m2
    return None


def element_codes(element: ElementFormat, q: Tensor) -> Tensor:
    """The ``uint8`` codes of float32 values ``q`` on ``element``'s grid.

    FP codes are sign, exponent, mantissa from the top bit down (as the unpacked
    bytes of torchao: E2M1 in the low 4 bits, E3M2/E2M3 in the low 6); INT codes
    are two's complement. NaN is the all-ones pattern with its sign where the
    format has one, else code 0 (as Transformer Engine's E2M1 reference).
    """
    if isinstance(element, IntFormat):
        k = torch.nan_to_num(q / element.step, nan=0.0).to(torch.int16)
        return (k & ((1 << element.bits) - 1)).to(torch.uint8)
    native = _native_float8(element)
    if native is not None:
        return q.to(native).view(torch.uint8)
    e, m = element.exponent_bits, element.mantissa_bits
    bias = (1 << (e - 1)) - 1
    mag = q.abs()
    fraction, exponent = torch.frexp(mag)  # mag = fraction * 2^exponent
    normal = ((exponent - 1 + bias) << m) + ((fraction * 2 - 1) * (1 << m)).int()
    subnormal = (mag / element.min_absolute_subnormal).int()
    index = torch.where(mag < element.min_absolute_normal, subnormal, normal)
    nan_code = (1 << (e + m)) - 1 if element.nan else 0
    index = torch.where(q.isnan(), nan_code, index)
    sign = torch.signbit(q) & (~q.isnan() | element.nan)
    return (index | (sign.int() << (e + m))).to(torch.uint8)


@functools.lru_cache(maxsize=32)
def element_table(element: ElementFormat) -> Tensor:
    """The float32 value of every code of ``element``, indexed by code."""
    bits = element.bits
    values = []
    for code in range(1 << bits):
        if isinstance(element, IntFormat):
            k = code - (1 << bits) if code >> (bits - 1) else code
            values.append(k * element.step)
            continue
        e, m = element.exponent_bits, element.mantissa_bits
        sign = -1.0 if code >> (e + m) else 1.0
        exponent, mantissa = divmod(code & ((1 << (e + m)) - 1), 1 << m)
        top = exponent == (1 << e) - 1
        if top and not element.finite:
            values.append(sign * math.inf if mantissa == 0 else math.nan)
        elif top and element.nan and mantissa == (1 << m) - 1:
            values.append(math.nan)
        elif exponent == 0:
            values.append(sign * element.min_absolute_subnormal * mantissa)
        else:
            bias = (1 << (e - 1)) - 1
            values.append(sign * math.ldexp(1 + mantissa / (1 << m), exponent - bias))
    # Built once per format (cached) on the CPU; callers move it to the codes'
    # device.
    return torch.tensor(values, dtype=torch.float32, device="cpu")


def pow2(exponent: Tensor) -> Tensor:
    """``2^exponent`` in float32, exactly, for int32 exponents in [-149, 127]."""
    normal = ((exponent + 127).clamp(min=1) << 23).view(torch.float32)
    subnormal = (1 << (exponent + 149).clamp(0, 22)).view(torch.float32)
    return torch.where(exponent >= -126, normal, subnormal)


def e8m0_values(codes: Tensor) -> Tensor:
    """The float32 value ``2^(code - 127)`` of E8M0 codes; NaN for 0xFF."""
    c = codes.int()
    return torch.where(c == E8M0_NAN, math.nan, pow2(c - E8M0_BIAS))
