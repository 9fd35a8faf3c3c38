"""Tests for ``unit_scaling._kernels``: compiled kernels and native C++ kernels."""

from __future__ import annotations

import shutil

import pytest
import torch

from unit_scaling._kernels import NativeKernel

_SCALE = r"""
#include <torch/csrc/inductor/cpp_prefix.h>
extern "C" void kernel(const float* x, float* out, int64_t n, int64_t factor) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * factor;
}
"""
_HAS_COMPILER = any(shutil.which(cc) for cc in ("g++", "c++", "clang++"))


@pytest.mark.skipif(not _HAS_COMPILER, reason="no C++ compiler")
def test_native_kernel_compiles_and_runs() -> None:
    """Fails loudly if a torch upgrade changes the Inductor C++ code cache API
    that NativeKernel relies on (track_scales would fall back, slower)."""
    kernel = NativeKernel(
        "test", _SCALE, ["const float*", "float*", "int64_t", "int64_t"]
    )
    run = kernel.get()
    assert run is not None, kernel.error
    x, out = torch.arange(5.0), torch.empty(5)
    run(x, out, 5, 3)
    assert torch.equal(out, 3 * x)
    assert kernel.get() is run  # compiled once


def test_native_kernel_failure_warns_once_and_gives_none() -> None:
    kernel = NativeKernel("test", "this is not C++", ["int64_t"])
    with pytest.warns(RuntimeWarning, match="could not compile its C\\+\\+ kernel"):
        assert kernel.get() is None
    assert kernel.error is not None
    assert kernel.get() is None  # no second attempt, no second warning
