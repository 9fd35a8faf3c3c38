"""Raw scale statistics of a tensor: one pass gives sums and counts, kept on
the tensor's device, from which :class:`Metrics.Data` is derived on the host.

On CPU one C++ pass (:class:`NativeKernel`) reads each tensor in place (any
layout that is rows of contiguous elements, so slices and permutations need no
copy); elsewhere, and as the fallback, fused torch ops compute the same sums.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..._kernels import CompiledKernels, NativeKernel, in_memory, native_threads
from ...formats import FP8_E4M3, FP8_E5M2, FPFormat

__all__ = ["RAW_FIELDS", "raw_statistics", "row_layout"]

# Rounding to nearest flushes to zero any magnitude up to half the smallest
# subnormal (the tie rounds to the even encoding, zero).
_E4M3_MAX, _E4M3_FLUSH = (
    FP8_E4M3.max_absolute_value,
    FP8_E4M3.min_absolute_subnormal / 2,
)
_E5M2_MAX, _E5M2_FLUSH = (
    FP8_E5M2.max_absolute_value,
    FP8_E5M2.min_absolute_subnormal / 2,
)
_FP16 = FPFormat(5, 10)
_FP16_MAX, _FP16_FLUSH = _FP16.max_absolute_value, _FP16.min_absolute_subnormal / 2

# The raw accumulators, in order (``_metrics.finalize`` reads them). The mean
# and the sum of squared deviations are of the finite elements: the C++ kernel
# sums each block of 1024 elements as deviations from a centre inside its bulk
# (so no cancellation when the mean is far from 0, whatever outliers the block
# holds), and merges the blocks in float64 (Chan et al.). ``mean_abs`` and
# ``abs_mean`` come from the sums of |x| and of x, which must be equal in
# magnitude, not merely close, for a tensor of one sign: the C++ kernel adds
# both in the same order (negating every addend negates each rounded sum), the
# torch kernel derives both from one sum of the positive and one of the
# negative elements (a device may order two reductions differently).
# Maximum and minimum ignore NaN.
RAW_FIELDS = (
    "finite",  # count of finite elements
    "mean",
    "m2",  # sum of squared deviations from the mean
    "sum",  # sum x
    "sum_abs",  # sum |x|
    "abs_max",
    "abs_min",
    "e4m3_over",  # count |x| > E4M3 max (infinities included)
    "e5m2_over",
    "e4m3_flush",  # count |x| <= E4M3 flush threshold (zeros included)
    "e5m2_flush",
    "zeros",
    "infs",
    "fp16_over",  # count |x| > FP16 max (what the scale monitor reports)
    "fp16_flush",  # count |x| <= FP16 flush threshold (zeros included)
)
# (the fields the native kernel sums in float, and the largest magnitude)
_SUMS = [RAW_FIELDS.index(f) for f in ("mean", "m2", "sum", "sum_abs")]
_MAX = RAW_FIELDS.index("abs_max")

_NATIVE_SOURCE = r"""
#include <torch/csrc/inductor/cpp_prefix.h>
#ifdef _OPENMP
#include <omp.h>
#endif

// The raw statistics (RAW_FIELDS) of a float tensor laid out as `rows` rows
// of `cols` contiguous elements, `row_stride` elements apart.
namespace {
using V = at::vec::Vectorized<float>;
constexpr int64_t kBlock = 1024;  // elements summed in float before float64
// Fetching 4 KiB ahead makes a tensor fresh from a matmul (not all of it in
// cache) read ~1.7x faster on the CPUs we measured.
constexpr int64_t kPrefetch = 1024;
enum Count {
  kAbove4, kAbove5, kFlush4, kFlush5, kZeros, kInfs, kAbove16, kFlush16, kCounts
};

inline void prefetch(const float* address) {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(address);  // a hint: never faults, even past the end
#endif
}

struct Partial {
  double finite = 0, mean = 0, m2 = 0, sum = 0, sum_abs = 0, counts[kCounts] = {0};
  float max = 0.0f, min = std::numeric_limits<float>::infinity();

