"""A C++ kernel for :meth:`BlockFormat.quantise` on CPU float32, one pass.

Eagerly, block quantisation is some twenty passes over memory (blocking,
amax, the scale rule, the element rounding, the product by the scale) on every
operand of every GEMM: a training step under an MX recipe took 3x one under
``simulate_fp8``. This kernel does a block at a time, with the same float32
operations in the same order as :mod:`._block`, so its results are the eager
path's bit for bit (``tests/formats/test_block_native.py`` checks it on the
committed fixtures and on random and adversarial blocks, stochastic rounding
included: the same counter-based random words, at the same positions of the
blocked, zero-padded tensor).

It serves 1-D blocks of floating-point elements (round to nearest or
stochastic) with E8M0 scales by any rule or NVFP4's E4M3 scales; 2-D blocks and
INT8 elements take the eager path.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._kernels import NativeKernel, in_memory, native_threads
from ._codes import element_emax
from ._fp import FLOAT32_COMPUTE, FPFormat, stochastic_params

__all__ = ["native_quantise"]

_RULES = {"floor": 0, "ceil": 1, "even": 2, "rceil": 3}
_NVFP4_MODE = 4
_NUMEL_PER_THREAD = 1 << 16

_SOURCE = r"""
#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <limits>
#ifdef _OPENMP
#include <omp.h>
#endif

