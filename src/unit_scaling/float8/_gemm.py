"""FP8 GEMMs through ``torch._scaled_mm``: saturating casts, zero padding to
the sizes cuBLAS takes, and the static dequantisation scale of each product."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .._torch_internals import onednn_enabled, scaled_mm, set_onednn_enabled

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
# cuBLAS's FP8 GEMMs take dimensions that are multiples of 16.
MULTIPLE = 16


def fits(in_features: int, out_features: int) -> bool:
    """Whether cuBLAS's FP8 GEMMs take a layer of these sizes as they are."""
    return in_features % MULTIPLE == 0 and out_features % MULTIPLE == 0


def cast(x: Tensor, dtype: torch.dtype) -> Tensor:
    """Round ``x`` to the FP8 ``dtype``, saturating at its largest value."""
    limit = torch.finfo(dtype).max
    return x.clamp(-limit, limit).to(dtype)


def pad(x: Tensor, dim: int) -> Tensor:
    """``x`` with zeros appended along ``dim`` up to a multiple of 16 (for FP8
    tensors through their bytes: a zero byte is +0.0)."""
    short = -x.shape[dim] % MULTIPLE
    if short == 0:
        return x
    widths = [0, 0] * (x.dim() - 1 - dim % x.dim()) + [0, short]
    if x.dtype in FP8:
        return F.pad(x.view(torch.uint8), widths).view(x.dtype)
    return F.pad(x, widths)


def column_major(x: Tensor) -> Tensor:
    """``x`` with the same values, laid out column-major."""
    return x.t().contiguous().t()


def cast_column_major(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``column_major(cast(x, dtype))`` for a 2-D ``x``, the conversion writing
    the column-major layout itself: one pass over the FP8 bytes fewer."""
    limit = torch.finfo(dtype).max
    rows, columns = x.shape
    out = torch.empty_strided((rows, columns), (1, rows), dtype=dtype, device=x.device)
    return out.copy_(x.clamp(-limit, limit))


_SCALES: dict[tuple[float, torch.device], Tensor] = {}


def _scale(value: float, device: torch.device) -> Tensor:
    """``value`` as the float32 scalar tensor ``_scaled_mm`` takes, made once per
    value and device (a fresh one on a GPU would be a host-to-device copy)."""
    if torch.compiler.is_compiling():
        return torch.full((), value, dtype=torch.float32, device=device)
    key = (value, device)
    found = _SCALES.get(key)
    if found is None:
        found = _SCALES[key] = torch.full((), value, dtype=torch.float32, device=device)
    return found


def gemm(a: Tensor, b: Tensor, scale: float, out_dtype: torch.dtype) -> Tensor:
    """``scale * (a @ b)`` for FP8 ``a`` (row-major) and ``b`` (column-major)."""
    if a.device.type == "cpu":
        on_cpu: Tensor = _cpu_gemm(a, b, _scale(scale, a.device), out_dtype)
        return on_cpu
    out: Tensor = scaled_mm(
        a,
        b,
        scale_a=_scale(scale, a.device),
        scale_b=_scale(1.0, a.device),
        out_dtype=out_dtype,
    )
    return out


@torch.library.custom_op("unit_scaling::cpu_fp8_gemm", mutates_args=())
def _cpu_gemm(a: Tensor, b: Tensor, scale: Tensor, out_dtype: torch.dtype) -> Tensor:
    """``_scaled_mm`` on the CPU, as an op of its own. On a CPU with AMX, torch
    (2.11 to 2.15) sends E4M3 x E4M3 to oneDNN, which takes ~250x longer than
    torch's own path (3.9 s against 16 ms for 1024x128x512) for the same result;
    compiled graphs take that path too. Here oneDNN is off for the call (eager
    or compiled). ``tests/test_float8.py`` checks which kernel runs;
    ``python -m benchmarks.float8 --onednn`` times both and says whether this
    still pays."""
    enabled = onednn_enabled()
    set_onednn_enabled(False)
    try:
        out: Tensor = scaled_mm(
            a, b, scale_a=scale, scale_b=_scale(1.0, a.device), out_dtype=out_dtype
        )
    finally:
        set_onednn_enabled(enabled)
    return out


@_cpu_gemm.register_fake
def _(a: Tensor, b: Tensor, scale: Tensor, out_dtype: torch.dtype) -> Tensor:
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


def batched_gemm(a: Tensor, b: Tensor, scale: float, out_dtype: torch.dtype) -> Tensor:
    """``scale * (a[i] @ b[i])`` for FP8 ``a`` (n, m, k) and ``b`` (n, k, p): one
    scaled GEMM per leading index (``_scaled_mm`` is two-dimensional), the inner
    and output sizes padded with zeros to multiples of 16."""
    size = b.shape[-1]
    out = [
        gemm(pad(a_i, 1), column_major(pad(pad(b_i, 0), 1)), scale, out_dtype)
        for a_i, b_i in zip(a.unbind(0), b.unbind(0), strict=True)
    ]
    return torch.stack(out)[..., :size]