  // Chan et al.'s update: merge n elements of mean m and squared deviations s.
  void merge(double n, double m, double s) {
    if (n == 0) return;
    const double total = finite + n, delta = m - mean;
    mean += delta * n / total;
    m2 += s + delta * delta * finite * n / total;
    finite = total;
  }
};

inline void add_block(const float* x, int64_t n, Partial& p) {
  const V inf(std::numeric_limits<float>::infinity()), one(1.0f), zero(0.0f);
  const V e4(E4M3_MAX), e5(E5M2_MAX), e4f(E4M3_FLUSH), e5f(E5M2_FLUSH);
  const V h(FP16_MAX), hf(FP16_FLUSH);
  __at_align__ float tail[V::size()];
  const int64_t full = n - n % V::size();
  if (full < n) {  // padding with NaN leaves every statistic unchanged
    for (int64_t j = 0; j < V::size(); ++j)
      tail[j] = full + j < n ? x[full + j] : std::numeric_limits<float>::quiet_NaN();
  }
  auto load = [&](int64_t i) { return V::loadu(i < full ? x + i : tail); };
  auto sum = [](V a, V b) { return a + b; };
  auto total = [](V a) {  // in float64: lanes of a signed sum may cancel
    __at_align__ float lanes[V::size()];
    a.store(lanes);
    double s = 0;
    for (float lane : lanes) s += lane;
    return s;
  };
  auto count = [&](auto&& counted) {
    V c = zero;
    for (int64_t i = 0; i < n; i += V::size()) c = c + (one & counted(load(i).abs()));
    return static_cast<double>(at::vec::vec_reduce_all<float>(sum, c));
  };
  // Deviations are taken from a centre near the bulk of the block: the median
  // of three of its finite elements, so that an outlier cannot be the centre.
  float samples[3];
  int taken = 0;
  for (int64_t i : {int64_t{0}, n / 2, n - 1})
    if (std::abs(x[i]) < std::numeric_limits<float>::infinity())
      samples[taken++] = x[i];
  std::sort(samples, samples + taken);
  const float c = taken ? samples[(taken - 1) / 2] : 0.0f;
  const V centre(c);
  // One pass for the moments, the extremes and the commonest count...
  V acc[6] = {zero, zero, zero, zero, zero, zero};
  V lost = zero;  // Kahan compensation of acc[0]: a signed sum may cancel
  V mx = zero, mn = inf;
  for (int64_t i = 0; i < n; i += V::size()) {
    prefetch(x + i + kPrefetch);
    V v = load(i);
    V a = v.abs();
    V finite = a < inf;
    V not_nan = v == v;
    V d = V::blendv(centre, v, finite) - centre;
    const V y = d - lost, t = acc[0] + y;
    lost = (t - acc[0]) - y;
    acc[0] = t;
    acc[1] = at::vec::fmadd(d, d, acc[1]);
    acc[2] = acc[2] + (a & finite);
    acc[3] = acc[3] + (one & (a <= e4f));
    acc[4] = acc[4] + (one & finite);
    acc[5] = acc[5] + (v & finite);  // as acc[2], for equal magnitudes
    mx = at::vec::maximum(mx, a & not_nan);
    mn = at::vec::minimum(mn, V::blendv(inf, a, not_nan));
  }
  const double finite = at::vec::vec_reduce_all<float>(sum, acc[4]);
  if (finite > 0) {
    const double d = total(acc[0]) - total(lost), d2 = total(acc[1]);
    p.merge(finite, c + d / finite, std::max(d2 - d * d / finite, 0.0));
  }
  p.sum += total(acc[5]);
  p.sum_abs += total(acc[2]);
  p.counts[kFlush4] += at::vec::vec_reduce_all<float>(sum, acc[3]);
  const float block_max = at::vec::vec_reduce_all<float>(
      [](V a, V b) { return at::vec::maximum(a, b); }, mx);
  const float block_min = at::vec::vec_reduce_all<float>(
      [](V a, V b) { return at::vec::minimum(a, b); }, mn);
  p.max = std::max(p.max, block_max);
  p.min = std::min(p.min, block_min);
  // ... and the rare counts only where the extremes show there is something to
  // count (the block is in L1 cache by now).
  if (block_max > E4M3_MAX) {
    p.counts[kAbove4] += count([&](V a) { return a > e4; });
    p.counts[kAbove5] += count([&](V a) { return a > e5; });
    p.counts[kInfs] += count([&](V a) { return a == inf; });
    if (block_max > FP16_MAX) p.counts[kAbove16] += count([&](V a) { return a > h; });
  }
  if (block_min <= E5M2_FLUSH) {
    p.counts[kFlush5] += count([&](V a) { return a <= e5f; });
    p.counts[kZeros] += count([&](V a) { return a == zero; });
    if (block_min <= FP16_FLUSH)
      p.counts[kFlush16] += count([&](V a) { return a <= hf; });
  }
}
}  // namespace