namespace {
constexpr float kMax = std::numeric_limits<float>::max();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

inline uint32_t bits_of(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float float_of(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

struct Params {
  int64_t mode, emax, mbits;
  float max_value, min_normal, to_big;        // element, round to nearest
  int64_t stochastic, seed, shift, min_normal_exponent, kept_bits, tiny_shift;
  float min_subnormal, inv_min_normal, tiny_scale;
  float scale_times_inv_max, decode;          // NVFP4
};

inline int32_t floor_log2(float a) { int e; std::frexp(a, &e); return e - 1; }
inline int32_t ceil_log2(float a) {
  int e; const float f = std::frexp(a, &e); return e - 1 + (f > 0.5f ? 1 : 0);
}

inline int32_t clamp_code(int32_t c) { return c < 0 ? 0 : (c > 254 ? 254 : c); }

// E8M0 code of a block with amax a (formats/_block.py's _e8m0_codes).
inline int32_t e8m0_code(float a, const Params& p) {
  if (p.mode == 3) {  // rceil
    const float descale = a / p.max_value;
    if (std::isnan(descale)) return 255;
    if (std::isinf(descale)) return 254;
    if (descale == 0.0f) return 0;
    return clamp_code(ceil_log2(descale) + 127);
  }
  if (!std::isfinite(a)) return 255;
  if (a == 0.0f) return 0;
  float rounded = a;
  if (p.mode == 2) {
    const int64_t shift = 23 - p.mbits - 1;
    if (shift >= 0)
      rounded = float_of((bits_of(a) + (1u << shift)) & 0x7F800000u);
  }
  int32_t log2;
  if (std::isinf(rounded)) log2 = 128;
  else if (rounded == 0.0f) log2 = -127;
  else log2 = p.mode == 1 ? ceil_log2(rounded) : floor_log2(rounded);
  return clamp_code(log2 - static_cast<int32_t>(p.emax) + 127);
}

// Round to nearest E4M3 (max 448), NaN kept: the float8_e4m3fn cast.
inline float to_e4m3(float v) {
  if (std::isnan(v)) return v;
  const float mag = std::fabs(v);
  const float big = std::fmax(float_of(bits_of(mag) & 0x7f800000u), 0.015625f)
                    * 1048576.0f;
  return std::copysign((mag + big) - big, v);
}

using V = at::vec::Vectorized<float>;
constexpr int64_t kStep = V::size();

// The vector form of round_nearest (formats/_fp.py's C++ kernel).
inline V round_nearest_vec(V v, V max_value, V min_normal, V to_big) {
  const V exponent(float_of(0x7f800000u)), sign(-0.0f);
  const V mag = at::vec::minimum(v.abs(), max_value);  // NaN stays NaN
  const V big = at::vec::maximum(mag & exponent, min_normal) * to_big;
  const V rounded = ((mag + big) - big) | (v & sign);
  return V::blendv(rounded, v, v != v);
}

using VI = at::vec::Vectorized<int32_t>;

// start + i * step for lane i, in uint32 arithmetic (wrapping), as int32 lanes.
inline VI words_from(uint32_t start, uint32_t step) {
  int32_t lanes[kStep];
  for (int64_t i = 0; i < kStep; ++i) {
    const uint32_t w = start + static_cast<uint32_t>(i) * step;
    std::memcpy(&lanes[i], &w, 4);
  }
  return VI::loadu(lanes);
}

// formats/_fp.py's _hash32 on each lane: its int64 products masked to 32 bits
// are int32 products (wrapping); the right shifts are arithmetic here, so they
// are masked to be logical.
inline VI hash32_vec(VI h) {
  const VI low16(0xFFFF);
  h = h ^ ((h >> VI(16)) & low16);
  h = h * VI(static_cast<int32_t>(0x7FEB352Du));
  h = h ^ ((h >> VI(16)) & low16);
  h = h * VI(static_cast<int32_t>(0x21F0AAADu));
  h = h ^ ((h >> VI(16)) & low16);
  h = h * VI(static_cast<int32_t>(0x735A2D97u));
  return h ^ ((h >> VI(16)) & low16);
}

// formats/_fp.py's _round_stochastic (float32) on each lane, its random word
// the hash of the lane's index (plus the seed), on bit patterns: a
// non-negative float orders as its bits.
inline V round_stochastic_vec(V v, VI index, const Params& p) {
  const VI zero(0), one(1);
  const VI word = (hash32_vec(index) >> VI(8)) & VI(0xFFFFFF);
  const VI v_bits = at::vec::cast<int32_t>(v);
  const VI abs_bits = v_bits & VI(0x7fffffff);
  const VI max_bits(static_cast<int32_t>(bits_of(p.max_value)));
  const VI bits = at::vec::minimum(abs_bits, max_bits);  // Inf too
  const VI exponent = at::vec::maximum(bits >> VI(23), one);
  const VI min_normal_exponent(static_cast<int32_t>(p.min_normal_exponent));
  const VI below = at::vec::maximum(min_normal_exponent - exponent, zero);
  const VI dropped =
      at::vec::minimum(VI(static_cast<int32_t>(p.shift)) + below, VI(23));
  const VI step_mask = (one << dropped) - one;
  const VI unused =
      dropped - at::vec::minimum(dropped, VI(static_cast<int32_t>(p.kept_bits)));
  const VI offset = word & step_mask & ~((one << unused) - one);
  const VI rounded = (bits + offset) & ~step_mask;
  const V magnitude = at::vec::cast<float>(bits);
  const V threshold = (magnitude * V(p.inv_min_normal)) * V(p.tiny_scale);
  const V draw = at::vec::convert_to_fp_of_same_size<float>(
      (word >> VI(static_cast<int32_t>(p.tiny_shift))) + one);
  const VI min_sub(static_cast<int32_t>(bits_of(p.min_subnormal)));
  const VI tiny = at::vec::cast<int32_t>(draw <= threshold) & min_sub;
  const VI q = VI::blendv(rounded, tiny, bits < min_sub);
  const VI signed_q = q | (v_bits & VI(static_cast<int32_t>(0x80000000u)));
  const VI out = VI::blendv(signed_q, v_bits, abs_bits > VI(0x7f800000));
  return at::vec::cast<float>(out);
}

inline float block_amax(const float* x, int64_t n) {
  V m(0.0f);
  for (int64_t j = 0; j < n; j += kStep) {
    const int64_t c = n - j < kStep ? n - j : kStep;
    m = at::vec::maximum(m, V::loadu(x + j, static_cast<int>(c)).abs());
  }
  float lanes[kStep];
  m.store(lanes);
  float amax = 0.0f;
  for (int64_t i = 0; i < kStep; ++i) {
    if (std::isnan(lanes[i])) return kNaN;
    if (lanes[i] > amax) amax = lanes[i];
  }
  return amax;
}

// A block's element-scale inverse and its value scale (NaN for a NaN block).
inline void block_scales(float amax, const Params& p, float* inverse, float* scale) {
  if (p.mode == 4) {
    float s = amax * p.scale_times_inv_max;
    if (!std::isnan(s)) s = std::fmin(std::fmin(s, kMax), 448.0f);
    *scale = to_e4m3(s);
    const float prod = *scale * p.decode;
    *inverse = std::isnan(prod) ? kNaN : std::fmin(1.0f / prod, kMax);
    return;
  }
  const int32_t code = e8m0_code(amax, p);
  if (code == 255) {
    *inverse = kNaN;
    *scale = kNaN;
  } else {
    *scale = std::ldexp(1.0f, code - 127);
    *inverse = (p.mode == 3 && code == 0) ? 1.0f : std::ldexp(1.0f, 127 - code);
  }
}

// A block of n consecutive elements; first_index: its first element's position
// in the blocked, zero-padded tensor (stochastic rounding's counter).
void block(const float* __restrict x, float* __restrict out, int64_t n,
           int64_t first_index, const Params& params) {
  const Params p = params;  // a local copy: stores to out cannot alias it
  float inverse, scale;
  block_scales(block_amax(x, n), p, &inverse, &scale);
  if (p.stochastic) {
    const V vinv(inverse), vscale(scale), vdecode(p.decode);
    const uint32_t base = static_cast<uint32_t>(first_index + p.seed);
    for (int64_t j = 0; j < n; j += kStep) {
      const int c = static_cast<int>(n - j < kStep ? n - j : kStep);
      const VI index = words_from(base + static_cast<uint32_t>(j), 1u);
      V value = round_stochastic_vec(V::loadu(x + j, c) * vinv, index, p) * vscale;
      if (p.mode == 4) value = value * vdecode;
      value.store(out + j, c);
    }
    return;
  }
  const V vinv(inverse), vscale(scale), vdecode(p.decode);
  const V vmax(p.max_value), vmin(p.min_normal), vbig(p.to_big);
  for (int64_t j = 0; j < n; j += kStep) {
    const int c = static_cast<int>(n - j < kStep ? n - j : kStep);
    V value = round_nearest_vec(V::loadu(x + j, c) * vinv, vmax, vmin, vbig) * vscale;
    if (p.mode == 4) value = value * vdecode;
    value.store(out + j, c);
  }
}

// `lanes` (at most kStep) blocks side by side: block l holds x[j * stride + l]
// for j < n; first_index(l) = first + l * lane_index_step.
void strided_blocks(const float* __restrict x, float* __restrict out, int64_t n,
                    int64_t stride, int lanes, int64_t first,
                    int64_t lane_index_step, const Params& params) {
  const Params p = params;
  V m(0.0f);
  for (int64_t j = 0; j < n; ++j)
    m = at::vec::maximum(m, V::loadu(x + j * stride, lanes).abs());
  float amax[kStep], inverse[kStep], scale[kStep];
  m.store(amax);
  for (int l = 0; l < lanes; ++l) {
    block_scales(amax[l], p, &inverse[l], &scale[l]);
  }
  for (int l = lanes; l < kStep; ++l) inverse[l] = scale[l] = 0.0f;
  const V vinv = V::loadu(inverse), vscale = V::loadu(scale), vdecode(p.decode);
  if (p.stochastic) {
    // Lane l's element j sits at first + l * lane_index_step + j.
    const VI lane_start = words_from(static_cast<uint32_t>(first + p.seed),
                                     static_cast<uint32_t>(lane_index_step));
    for (int64_t j = 0; j < n; ++j) {
      const VI index = lane_start + VI(static_cast<int32_t>(j));
      V value = round_stochastic_vec(V::loadu(x + j * stride, lanes) * vinv, index, p) *
                vscale;
      if (p.mode == 4) value = value * vdecode;
      value.store(out + j * stride, lanes);
    }
    return;
  }
  const V vmax(p.max_value), vmin(p.min_normal), vbig(p.to_big);
  for (int64_t j = 0; j < n; ++j) {
    V value = round_nearest_vec(V::loadu(x + j * stride, lanes) * vinv, vmax, vmin,
                                vbig) * vscale;
    if (p.mode == 4) value = value * vdecode;
    value.store(out + j * stride, lanes);
  }
}
}  // namespace

// x: (outer, cols, inner), contiguous; blocks of block_size along cols.
extern "C" void kernel(const float* x, float* out, int64_t outer, int64_t cols,
                       int64_t inner, int64_t block_size, const int64_t* ints,
                       const float* floats, int64_t threads) {
  Params p;
  p.mode = ints[0]; p.emax = ints[1]; p.mbits = ints[2]; p.stochastic = ints[3];
  p.seed = ints[4]; p.shift = ints[5]; p.min_normal_exponent = ints[6];
  p.kept_bits = ints[7]; p.tiny_shift = ints[8];
  p.max_value = floats[0]; p.min_normal = floats[1]; p.to_big = floats[2];
  p.min_subnormal = floats[3]; p.inv_min_normal = floats[4];
  p.tiny_scale = floats[5]; p.scale_times_inv_max = floats[6]; p.decode = floats[7];
  const int64_t blocks = (cols + block_size - 1) / block_size;
  const int64_t padded = blocks * block_size;
  const int64_t tasks = outer * blocks;
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
#endif
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t o = t / blocks, b = t % blocks;
    const int64_t start = b * block_size;
    const int64_t n = cols - start < block_size ? cols - start : block_size;
    if (inner == 1) {
      block(x + o * cols + start, out + o * cols + start, n, o * padded + start, p);
      continue;
    }
    // In the blocked layout (outer, inner, blocks, block_size), lane i's block
    // starts at ((o * inner + i) * blocks + b) * block_size.
    for (int64_t i = 0; i < inner; i += kStep) {
      const int lanes = static_cast<int>(inner - i < kStep ? inner - i : kStep);
      const int64_t offset = (o * cols + start) * inner + i;
      strided_blocks(x + offset, out + offset, n, inner, lanes,
                     (o * inner + i) * padded + start, padded, p);
    }
  }
}
"""

_KERNEL = NativeKernel(
    "unit_scaling.formats (block formats)",
    _SOURCE,
    [
        "const float*",
        "float*",
        "int64_t",
        "int64_t",
        "int64_t",
        "int64_t",
        "const int64_t*",
        "const float*",
        "int64_t",
    ],
)


def _serves(fmt: object, x: Tensor) -> bool:
    from ._block import BlockFormat

    assert isinstance(fmt, BlockFormat)
    element = fmt.element
    return (
        fmt.block_dims == 1
        and isinstance(element, FPFormat)
        and 1 <= element.mantissa_bits <= 22
        and element.exponent_bits <= 7
        and x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.bfloat16, torch.float16)
        and x.numel() > 0
        and in_memory(x)
    )


def native_quantise(
    fmt: object, x: Tensor, axis: int, encode: Tensor | None, decode: Tensor | None
) -> Tensor | None:
    """``fmt.quantise(x, axis)`` by the C++ kernel, or ``None`` where it does not
    serve (then the caller runs the eager path). ``axis`` is non-negative;
    ``encode``/``decode`` are NVFP4's per-tensor scales (0-d float32 tensors)."""
    from ._block import BlockFormat

