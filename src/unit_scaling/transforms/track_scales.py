"""``track_scales``: record the scale of every tensor in the forward and backward pass.

Statistics are computed on the tensor's device as it is produced (and on its
gradient as backpropagation reaches it, through a tensor hook), kept as small
device tensors of raw sums and counts, and read back to the host in one
transfer per device when ``scales_graph()`` is called. Tracking saves no tensor
for the backward pass, so it holds no activation longer than the untracked
model does.

On CPU one C++ pass reads each tensor in place (any layout that is rows of
contiguous elements, so slices and permutations need no copy); elsewhere, and
as the fallback, fused torch ops compute the same sums. Values that are
provably the same (views, aliases, unchanged parameters) are measured once.
"""

from __future__ import annotations

import contextvars
import copy
import dataclasses
import logging
import math
import operator
import re
import weakref
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, TypeVar

import torch
from torch import Tensor, nn
from torch.fx import Graph, GraphModule, Node
from torch.fx.node import Target, map_arg

from .. import functional as U
from .._kernels import CompiledKernels, NativeKernel, in_memory, native_threads
from .._torch_internals import is_functorch_wrapped_tensor
from ..formats import FP8_E4M3, FP8_E5M2
from ..scale import scale_bwd
from ._engine import (
    Capture,
    Place,
    RunState,
    StatefulPass,
    Transform,
    apply_transform,
    transform_state,
)
from ._graph import SAME_ELEMENTS, example_value
from ._rules import UNIT_SCALED_FUNCTIONS
from ._targets import calibrated_scale

__all__ = [
    "Metrics",
    "prune_non_float_tensors",
    "prune_same_scale_tensors",
    "prune_selected_nodes",
    "track_scales",
]

logger = logging.getLogger(__name__)
M = TypeVar("M", bound=nn.Module)

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


class Metrics:
    """Scale statistics of one tensor: ``fwd`` (its value), ``bwd`` (its gradient).

    ``bwd`` is ``None`` until a backward pass reaches the tensor.
    """

    @dataclasses.dataclass
    class Data:
        """Statistics of one tensor."""

        mean_abs: float
        abs_mean: float
        std: float
        abs_max: float
        abs_min: float
        numel: int
        e4m3_overflow: float = 0.0
        e4m3_underflow: float = 0.0
        e5m2_overflow: float = 0.0
        e5m2_underflow: float = 0.0

        @staticmethod
        def from_tensor(t: Tensor) -> Metrics.Data:
            """Compute the statistics of ``t`` (synchronises with the device)."""
            raw = _raw_statistics(t).tolist() if t.numel() else None
            return _finalize(raw, t.numel())

    _FULL_NAMES: ClassVar[dict[str, str]] = {
        "mean_abs": "mean absolute value",
        "abs_mean": "absolute mean value",
        "std": "standard deviation",
        "abs_max": "absolute maximum",
        "abs_min": "absolute minimum",
        "numel": "number of elements",
        "e4m3_overflow": "fraction above the E4M3 maximum",
        "e4m3_underflow": "fraction flushed to zero in E4M3",
        "e5m2_overflow": "fraction above the E5M2 maximum",
        "e5m2_underflow": "fraction flushed to zero in E5M2",
    }

    def __init__(self, fwd: Metrics.Data, bwd: Metrics.Data | None = None) -> None:
        self.fwd = fwd
        self.bwd = bwd

    def __repr__(self) -> str:
        return f"Metrics(fwd={self.fwd}, bwd={self.bwd})"

    @staticmethod
    def names() -> list[str]:
        """Field names of :class:`Metrics.Data`."""
        return [f.name for f in dataclasses.fields(Metrics.Data)]

    @staticmethod
    def full_names() -> list[str]:
        """Readable names of :class:`Metrics.Data` fields."""
        return [Metrics._FULL_NAMES[n] for n in Metrics.names()]

    @staticmethod
    def get_full_name(name: str) -> str:
        """The readable name of one field, e.g. ``"mean_abs"``."""
        if name not in Metrics._FULL_NAMES:
            raise ValueError(
                f"unknown metric {name!r}; expected one of {Metrics.names()}"
            )
        return Metrics._FULL_NAMES[name]


