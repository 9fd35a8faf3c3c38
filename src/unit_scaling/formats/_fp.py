"""Floating-point element formats: :class:`FPFormat` and its quantisation kernels."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor

from .._autograd import Function
from .._kernels import CompiledKernels, NativeKernel, in_memory, native_threads

__all__ = ["FP8_E4M3", "FP8_E5M2", "FPFormat", "format_to_tuple", "tuple_to_format"]

Rounding = Literal["stochastic", "nearest"]
FormatTuple = (
    tuple[int, int, Rounding, int, bool] | tuple[int, int, Rounding, int, bool, bool]
)

_ROUNDINGS = ("stochastic", "nearest")
_SHORT_ROUNDING = {"stochastic": "SR", "nearest": "RN"}

# Below 2^16 elements a compiled call saves nothing over eager execution, and
# compiling for sizes 0 and 1 (which torch.compile specialises) would cost seconds.
_KERNELS = CompiledKernels("unit_scaling.formats", min_numel=1 << 16)


@dataclass(frozen=True)
class FPFormat:
    """A floating-point format with one sign bit, that rounds tensors onto its values.

    With exponent bias :math:`b = 2^{e-1} - 1`, the IEEE-like format has

    .. math::
        \\max = 2^{b} (2 - 2^{-m}), \\qquad
        \\min_\\text{normal} = 2^{1-b}, \\qquad
        \\min_\\text{subnormal} = 2^{1-b-m},

    a ``finite`` format (no infinities, all-ones mantissa at the top exponent
    is NaN) has :math:`\\max = 2^{b+1} (2 - 2^{1-m})`, and a ``finite`` format
    without ``nan`` (every code a number, as the OCP MX FP6 and FP4 elements) has
    :math:`\\max = 2^{b+1} (2 - 2^{-m})`.

    Args:
        exponent_bits: bits of exponent ``e``, from 2 to 8.
        mantissa_bits: bits of mantissa ``m`` (without the implicit bit), 0 to 23.
        rounding: ``"stochastic"`` rounds up with probability equal to the distance
            from the lower neighbour over the gap (unbiased); ``"nearest"`` rounds to
            the nearest value, ties to the even encoding.
        srbits: random bits per stochastic rounding decision: the probability of
            rounding up is that distance truncated to ``srbits`` bits, as in
            stochastic-rounding hardware. ``0`` uses the full precision of the
            input's dtype.
        finite: use the OCP E4M3 encoding (``torch.float8_e4m3fn``'s "FN"): no
            infinities, and the top exponent holds numbers except the NaN pattern.
        nan: whether a ``finite`` format keeps its NaN pattern. ``nan=False``
            (with ``finite=True``) makes every code a number, as in the OCP MX
            elements E3M2 (max 28), E2M3 (max 7.5) and E2M1 (max 6); a NaN input
            stays NaN in the simulated result. Written ``FNN`` in ``str``.

    Example::

        >>> FPFormat(4, 3, "nearest").quantise(torch.tensor([0.3, 1000.0]))
        tensor([  0.3125, 240.0000])
        >>> str(FP8_E4M3), FP8_E4M3.max_absolute_value
        ('E4M3FN-RN', 448.0)
        >>> FPFormat(2, 1, "nearest", finite=True, nan=False).max_absolute_value
        6.0
    """

    exponent_bits: int
    mantissa_bits: int
    rounding: Rounding = "stochastic"
    srbits: int = 0
    finite: bool = field(default=False, kw_only=True)
    nan: bool = field(default=True, kw_only=True)

    def __post_init__(self) -> None:
        for name in ("exponent_bits", "mantissa_bits", "srbits"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        for name in ("finite", "nan"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
        if not 2 <= self.exponent_bits <= 8:
            raise ValueError(
                f"exponent_bits must be between 2 and 8, got {self.exponent_bits}: "
                "fewer leave no normal numbers, more cannot be simulated in float32"
            )
        if not 0 <= self.mantissa_bits <= 23:
            raise ValueError(
                f"mantissa_bits must be between 0 and 23, got {self.mantissa_bits}: "
                "more cannot be simulated in float32"
            )
        if self.rounding not in _ROUNDINGS:
            raise ValueError(
                f"rounding must be one of {_ROUNDINGS}, got {self.rounding!r}"
            )
        if self.srbits < 0:
            raise ValueError(f"srbits must be at least 0, got {self.srbits}")
        if self.srbits and self.rounding == "nearest":
            raise ValueError(
                f"srbits={self.srbits} only applies to stochastic rounding; "
                "use srbits=0 with rounding='nearest'"
            )
        if not self.nan and not self.finite:
            raise ValueError(
                "nan=False needs finite=True: an IEEE-like format reserves its top "
                "exponent for infinities and NaN; pass finite=True, nan=False for "
                "a format whose every code is a number"
            )
        if self.finite and self.nan and self.mantissa_bits == 0:
            raise ValueError(
                "finite formats need mantissa_bits >= 1: their top exponent's "
                "all-ones mantissa is NaN, which leaves E?M0 nothing there"
            )
        if self.finite and self.exponent_bits == 8:
            raise ValueError(
                "finite formats need exponent_bits <= 7: with 8 the largest value "
                "exceeds float32's, so it cannot be simulated"
            )

    @property
    def bits(self) -> int:
        """Total bits: sign, exponent and mantissa."""
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def max_absolute_value(self) -> float:
        """The largest finite magnitude; larger inputs saturate to it."""
        bias = (1 << (self.exponent_bits - 1)) - 1
        if self.finite:
            lost = 1 if self.nan else 0  # the NaN pattern takes the top step
            return math.ldexp(2 - math.ldexp(1, lost - self.mantissa_bits), bias + 1)
        return math.ldexp(2 - math.ldexp(1, -self.mantissa_bits), bias)

    @property
    def min_absolute_normal(self) -> float:
        """The smallest magnitude with an implicit leading one, ``2^(2 - 2^(e-1))``."""
        return 2.0 ** _min_exponent(self)

    @property
    def min_absolute_subnormal(self) -> float:
        """The smallest non-zero magnitude, ``min_absolute_normal * 2^-m``."""
        return 2.0 ** (_min_exponent(self) - self.mantissa_bits)

    def __str__(self) -> str:
        suffix = str(self.srbits) if self.srbits else ""
        encoding = ("FN" if self.nan else "FNN") if self.finite else ""
        return (
            f"E{self.exponent_bits}M{self.mantissa_bits}{encoding}"
            f"-{_SHORT_ROUNDING[self.rounding]}{suffix}"
        )

    def quantise(self, x: Tensor) -> Tensor:
        """Round ``x`` onto this format's values; same dtype and shape, no gradient.

        .. math:: q(x) = \\operatorname{sign}(x)\\,
            \\operatorname{round}(\\min(|x|, \\max))

        Magnitudes above ``max_absolute_value`` (and infinities) saturate to it, NaN
        stays NaN, the sign of zero is kept. The result has the dtype of ``x``: a
        format wider than that dtype is rounded once more by the dtype.
        For :data:`FP8_E4M3` and :data:`FP8_E5M2` this equals
        ``x.to(torch.float8_e4m3fn).to(x.dtype)`` (``float8_e5m2``) bit for bit on
        every input within range; out of range, where this saturates, the E5M2 cast
        gives infinity and the E4M3 cast NaN (older torch) or the maximum.

        Stochastic rounding draws its random bits from a counter-based hash of each
        element's position, seeded from torch's generator on each call, so results
        follow ``torch.manual_seed`` and the compiled and eager kernels agree.

        Args:
            x: a floating-point tensor (float32, bfloat16, float16 or float64).

        Example::

            >>> FPFormat(2, 1, "nearest").quantise(torch.tensor([-0.3, 1.2, 9.0]))
            tensor([-0.5000,  1.0000,  3.0000])
        """
        if not x.is_floating_point():
            raise TypeError(f"quantise expects a floating-point tensor, got {x.dtype}")
        return _quantise(self, x.detach())

    def quantise_fwd(self, x: Tensor) -> Tensor:
        """Quantise in the forward pass; the gradient passes through unchanged.

        .. math:: y = q(x), \\qquad \\partial L/\\partial x = \\partial L/\\partial y

        Example::

            >>> x = torch.tensor([0.3], requires_grad=True)
            >>> FP8_E4M3.quantise_fwd(x).sum().backward()
            >>> x.grad
            tensor([1.])
        """
        out: Tensor = _Quantise.apply(x, self, None)
        return out

    def quantise_bwd(self, x: Tensor) -> Tensor:
        """Identity in the forward pass; quantise the gradient.

        .. math:: y = x, \\qquad \\partial L/\\partial x = q(\\partial L/\\partial y)

        Example::

            >>> x = torch.tensor([1.0], requires_grad=True)
            >>> (0.3 * FP8_E4M3.quantise_bwd(x)).sum().backward()
            >>> x.grad
            tensor([0.3125])
        """
        out: Tensor = _Quantise.apply(x, None, self)
        return out


FP8_E4M3 = FPFormat(4, 3, "nearest", finite=True)
"""OCP FP8 E4M3 (``torch.float8_e4m3fn``): max 448, no infinities; round to nearest."""

FP8_E5M2 = FPFormat(5, 2, "nearest")
"""OCP FP8 E5M2 (``torch.float8_e5m2``), IEEE-like: max 57344; round to nearest."""


def format_to_tuple(fmt: FPFormat) -> FormatTuple:
    """The tuple ``(exponent_bits, mantissa_bits, rounding, srbits, finite)``,
    with ``nan`` appended for a format without NaN.

    Example::

        >>> format_to_tuple(FP8_E4M3)
        (4, 3, 'nearest', 0, True)
    """
    if not isinstance(fmt, FPFormat):
        raise TypeError(
            f"format_to_tuple takes an FPFormat, got {type(fmt).__name__} "
            f"{fmt}: a block format is named by str(format) and its constant"
        )
    t = (fmt.exponent_bits, fmt.mantissa_bits, fmt.rounding, fmt.srbits, fmt.finite)
    return t if fmt.nan else (*t, fmt.nan)


def tuple_to_format(t: Sequence[Any]) -> FPFormat:
    """The format of a tuple from :func:`format_to_tuple`, or of a prefix of one.

    Example::

        >>> tuple_to_format((5, 2, "nearest")) == FP8_E5M2
        True
    """
    if not 2 <= len(t) <= 6:
        raise ValueError(
            "a format tuple is (exponent_bits, mantissa_bits[, rounding[, srbits"
            f"[, finite[, nan]]]]), got {len(t)} elements: {tuple(t)!r}"
        )
    fields = dict(zip(("rounding", "srbits", "finite", "nan"), t[2:], strict=False))
    return FPFormat(t[0], t[1], **fields)


def _min_exponent(fmt: FPFormat) -> int:
    return 2 - (1 << (fmt.exponent_bits - 1))


# Quantisation kernels. Each takes a flat tensor and the format as a tuple of
# parameters: Python numbers when run eagerly or traced (constants in the graph),
# 0-d tensors when compiled standalone, so one compiled kernel serves every format
# (dynamo would recompile for each format's constants, and stop after eight).

_Param = Any  # a Python number, or a 0-d tensor holding it


class _Compute(NamedTuple):
    """Float dtype the rounding runs in, its same-width int, and its layout."""

    float_dtype: torch.dtype
    int_dtype: torch.dtype
    mantissa_bits: int
    bias: int


FLOAT32_COMPUTE = _Compute(torch.float32, torch.int32, 23, 127)
_FLOAT64 = _Compute(torch.float64, torch.int64, 52, 1023)


def _compute_for(dtype: torch.dtype) -> _Compute:
    # Every input dtype but float64 converts exactly to float32.
    return _FLOAT64 if dtype == torch.float64 else FLOAT32_COMPUTE


class _NearestParams(NamedTuple):
    max_value: _Param
    min_normal: _Param  # below it the grid is uniform: the subnormals
    shift: _Param  # low bits of the compute dtype's mantissa that are dropped
    round_half: _Param  # added before truncating: half a step, minus one
    lsb_mask: _Param  # 1, or 0 when nothing is dropped
    keep_mask: _Param
    inv_min_normal: _Param
    subnormal_steps: _Param  # 2^m subnormal steps per min_normal
    inv_subnormal_steps: _Param


class _StochasticParams(NamedTuple):
    max_value: _Param
    shift: _Param
    min_normal_exponent: _Param  # biased exponent of min_normal in compute dtype
    kept_random_bits: _Param
    min_subnormal: _Param
    inv_min_normal: _Param
    tiny_scale: _Param  # maps [0, min_subnormal) onto [0, 2^tiny_bits)
    tiny_shift: _Param  # random word bits not used below min_subnormal


def _nearest_params(fmt: FPFormat, compute: _Compute) -> _NearestParams:
    shift = compute.mantissa_bits - fmt.mantissa_bits
    emin = _min_exponent(fmt)
    return _NearestParams(
        max_value=fmt.max_absolute_value,
        min_normal=2.0**emin,
        shift=shift,
        round_half=(1 << (shift - 1)) - 1 if shift else 0,
        lsb_mask=1 if shift else 0,
        keep_mask=-(1 << shift),
        inv_min_normal=2.0**-emin,
        subnormal_steps=2.0**fmt.mantissa_bits,
        inv_subnormal_steps=2.0**-fmt.mantissa_bits,
    )


def stochastic_params(fmt: FPFormat, compute: _Compute) -> _StochasticParams:
    word_bits = compute.mantissa_bits + 1
    random_bits = min(fmt.srbits or word_bits, word_bits)
    emin = _min_exponent(fmt)
    return _StochasticParams(
        max_value=fmt.max_absolute_value,
        shift=compute.mantissa_bits - fmt.mantissa_bits,
        min_normal_exponent=emin + compute.bias,
        kept_random_bits=random_bits,
        min_subnormal=fmt.min_absolute_subnormal,
        inv_min_normal=2.0**-emin,
        tiny_scale=2.0 ** (fmt.mantissa_bits + random_bits),
        tiny_shift=word_bits - random_bits,
    )


def _round_nearest(x: Tensor, p: _NearestParams) -> Tensor:
    compute = _compute_for(x.dtype)
    xf = x.to(compute.float_dtype)
    mag = xf.abs().clamp(max=p.max_value)
    # Normal range: round the bit pattern, ties to even. Carries into the exponent
    # are right, and NaN is restored below.
    bits = mag.view(compute.int_dtype)
    bits = (bits + p.round_half + ((bits >> p.shift) & p.lsb_mask)) & p.keep_mask
    normal = bits.view(compute.float_dtype)
    # Subnormal range: a uniform grid; every product is by a power of two, exact.
    steps = torch.round(mag * p.inv_min_normal * p.subnormal_steps)
    subnormal = steps * p.inv_subnormal_steps * p.min_normal
    q = torch.where(mag < p.min_normal, subnormal, normal)
    return torch.where(xf.isnan(), xf, q.copysign(xf)).to(x.dtype)


def _round_stochastic(x: Tensor, p: _StochasticParams, seed: Tensor) -> Tensor:
    compute = _compute_for(x.dtype)
    xf = x.to(compute.float_dtype)
    mag = xf.abs().clamp(max=p.max_value)
    bits = mag.view(compute.int_dtype)
    # Bits below the format's step at this magnitude: ``shift`` in the normal
    # range, more below min_normal (compute subnormals continue the lowest binade).
    exponent = (bits >> compute.mantissa_bits).clamp(min=1)
    below = (p.min_normal_exponent - exponent).clamp(min=0)
    dropped = (p.shift + below).clamp(max=compute.mantissa_bits)
    step_mask = (1 << dropped) - 1
    unused = dropped - dropped.clamp(max=p.kept_random_bits)
    word = _random_words(x.numel(), seed, x.device, compute)
    offset = word & step_mask & ~((1 << unused) - 1)
    rounded = ((bits + offset) & ~step_mask).view(compute.float_dtype)
    # Below the smallest subnormal the step spans more than the compute mantissa:
    # round up to it with probability mag / min_subnormal, from the same word.
    threshold = mag * p.inv_min_normal * p.tiny_scale
    tiny = ((word >> p.tiny_shift) + 1).to(compute.float_dtype) <= threshold
    tiny_value = tiny.to(compute.float_dtype) * p.min_subnormal
    q = torch.where(mag < p.min_subnormal, tiny_value, rounded)
    return torch.where(xf.isnan(), xf, q.copysign(xf)).to(x.dtype)


_HASH_MULTIPLIERS = (0x7FEB352D, 0x21F0AAAD, 0x735A2D97)
_WORD = 0xFFFFFFFF


def _hash32(h: Tensor) -> Tensor:
    # Xor-shift-multiply rounds, a bijection on 32-bit words with good avalanche.
    # Words live in int64 and multipliers are below 2^31, so nothing overflows.
    for multiplier in _HASH_MULTIPLIERS:
        h = h ^ (h >> 16)
        h = (h * multiplier) & _WORD
    return h ^ (h >> 16)


def _random_words(
    numel: int, seed: Tensor, device: torch.device, c: _Compute
) -> Tensor:
    """``mantissa_bits + 1`` uniform random bits per element, as ``c.int_dtype``.

    A counter-based generator: the hash of (position + seed). Unlike torch's
    generator, which compiled code calls once per element, it vectorises and fuses
    into the rounding kernel, and gives the same bits eagerly and compiled.
    """
    index = torch.arange(numel, device=device, dtype=torch.int64)
    word = _hash32((index + seed) & _WORD)
    if c.mantissa_bits + 1 <= 32:
        return (word >> (31 - c.mantissa_bits)).to(c.int_dtype)
    more = _hash32(word ^ _HASH_MULTIPLIERS[0])
    return (word << (c.mantissa_bits - 31)) | (more >> (63 - c.mantissa_bits))


def _round_nearest_native(x: Tensor, max_value: float, target: torch.dtype) -> Tensor:
    return x.clamp(-max_value, max_value).to(target).to(x.dtype)


def _native_dtype(fmt: FPFormat, dtype: torch.dtype) -> torch.dtype | None:
    """The torch dtype whose cast rounds exactly as ``fmt``, if there is one.

    float64 is excluded: torch converts it to float8 through float32 (rounding twice).
    """
    if fmt.rounding != "nearest" or dtype == torch.float64:
        return None
    if (fmt.exponent_bits, fmt.mantissa_bits, fmt.finite, fmt.nan) == (
        4,
        3,
        True,
        True,
    ):
        return getattr(torch, "float8_e4m3fn", None)
    if (fmt.exponent_bits, fmt.mantissa_bits, fmt.finite) == (5, 2, False):
        return getattr(torch, "float8_e5m2", None)
    return None


# Round to nearest on the CPU, float32, as one vectorised pass (``at::vec``):
# the rounding of ``_round_nearest`` done with float adds. Adding ``big``, a
# power of two whose unit in the last place is the format's step at ``mag``
# (``2^e * 2^-m`` in binade ``e``, ``min_normal * 2^-m`` below ``min_normal``),
# rounds ``mag`` onto the format's grid, ties to even, and subtracting it again
# is exact. Inductor compiles this file without reassociating float math.
# On this package's decoder benchmark, quantisation calls are 0.25-1 M elements,
# where a compiled call costs ~100 us fixed plus ~0.8 ns per element (its float8
# cast round trip is not vectorised): this kernel runs at the speed of ``x * 1``.
_NEAREST_SOURCE = r"""
#include <cstdint>
#include <cstring>
#ifdef _OPENMP
#include <omp.h>
#endif

namespace {
using V = at::vec::Vectorized<float>;

inline V round_nearest(V v, V max_value, V min_normal, V to_big, V exponent,
                       V sign) {
  const V mag = at::vec::minimum(v.abs(), max_value);  // NaN stays NaN
  const V big = at::vec::maximum(mag & exponent, min_normal) * to_big;
  const V rounded = ((mag + big) - big) | (v & sign);
  return V::blendv(rounded, v, v != v);
}

inline float bits_to_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
}  // namespace

extern "C" void kernel(const float* x, float* out, int64_t n, float max_value,
                       float min_normal, float to_big, int64_t threads) {
  const V vmax(max_value), vmin(min_normal), vbig(to_big);
  const V exponent(bits_to_float(0x7f800000u)), sign(-0.0f);
  constexpr int64_t kStep = V::size();
  const int64_t full = n / kStep * kStep;
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
#endif
  for (int64_t i = 0; i < full; i += kStep) {
    round_nearest(V::loadu(x + i), vmax, vmin, vbig, exponent, sign)
        .store(out + i);
  }
  if (full < n) {
    const int rest = static_cast<int>(n - full);
    round_nearest(V::loadu(x + full, rest), vmax, vmin, vbig, exponent, sign)
        .store(out + full, rest);
  }
}
"""
_NATIVE_NEAREST = NativeKernel(
    "unit_scaling.formats",
    _NEAREST_SOURCE,
    ["const float*", "float*", "int64_t", "float", "float", "float", "int64_t"],
)
# A thread per 2^16 elements (~15 us of work), at most torch's intra-op threads.
_NUMEL_PER_THREAD = 1 << 16


def _native_nearest_args(fmt: FPFormat, x: Tensor) -> tuple[float, ...] | None:
    """``(max_value, min_normal, to_big)`` for the C++ kernel if it serves this
    format and tensor, else ``None``. It needs: round to nearest; at least one
    mantissa bit (with none, ties to even means an even *exponent*); a grid
    that float32 holds with room for ``big`` (at most 7 exponent bits); and a
    contiguous float32 CPU tensor in memory."""
    if not (
        in_memory(x)
        and fmt.rounding == "nearest"
        and 1 <= fmt.mantissa_bits <= 22
        and fmt.exponent_bits <= 7
        and x.dtype == torch.float32
        and x.device.type == "cpu"
        and x.is_contiguous()
    ):
        return None
    return (
        fmt.max_absolute_value,
        fmt.min_absolute_normal,
        2.0 ** (23 - fmt.mantissa_bits),
    )


def _quantise(fmt: FPFormat, x: Tensor) -> Tensor:
    # One flat, dense layout: compiled once for all shapes, and no strided slow
    # paths (eager ops on an expanded input run thousands of times slower).
    flat = x.reshape(-1).contiguous()
    args = _native_nearest_args(fmt, flat)
    if args is not None and (native := _NATIVE_NEAREST.get()) is not None:
        out = torch.empty_like(flat)
        threads = native_threads(flat.numel(), _NUMEL_PER_THREAD)
        native(flat, out, flat.numel(), *args, threads)
        return out.view(x.shape)
    if _KERNELS.should_compile(flat):
        try:
            # Under no_grad, so grad mode never splits the compiled kernel's cache.
            with torch.no_grad():
                kernel, kernel_args = _kernel(fmt, flat, tensor_params=True)
                return _KERNELS.compiled(kernel)(flat, *kernel_args).view(x.shape)
        except Exception as error:  # e.g. no C++ compiler: run eagerly from now on
            _KERNELS.stop_compiling(error)
    kernel, kernel_args = _kernel(fmt, flat, tensor_params=False)
    return kernel(flat, *kernel_args).view(x.shape)


def _kernel(
    fmt: FPFormat, x: Tensor, tensor_params: bool
) -> tuple[Callable[..., Tensor], tuple[Any, ...]]:
    """The kernel that quantises ``x`` to ``fmt``, and its arguments after ``x``."""
    native = _native_dtype(fmt, x.dtype)
    if native is not None:
        return _round_nearest_native, (fmt.max_absolute_value, native)
    compute = _compute_for(x.dtype)
    params: _NearestParams | _StochasticParams
    if fmt.rounding == "nearest":
        params = _nearest_params(fmt, compute)
    else:
        params = stochastic_params(fmt, compute)
    if tensor_params:
        params = type(params)(*_tensor_params(params, compute, x.device))
    if isinstance(params, _NearestParams):
        return _round_nearest, (params,)
    seed = torch.randint(0, _WORD + 1, (), dtype=torch.int64, device=x.device)
    return _round_stochastic, (params, seed)


@functools.lru_cache(maxsize=128)
def _tensor_params(
    params: tuple[float, ...], compute: _Compute, device: torch.device
) -> tuple[Tensor, ...]:
    return tuple(
        torch.tensor(
            value,
            dtype=compute.float_dtype
            if isinstance(value, float)
            else compute.int_dtype,
            device=device,
        )
        for value in params
    )


class _Quantise(Function):
    """Rounds the value to ``forward``'s format and its gradient to
    ``backward``'s (``None``: that direction passes unchanged)."""

    @staticmethod
    def forward(
        x: Tensor, forward: FPFormat | None, backward: FPFormat | None
    ) -> Tensor:
        return x.view_as(x) if forward is None else forward.quantise(x)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        ctx.backward_format = inputs[2]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        fmt = ctx.backward_format
        return (grad if fmt is None else fmt.quantise(grad)), None, None