    assert isinstance(fmt, BlockFormat)
    if not _serves(fmt, x) or (kernel := _KERNEL.get()) is None:
        return None
    element = fmt.element
    assert isinstance(element, FPFormat)
    flat = x.detach().float().contiguous()
    cols = flat.shape[axis]
    outer = math.prod(flat.shape[:axis])
    inner = math.prod(flat.shape[axis + 1 :])
    out = torch.empty_like(flat)
    stochastic = element.rounding == "stochastic"
    seed = 0
    if stochastic:  # drawn as the eager kernel draws it
        seed = int(
            torch.randint(0, (1 << 32), (), dtype=torch.int64, device=x.device).item()
        )
    sp = stochastic_params(element, FLOAT32_COMPUTE)
    if fmt.scale == "e8m0":
        mode, scale_times_inv_max, decode_value = _RULES[fmt.scale_rule], 0.0, 1.0
    else:
        assert encode is not None and decode is not None
        one = torch.tensor(1.0, device=x.device)
        limit = torch.tensor(
            element.max_absolute_value, dtype=torch.float32, device=x.device
        )
        mode = _NVFP4_MODE
        scale_times_inv_max = float(encode * torch.div(one, limit))
        decode_value = float(decode)
    ints = torch.tensor(
        [
            mode,
            element_emax(element),
            element.mantissa_bits,
            int(stochastic),
            seed,
            sp.shift,
            sp.min_normal_exponent,
            sp.kept_random_bits,
            sp.tiny_shift,
        ],
        dtype=torch.int64,
        device=x.device,
    )
    floats = torch.tensor(
        [
            element.max_absolute_value,
            element.min_absolute_normal,
            2.0 ** (23 - element.mantissa_bits),
            sp.min_subnormal,
            sp.inv_min_normal,
            sp.tiny_scale,
            scale_times_inv_max,
            decode_value,
        ],
        dtype=torch.float32,
        device=x.device,
    )
    blocks = outer * -(-cols // fmt.block_size)
    threads = min(native_threads(flat.numel(), _NUMEL_PER_THREAD), blocks)
    kernel(flat, out, outer, cols, inner, fmt.block_size, ints, floats, threads)
    return out.to(x.dtype)