# --------------------------------------------------------------------------- #
# Statistics: one pass over a tensor gives raw sums and counts (kept on the
# device); Metrics.Data is derived from them on the host, in float64.
# --------------------------------------------------------------------------- #

# The raw accumulators, in order. The mean and the sum of squared deviations
# are of the finite elements: the C++ kernel sums each block of 1024 elements
# as deviations from a centre inside its bulk (so no cancellation when the mean
# is far from 0, whatever outliers the block holds), and merges the blocks in
# float64 (Chan et al.). Maximum and minimum ignore NaN.
_RAW_FIELDS = (
    "finite",  # count of finite elements
    "mean",
    "m2",  # sum of squared deviations from the mean
    "sum_abs",  # sum |x|
    "abs_max",
    "abs_min",
    "e4m3_over",  # count |x| > E4M3 max (infinities included)
    "e5m2_over",
    "e4m3_flush",  # count |x| <= E4M3 flush threshold (zeros included)
    "e5m2_flush",
    "zeros",
    "infs",
)

_NATIVE_SOURCE = r"""
#include <torch/csrc/inductor/cpp_prefix.h>
#ifdef _OPENMP
#include <omp.h>
#endif

// The raw statistics (_RAW_FIELDS) of a float tensor laid out as `rows` rows
// of `cols` contiguous elements, `row_stride` elements apart.
namespace {
using V = at::vec::Vectorized<float>;
constexpr int64_t kBlock = 1024;  // elements summed in float before float64
// Fetching 4 KiB ahead makes a tensor fresh from a matmul (not all of it in
// cache) read ~1.7x faster on the CPUs we measured.
constexpr int64_t kPrefetch = 1024;
enum Count { kAbove4, kAbove5, kFlush4, kFlush5, kZeros, kInfs, kCounts };

inline void prefetch(const float* address) {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(address);  // a hint: never faults, even past the end
#endif
}

struct Partial {
  double finite = 0, mean = 0, m2 = 0, sum_abs = 0, counts[kCounts] = {0};
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
  V acc[5] = {zero, zero, zero, zero, zero};
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
    mx = at::vec::maximum(mx, a & not_nan);
    mn = at::vec::minimum(mn, V::blendv(inf, a, not_nan));
  }
  const double finite = at::vec::vec_reduce_all<float>(sum, acc[4]);
  if (finite > 0) {
    const double d = total(acc[0]) - total(lost), d2 = total(acc[1]);
    p.merge(finite, c + d / finite, std::max(d2 - d * d / finite, 0.0));
  }
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
  }
  if (block_min <= E5M2_FLUSH) {
    p.counts[kFlush5] += count([&](V a) { return a <= e5f; });
    p.counts[kZeros] += count([&](V a) { return a == zero; });
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
    all.sum_abs += p.sum_abs;
    for (int c = 0; c < kCounts; ++c) all.counts[c] += p.counts[c];
    all.max = std::max(all.max, p.max);
    all.min = std::min(all.min, p.min);
  }
  const double fields[] = {
      all.finite, all.mean, all.m2, all.sum_abs, all.max, all.min,
      all.counts[kAbove4], all.counts[kAbove5], all.counts[kFlush4],
      all.counts[kFlush5], all.counts[kZeros], all.counts[kInfs]};
  for (int f = 0; f < 12; ++f) out[f] = fields[f];
}
"""
for _name, _value in (
    ("E4M3_MAX", _E4M3_MAX),
    ("E5M2_MAX", _E5M2_MAX),
    ("E4M3_FLUSH", _E4M3_FLUSH),
    ("E5M2_FLUSH", _E5M2_FLUSH),
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
    """The raw statistics (``_RAW_FIELDS``) of a flat, non-empty tensor, as
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
    mean = values.sum() / count.clamp_min(1)
    deviation = torch.where(finite, values - mean, 0.0)
    return torch.stack(
        [
            count,
            mean,
            (deviation * deviation).sum(),
            torch.where(finite, a, 0.0).sum(dtype=f64),
            torch.where(not_nan, a, 0.0).amax().double(),
            torch.where(not_nan, a, math.inf).amin().double(),
            (a > _E4M3_MAX).sum(dtype=f64),
            (a > _E5M2_MAX).sum(dtype=f64),
            (a <= _E4M3_FLUSH).sum(dtype=f64),
            (a <= _E5M2_FLUSH).sum(dtype=f64),
            (a == 0).sum(dtype=f64),
            (a == math.inf).sum(dtype=f64),
        ]
    )


def _rows(t: Tensor) -> tuple[int, int, int] | None:
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


def _raw_statistics(t: Tensor, rows: tuple[int, int, int] | None = None) -> Tensor:
    """The raw statistics of a non-empty tensor: float64 on ``t``'s device.

    ``rows``: ``_rows(t)``, if the caller knows it (and ``t`` is in memory).
    """
    kernel = _NATIVE.get() if t.device.type == "cpu" else None
    if kernel is not None and t.dtype in _NATIVE_DTYPES and in_memory(t):
        # The kernel reads memory (no autograd): no need to detach.
        if t.dtype != torch.float32 or (rows := rows or _rows(t)) is None:
            t = t.detach().float().contiguous()
            rows = 1, t.numel(), t.numel()
        threads = native_threads(t.numel(), _NUMEL_PER_THREAD)
        out = torch.empty(len(_RAW_FIELDS), dtype=torch.float64)
        kernel(t, out, *rows, threads)
        return out
    with torch.no_grad():
        flat = t.detach().reshape(-1).contiguous()
        return _KERNELS.run(_raw_statistics_kernel, _raw_statistics_kernel, flat)


def _finalize(raw: list[float] | None, numel: int) -> Metrics.Data:
    """:class:`Metrics.Data` from raw statistics (``None`` for an empty tensor).

    Means and the standard deviation (with Bessel's correction; 0 for one
    element) are over the finite elements, so that a mask holding ``-inf``
    still reports the scale of its finite part; the maximum shows infinities,
    and they count as FP8 overflow. NaN is ignored. A tensor with no finite
    element reports its means and standard deviation as ``inf`` (NaN if it
    holds NaN), never a misleading 0. Empty tensors give zeros.
    """
    if raw is None or numel == 0:
        return Metrics.Data(0.0, 0.0, 0.0, 0.0, 0.0, 0)
    r = dict(zip(_RAW_FIELDS, raw, strict=True))
    finite = r["finite"]
    if finite == 0:
        mean_abs = abs_mean = std = math.nan if numel > r["infs"] else math.inf
    else:
        mean_abs = r["sum_abs"] / finite
        abs_mean = abs(r["mean"])
        std = math.sqrt(r["m2"] / max(finite - 1, 1))
    return Metrics.Data(
        mean_abs,
        abs_mean,
        std,
        r["abs_max"],
        r["abs_min"],
        numel,
        r["e4m3_over"] / numel,
        (r["e4m3_flush"] - r["zeros"]) / numel,
        r["e5m2_over"] / numel,
        (r["e5m2_flush"] - r["zeros"]) / numel,
    )


def _value_source(node: Node) -> Node | None:
    """The input whose elements ``node`` holds, rearranged (views, copies and the
    two outputs of ``U.residual_split``); ``None`` for any other op."""
    is_view = node in SAME_ELEMENTS
    if node.op == "call_function" and node.target is operator.getitem:
        parent = node.args[0]
        is_view = isinstance(parent, Node) and parent.target is U.residual_split
        node = parent if is_view else node  # type: ignore[assignment]
    if not is_view or not node.args or not isinstance(node.args[0], Node):
        return None
    source = node.args[0]
    return source if _is_float(source) else None


def _is_float(node: Node) -> bool:
    return _is_tracked_value(example_value(node))


def _is_tracked_value(value: Any) -> bool:
    """A floating-point tensor of the program itself.

    Inside code that Dynamo traced under ``vmap`` (or ``torch.func.grad``),
    values are functorch wrappers holding one sample of a batch; their
    statistics are not those of any tensor of the program, and computing them
    would run (and record) batched tensors. The regions' outputs, plain tensors
    again, are tracked.
    """
    return (
        isinstance(value, Tensor)
        and value.is_floating_point()
        and not is_functorch_wrapped_tensor(value)
    )


@dataclasses.dataclass
class _TrackedGraph:
    """A snapshot of one transformed graph and where each node's statistics are."""

    graph: Graph
    # node name -> name of the node whose recorded statistics describe it
    fwd_source: dict[str, str]
    bwd_source: dict[str, str]


_Key = tuple[int, str]  # (capture id, node name)
_Record = tuple[Tensor | None, int]  # raw statistics (None if empty), numel


def _record(value: Tensor, rows: tuple[int, int, int] | None = None) -> _Record:
    numel = value.numel()
    return (_raw_statistics(value, rows) if numel else None), numel


class _TrackingPass(StatefulPass):
    """Inserts an observer after every floating-point node, and keeps what the
    observers record: on-device statistics per node, for forward and backward.

    Work is never repeated for values that are provably the same. In the graph:
    a node that only rearranges another's elements shares that node's forward
    statistics, and its gradient's when it is that node's only user (otherwise
    their gradients differ). At run time: a tensor (or gradient) with the same
    memory, layout and version as one already measured, and still alive, shares
    its statistics, e.g. both outputs of ``U.residual_split``, ``dropout(p=0)``,
    a parameter that no optimizer step has changed, or the one gradient that
    ``U.residual_add`` passes to both its inputs; a tensor object that is
    already hooked shares its gradient's.
    """

    def __init__(self) -> None:
        self.fwd: dict[_Key, _Record] = {}
        self.bwd: dict[_Key, _Record] = {}
        self.bwd_alias: dict[_Key, _Key] = {}
        self.graphs: dict[int, _TrackedGraph] = {}
        # Leaf tensors (parameters) outlive a step: hook each one only once.
        self._hooked: dict[_Key, weakref.ref[Tensor]] = {}
        # Live tensors measured or hooked, for sharing (entries die with them).
        self._measured: dict[tuple[Any, ...], tuple[weakref.ref[Tensor], _Record]] = {}
        self._hooked_by_id: dict[int, tuple[weakref.ref[Tensor], _Key]] = {}

    def fresh(self) -> _TrackingPass:
        return _TrackingPass()

    def _observer(self, capture_id: int) -> Callable[[Any, str, bool, bool], None]:
        def observe(value: Any, name: str, forward: bool, backward: bool) -> None:
            if not _is_tracked_value(value):
                return
            key = (capture_id, name)
            if forward:
                self.fwd[key] = self._measure(value)
            if backward and value.requires_grad:
                self._hook(key, value)

        return observe

    def _measure(self, value: Tensor) -> _Record:
        # Tensors hold the same elements while the first is alive if they have
        # the same memory, element layout (views reordering them have the same
        # rows) and type, and no in-place change since (the version counter,
        # shared by views).
        if value.is_inference() or not in_memory(value):
            return _record(value)
        rows = _rows(value)
        layout = rows or (value.shape, value.stride())
        memory = value.data_ptr(), value.dtype, layout, value._version
        seen = self._measured.get(memory)
        if seen is not None and seen[0]() is not None:
            return seen[1]
        record = _record(value, rows)
        self._measured[memory] = (_forget(self._measured, memory, value), record)
        return record

    def _hook(self, key: _Key, value: Tensor) -> None:
        if value.is_leaf:
            hooked = self._hooked.get(key)
            if hooked is not None and hooked() is value:
                return
            self._hooked[key] = weakref.ref(value)
        same = self._hooked_by_id.get(id(value))
        if same is not None and same[0]() is value and same[1] != key:
            self.bwd_alias[key] = same[1]  # the same tensor: the same gradient
            return
        self.bwd_alias.pop(key, None)
        self._hooked_by_id[id(value)] = (
            _forget(self._hooked_by_id, id(value), value),
            key,
        )

        def record_grad(grad: Tensor | None) -> None:
            # (None: an output of a custom autograd function that got no grad.)
            if grad is not None:
                self.bwd[key] = self._measure(grad)

        value.register_hook(record_grad)  # type: ignore[no-untyped-call]

    def __call__(self, gm: GraphModule) -> GraphModule:
        capture_id = len(self.graphs)
        internal = _internal_values(gm.graph)
        snapshot = Graph()
        snapshot.output(snapshot.graph_copy(gm.graph, {}))
        fwd_source: dict[str, str] = {}
        bwd_source: dict[str, str] = {}
        observe = self._observer(capture_id)
        for node in list(gm.graph.nodes):
            if node.op == "output" or not _may_be_float(node):
                continue
            alias = internal.get(node)
            if alias is not None:
                fwd_source[node.name] = fwd_source.get(alias.name, alias.name)
                bwd_source[node.name] = bwd_source.get(alias.name, alias.name)
                continue
            source = _value_source(node)
            forward = backward = True
            fwd_source[node.name] = bwd_source[node.name] = node.name
            if source is not None:
                forward = False
                fwd_source[node.name] = fwd_source.get(source.name, source.name)
                users = [u for u in source.users if u.target is not observe]
                # (The outputs of residual_split have gradients of their own.)
                if users == [node]:
                    backward = False
                    bwd_source[node.name] = bwd_source.get(source.name, source.name)
            logger.info("adding tracking to node: %s", node)
            with gm.graph.inserting_after(node):
                gm.graph.call_function(observe, (node, node.name, forward, backward))
        self.graphs[capture_id] = _TrackedGraph(snapshot, fwd_source, bwd_source)
        return gm


def _internal_values(graph: Graph) -> dict[Node, Node]:
    """Values that ``unit_scale`` made, not the model, each with the node whose
    statistics it reports: the output of a ``scale_bwd`` reports its input (it
    holds the same value; only the gradient passed back differs, by the static
    factor folded into the backward), and a region's output before its
    calibrated scale reports the scaled output (what the model's tensor is now).
    Neither is observed; ``prune_same_scale_tensors`` then keeps one node each."""
    internal: dict[Node, Node] = {}
    for node in graph.nodes:
        if node.op != "call_function" or not node.args:
            continue
        source = node.args[0]
        if not isinstance(source, Node):
            continue
        if node.target is scale_bwd:
            internal[node] = source
        elif (
            node.target is calibrated_scale
            and len(source.users) == 1
            and source.op == "call_function"
        ):
            internal[source] = node
    return internal


def _forget(table: dict[Any, Any], key: Any, value: Tensor) -> weakref.ref[Tensor]:
    """A weak reference to ``value`` that removes ``table[key]`` when ``value``
    dies (unless the entry has been replaced since)."""

    def remove(ref: weakref.ref[Tensor]) -> None:
        entry = table.get(key)
        if entry is not None and entry[0] is ref:
            del table[key]

    return weakref.ref(value, remove)


def _may_be_float(node: Node) -> bool:
    """A node to observe: its recorded value is a float tensor of the program, or
    it has no recorded value (a node added by a transform: checked at run time)."""
    if node.op != "placeholder" and "example_value" not in node.meta:
        return True
    return _is_float(node)


def _clean_name(name: str) -> str:
    """``l_self_modules_h_modules_0_parameters_weight_`` -> ``h.0.weight``."""
    name = re.sub(r"^[lL]_+(self_+)?", "", name).strip("_")
    name = re.sub(r"(^|_)(modules|parameters|buffers)_", ".", name)
    return name.strip(".")


def _read_statistics(records: dict[_Key, _Record]) -> dict[_Key, Metrics.Data]:
    """All recorded statistics, copied to the host in one transfer per device."""
    by_device: dict[torch.device, list[Tensor]] = {}
    for raw, _ in records.values():
        if raw is not None:
            by_device.setdefault(raw.device, []).append(raw)
    host = {
        device: iter(torch.stack(raws).cpu().tolist())
        for device, raws in by_device.items()
    }
    return {
        key: _finalize(None if raw is None else next(host[raw.device]), numel)
        for key, (raw, numel) in records.items()
    }


def _scales_graph(
    recorder: _TrackingPass, captures: list[Capture], all_captures: list[Capture]
) -> Graph:
    """One graph holding every tracked tensor of the last forward pass."""
    fwd, bwd = _read_statistics(recorder.fwd), _read_statistics(recorder.bwd)
    bwd.update(
        (key, bwd[source])
        for key, source in recorder.bwd_alias.items()
        if source in bwd
    )
    merged = Graph()
    outputs: list[Any] = []
    for capture in captures:
        capture_id = all_captures.index(capture)
        tracked = recorder.graphs[capture_id]
        value_map: dict[Node, Node] = {}
        out = merged.graph_copy(tracked.graph, value_map)
        outputs.append(out)
        for old, new in value_map.items():
            value = example_value(old)
            fwd_key = (capture_id, tracked.fwd_source.get(old.name, old.name))
            bwd_key = (capture_id, tracked.bwd_source.get(old.name, old.name))
            # Nodes without a recorded value were checked at run time.
            is_float = _is_tracked_value(value) or (
                "example_value" not in old.meta and fwd_key in fwd
            )
            new.meta["clean_name"] = old.meta.get("source_name") or _clean_name(
                old.name
            )
            new.meta["outputs_float_tensor"] = is_float
            new.meta["requires_grad"] = (
                isinstance(value, nn.Parameter) and value.requires_grad
            )
            if is_float and fwd_key in fwd:
                new.meta["metrics"] = Metrics(fwd[fwd_key], bwd.get(bwd_key))
    output = merged.output(tuple(outputs) if len(outputs) != 1 else outputs[0])
    output.meta.update(
        clean_name="output", outputs_float_tensor=False, requires_grad=False
    )
    return merged


# Set while a call runs with its inputs as given (see _InputGradFallback).
_INPUTS_AS_GIVEN: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "track_scales_inputs_as_given", default=False
)