extern "C" void kernel(const float* x, double* out, int64_t rows, int64_t cols,
                       int64_t row_stride, int64_t threads) {
  const int64_t per_row = (cols + kBlock - 1) / kBlock, blocks = rows * per_row;
  constexpr int64_t kMaxThreads = 256;
  Partial partials[kMaxThreads];
  const int64_t wanted = std::min({threads, blocks, kMaxThreads});
  const int nt = static_cast<int>(std::max<int64_t>(1, wanted));
#ifdef _OPENMP
#pragma omp parallel num_threads(nt) if (nt > 1)
#endif
  {
#ifdef _OPENMP
    Partial& p = partials[omp_get_thread_num()];
#pragma omp for schedule(static)
#else
    Partial& p = partials[0];
#endif
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t row = b / per_row, start = (b % per_row) * kBlock;
      add_block(x + row * row_stride + start, std::min(kBlock, cols - start), p);
    }
  }
  Partial all;
  for (int t = 0; t < nt; ++t) {
    const Partial& p = partials[t];
    all.merge(p.finite, p.mean, p.m2);
    all.sum += p.sum;
    all.sum_abs += p.sum_abs;
    for (int c = 0; c < kCounts; ++c) all.counts[c] += p.counts[c];
    all.max = std::max(all.max, p.max);
    all.min = std::min(all.min, p.min);
  }
  const double fields[] = {
      all.finite, all.mean, all.m2, all.sum, all.sum_abs, all.max, all.min,
      all.counts[kAbove4], all.counts[kAbove5], all.counts[kFlush4],
      all.counts[kFlush5], all.counts[kZeros], all.counts[kInfs],
      all.counts[kAbove16], all.counts[kFlush16]};
  for (size_t f = 0; f < sizeof(fields) / sizeof(double); ++f) out[f] = fields[f];
}
"""
for _name, _value in (
    ("E4M3_MAX", _E4M3_MAX),
    ("E5M2_MAX", _E5M2_MAX),
    ("E4M3_FLUSH", _E4M3_FLUSH),
    ("E5M2_FLUSH", _E5M2_FLUSH),
    ("FP16_MAX", _FP16_MAX),
    ("FP16_FLUSH", _FP16_FLUSH),
):
    _NATIVE_SOURCE = _NATIVE_SOURCE.replace(_name, f"{float(_value).hex()}f")

_NATIVE = NativeKernel(
    "unit_scaling.transforms.track_scales",
    _NATIVE_SOURCE,
    ["const float*", "double*", "int64_t", "int64_t", "int64_t", "int64_t"],
)
_KERNELS = CompiledKernels("unit_scaling.transforms.track_scales")
# A thread per 2**16 elements (~30 us of work), at most torch's intra-op
# threads. On the decoder benchmark (idle 2-core VM) two threads take tracking
# from 1.41x to 1.28x; but on a loaded machine each OpenMP region can stall for
# a scheduler slice (there, one thread per tensor measured 1.08x, two 1.4-1.9x).
_NUMEL_PER_THREAD = 1 << 16
_NATIVE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _raw_statistics_kernel(x: Tensor) -> Tensor:
    """The raw statistics (``RAW_FIELDS``) of a flat, non-empty tensor, as
    float64, with torch ops (compiled: fused kernels). The reference for the
    C++ kernel, and the path for other devices and float64."""
    if x.dtype != torch.float64:
        x = x.float()
    a = x.abs()
    finite = a < math.inf
    not_nan = x == x
    f64 = torch.float64
    count = finite.sum(dtype=f64)
    values = torch.where(finite, x, 0.0).double()
    positive, negative = values.clamp_min(0.0).sum(), values.clamp_max(0.0).sum()
    mean = values.sum() / count.clamp_min(1)
    deviation = torch.where(finite, values - mean, 0.0)
    return torch.stack(
        [
            count,
            mean,
            (deviation * deviation).sum(),
            positive + negative,
            positive - negative,
            torch.where(not_nan, a, 0.0).amax().double(),
            torch.where(not_nan, a, math.inf).amin().double(),
            (a > _E4M3_MAX).sum(dtype=f64),
            (a > _E5M2_MAX).sum(dtype=f64),
            (a <= _E4M3_FLUSH).sum(dtype=f64),
            (a <= _E5M2_FLUSH).sum(dtype=f64),
            (a == 0).sum(dtype=f64),
            (a == math.inf).sum(dtype=f64),
            (a > _FP16_MAX).sum(dtype=f64),
            (a <= _FP16_FLUSH).sum(dtype=f64),
        ]
    )


def row_layout(t: Tensor) -> tuple[int, int, int] | None:
    """``t``'s elements as ``(rows, cols, row_stride)``: rows of ``cols``
    contiguous elements from ``t.data_ptr()`` (dimensions reordered and merged,
    since statistics do not depend on order); ``None`` if no such layout holds
    them (e.g. a broadcast)."""
    dims = sorted(
        (
            (stride, size)
            for size, stride in zip(t.shape, t.stride(), strict=True)
            if size != 1
        ),
        reverse=True,
    )
    merged: list[tuple[int, int]] = []
    for stride, size in dims:
        if merged and merged[-1][0] == stride * size:
            merged[-1] = (stride, merged[-1][1] * size)
        else:
            merged.append((stride, size))
    if not merged:
        return 1, 1, 1
    if merged[-1][0] != 1 or len(merged) > 2:
        return None
    if len(merged) == 1:
        return 1, merged[0][1], merged[0][1]
    return merged[0][1], merged[1][1], merged[0][0]


def raw_statistics(t: Tensor, rows: tuple[int, int, int] | None = None) -> Tensor:
    """The raw statistics of a non-empty tensor: float64 on ``t``'s device.

    ``rows``: ``row_layout(t)``, if the caller knows it (and ``t`` is in memory).
    """
    kernel = _NATIVE.get() if t.device.type == "cpu" else None
    if kernel is not None and t.dtype in _NATIVE_DTYPES and in_memory(t):
        # The kernel reads memory (no autograd): no need to detach.
        if t.dtype != torch.float32 or (rows := rows or row_layout(t)) is None:
            t = t.detach().float().contiguous()
            rows = 1, t.numel(), t.numel()
        threads = native_threads(t.numel(), _NUMEL_PER_THREAD)
        out = torch.empty(len(RAW_FIELDS), dtype=torch.float64, device=t.device)
        kernel(t, out, *rows, threads)
        if bool(torch.isfinite(out[_SUMS]).all()) or not math.isfinite(out[_MAX]):
            return out
        # Finite values past float32's square root (a mask of finfo.min) overflow
        # the kernel's float partial sums: the float64 path sums them, as on a GPU.
    with torch.no_grad():
        flat = t.detach().reshape(-1).contiguous()
        return _KERNELS.run(_raw_statistics_kernel, _raw_statistics_kernel, flat)