def _inputs_to_track(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Tensor]:
    """The floating-point leaf inputs that do not require grad yet."""
    return [
        value
        for value in (*args, *kwargs.values())
        if isinstance(value, Tensor)
        and value.is_floating_point()
        and value.is_leaf
        and not value.requires_grad
    ]


def _make_inputs_require_grad(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    if not _INPUTS_AS_GIVEN.get():
        for value in _inputs_to_track(args, kwargs):
            value.requires_grad_()


def _rejects_input_grad(error: RuntimeError) -> bool:
    # torch's message when code sets ``.requires_grad`` on a non-leaf tensor.
    return "requires_grad flags of leaf variables" in str(error)


class _InputGradFallback:
    """The forward of a tracked module: reruns a call with its inputs as given
    when the model cannot take inputs that require grad.

    Some models set ``t.requires_grad = True`` on a tensor computed from their
    input alone (Hugging Face's audio feature encoders do, in training mode, for
    gradient checkpointing). That is only allowed on a leaf, and ``t`` stops
    being one once the input requires grad, so such a model fails with any input
    that requires grad, ours included. Their input gradients cannot be tracked:
    we undo ``requires_grad_()`` on the inputs, rerun the call from the start
    (the failed attempt stopped at the model's assignment), and leave inputs as
    given from then on.
    """

    def __init__(self, forward: Callable[..., Any], state: RunState) -> None:
        self._forward = forward
        self._state = state
        self.inputs_as_given = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            return self._forward(*args, **kwargs)
        if self.inputs_as_given:
            return self._call_with_inputs_as_given(args, kwargs)
        tracked_inputs = _inputs_to_track(args, kwargs)
        try:
            return self._forward(*args, **kwargs)
        except RuntimeError as error:
            if not (tracked_inputs and _rejects_input_grad(error)):
                raise
            logger.warning(
                "track_scales: the model sets requires_grad on a tensor computed "
                "from its inputs, which fails when an input requires grad (%s). "
                "Rerunning with inputs as given: their gradients are not tracked.",
                str(error).splitlines()[0],
            )
        for value in tracked_inputs:
            value.requires_grad_(False)
        self.inputs_as_given = True
        self._state.calls -= 1  # the failed attempt does not count as a call
        return self._call_with_inputs_as_given(args, kwargs)

    def _call_with_inputs_as_given(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        token = _INPUTS_AS_GIVEN.set(True)
        try:
            return self._forward(*args, **kwargs)
        finally:
            _INPUTS_AS_GIVEN.reset(token)

    def __deepcopy__(self, memo: dict[int, Any]) -> _InputGradFallback:
        # copy.deepcopy(module) copies the module, and its state, first.
        copied = _InputGradFallback(
            copy.deepcopy(self._forward, memo), copy.deepcopy(self._state, memo)
        )
        copied.inputs_as_given = self.inputs_as_given
        return copied

    def __reduce__(self) -> Any:
        return self._state.__reduce__()


def track_scales(module: M) -> M:
    """Return a copy of ``module`` that records the scale of every tensor it uses.

    After a forward (and optionally backward) pass, ``model.scales_graph()``
    returns a :class:`torch.fx.Graph` whose floating-point nodes carry
    ``meta["metrics"]`` (:class:`Metrics`, with ``.fwd`` and ``.bwd``
    statistics); every node, the output included, carries
    ``meta["clean_name"]``, ``meta["outputs_float_tensor"]`` and
    ``meta["requires_grad"]``. Before the first forward pass no metrics exist
    yet, and ``scales_graph()`` returns an empty graph. Beyond the scale
    statistics, each :class:`Metrics.Data` holds the fractions of elements that
    would overflow or flush to zero in FP8 E4M3 and E5M2. Where TorchDynamo
    breaks the forward into several graphs, all of them are tracked and merged.
    Values inside code traced under ``vmap`` are per-sample views, not tensors
    of the program: they are not tracked (``outputs_float_tensor`` is false).

    Floating-point tensor inputs get ``requires_grad_()`` so that their gradients
    are tracked too, unless the model cannot take such inputs (it sets
    ``requires_grad`` on a tensor computed from them): then the call is rerun
    with inputs as given, with a warning. Statistics stay on the device until
    ``scales_graph()`` reads them in one transfer. Tracking is always applied
    last, and runs eagerly.

    Example::

        >>> model = track_scales(nn.Sequential(nn.Linear(8, 8), nn.ReLU()))
        >>> model(torch.randn(4, 8)).sum().backward()
        >>> graph = model.scales_graph()
        >>> [n.meta["clean_name"] for n in graph.nodes if "metrics" in n.meta]
        ['0.weight', '0.bias', 'input', 'input_1', 'input_2']
    """
    previous = transform_state(module) if isinstance(module, nn.Module) else None
    if previous is not None and previous.config.backend is not None:
        logger.info(
            "track_scales runs the model eagerly: dropping %s",
            previous.config.backend[0],
        )
    transform = Transform(
        name="track_scales",
        place=Place.OBSERVE,
        graph_pass=_TrackingPass(),
        eager=True,
        non_recurse=UNIT_SCALED_FUNCTIONS,
        before_call=(_make_inputs_require_grad,),
        attributes=(("scales_graph", _ScalesGraph),),
    )
    tracked = apply_transform(module, transform)
    state = transform_state(tracked)
    assert state is not None
    object.__setattr__(tracked, "forward", _InputGradFallback(tracked.forward, state))
    return tracked


class _ScalesGraph:
    """``module.scales_graph()``: bound to the module's own transform state."""

    def __init__(self, state: RunState) -> None:
        self._state = state

    def __call__(self) -> Graph:
        """The graph of the last forward pass, every tracked tensor annotated
        (an empty graph before the first forward pass)."""
        state = self._state
        if not state.graphs_run_in_call:
            return Graph()
        tracking = state.pass_of(_TrackingPass)
        return _scales_graph(tracking, state.graphs_run_in_call, state.captures)

    def __deepcopy__(self, memo: dict[int, Any]) -> _ScalesGraph:
        # The module's state is copied first (it is set before this attribute).
        return _ScalesGraph(copy.deepcopy(self._state, memo))


def _float_args(args: Iterable[Any]) -> list[Node]:
    return [
        a
        for a in args
        if isinstance(a, Node) and a.meta.get("outputs_float_tensor", False)
    ]


def _require_tracked(graph: Graph) -> None:
    # An empty graph is what scales_graph() returns before a forward pass.
    if graph.nodes and not any("clean_name" in n.meta for n in graph.nodes):
        raise ValueError(
            "the graph must come from `model.scales_graph()` of a module wrapped "
            "with unit_scaling.transforms.track_scales; other FX graphs lack the "
            "metadata that pruning relies on"
        )


def _remove(graph: Graph, node: Node, replacement: Node | None) -> None:
    """Erase ``node``, pointing its users at ``replacement`` (possibly ``None``)."""
    for user in list(node.users):
        user.args = map_arg(user.args, lambda n: replacement if n is node else n)
        user.kwargs = map_arg(user.kwargs, lambda n: replacement if n is node else n)
    graph.erase_node(node)


def prune_non_float_tensors(graph: Graph) -> Graph:
    """A copy of ``graph`` without the nodes that don't output floating-point tensors.

    Users of a removed node are rewired to its only floating-point input, if it
    has exactly one (else to ``None``).
    """
    _require_tracked(graph)
    graph = _copy(graph)
    for node in list(graph.nodes):
        if node.op == "output" or node.meta.get("outputs_float_tensor", False):
            continue
        inputs = _float_args(node.all_input_nodes)
        logger.info("pruning non-float node: %s", node)
        _remove(graph, node, inputs[0] if len(inputs) == 1 else None)
    return graph


def _same_scale(a: Metrics, b: Metrics, rtol: float) -> bool:
    def close(x: Metrics.Data | None, y: Metrics.Data | None) -> bool:
        if x is None or y is None:
            return x is None and y is None
        return math.isclose(x.mean_abs, y.mean_abs, rel_tol=rtol)

    return close(a.fwd, b.fwd) and close(a.bwd, b.bwd)


def prune_same_scale_tensors(graph: Graph, rtol: float = 2**-16) -> Graph:
    """A copy of ``graph`` without nodes that keep the scale of their only float input.

    Removes uninformative nodes such as reshapes. A node with several
    floating-point inputs is never removed. ``rtol`` is the relative change of
    ``mean_abs`` (forward and backward) below which the scale counts as the same.
    """
    _require_tracked(graph)
    graph = _copy(graph)
    for node in list(graph.nodes):
        metrics = node.meta.get("metrics")
        inputs = _float_args(node.all_input_nodes)
        if metrics is None or len(inputs) != 1:
            continue
        source = inputs[0].meta.get("metrics")
        if source is not None and _same_scale(metrics, source, rtol):
            logger.info("pruning same-scale node: %s", node)
            _remove(graph, node, inputs[0])
    return graph


def prune_selected_nodes(graph: Graph, targets: Iterable[Target]) -> Graph:
    """A copy of ``graph`` without the nodes calling any of ``targets``."""
    targets = set(targets)
    graph = _copy(graph)
    for node in list(graph.nodes):
        if node.op != "output" and node.target in targets:
            logger.info("pruning node: %s", node)
            inputs = _float_args(node.all_input_nodes)
            _remove(graph, node, inputs[0] if len(inputs) == 1 else None)
    return graph


def _copy(graph: Graph) -> Graph:
    new = Graph()
    value_map: dict[Node, Node] = {}
    out = new.graph_copy(graph, value_map)
    for output in graph.find_nodes(op="output"):
        new.output(out).meta.update(output.meta)
    return new
