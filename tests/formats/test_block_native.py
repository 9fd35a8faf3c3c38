"""The C++ block-quantisation kernel gives the eager path's values bit for bit:
on the fixtures' random and adversarial blocks, at the scale rules' edges, for
every element format it serves, round to nearest and stochastic, along any
axis, with partial blocks, in float32, bfloat16 and float16."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch
from torch import Tensor

from unit_scaling.formats import (
    MXFP4,
    MXFP6_E2M3,
    MXFP6_E3M2,
    MXFP8_E4M3,
    MXFP8_E5M2,
    MXINT8,
    NVFP4,
    BlockFormat,
    _block,
)
from unit_scaling.formats._block_native import _KERNEL, native_quantise

from .make_fixtures import RULES
from .test_block_formats import EDGE_AMAXES

MX = [MXFP8_E4M3, MXFP8_E5M2, MXFP6_E3M2, MXFP6_E2M3, MXFP4]
FORMATS = [
    dataclasses.replace(fmt, scale_rule=rule)  # type: ignore[arg-type]
    for fmt in MX
    for rule in RULES
] + [NVFP4]


def eager(fmt: BlockFormat, x: Tensor, axis: int = -1, **kwargs: Any) -> Tensor:
    """``fmt.quantise`` by the eager path."""
    original = _block._quantise_native
    _block._quantise_native = lambda *args: None  # type: ignore[assignment]
    try:
        return fmt.quantise(x, axis, **kwargs)
    finally:
        _block._quantise_native = original


def native(fmt: BlockFormat, x: Tensor, axis: int = -1, **kwargs: Any) -> Tensor:
    out = _block._quantise_native(fmt, x, axis, kwargs.get("tensor_amax"))
    assert out is not None, f"the kernel does not serve {fmt} on {x.dtype}"
    return out


def same(a: Tensor, b: Tensor) -> bool:
    """Equal bit for bit (NaN included, the sign of zero too)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    bits = torch.int16 if a.element_size() == 2 else torch.int32
    if torch.equal(a.contiguous().view(bits), b.contiguous().view(bits)):
        return True
    # NaNs of different payloads are the same NaN.
    return bool(
        torch.equal(a.isnan(), b.isnan())
        and torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))
        and torch.equal(a.signbit() | a.isnan(), b.signbit() | b.isnan())
    )


@pytest.fixture(scope="module", autouse=True)
def kernel_builds() -> None:
    assert _KERNEL.get() is not None, _KERNEL.error


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_fixture_blocks(fixtures: dict[str, Any], fmt: BlockFormat, dtype: str) -> None:
    x = fixtures[f"mx/{dtype}/input"]
    assert same(native(fmt, x), eager(fmt, x))


def _adversarial() -> Tensor:
    blocks = torch.zeros(len(EDGE_AMAXES), 32)
    blocks[:, 5] = torch.tensor(EDGE_AMAXES)
    blocks[:, 6] = -blocks[:, 5] / 3
    blocks[:, 7] = blocks[:, 5] * 0.26
    blocks[1::3, 9] = -0.0
    return blocks


@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_scale_rule_edges(fmt: BlockFormat) -> None:
    x = _adversarial()
    finite = x.isfinite().all(-1)
    if fmt.scale == "e4m3":  # one NaN or Inf sets the whole tensor's scale
        x = x[finite]
    assert same(native(fmt, x), eager(fmt, x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fmt", [MXFP8_E4M3, MXFP4, NVFP4], ids=str)
def test_axes_partial_blocks_and_dtypes(fmt: BlockFormat, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(3, 45, 7, generator=g) * torch.logspace(-6, 6, 7)).to(dtype)
    for axis in (0, 1, 2, -1):
        assert same(native(fmt, x, axis), eager(fmt, x, axis)), axis
    if fmt.scale == "e4m3":
        for amax in (1.0, 448.0, 1e-30):
            assert same(
                native(fmt, x, 1, tensor_amax=amax), eager(fmt, x, 1, tensor_amax=amax)
            )


@pytest.mark.parametrize("fmt", [MXFP4, MXFP6_E3M2, MXFP8_E5M2, NVFP4], ids=str)
def test_stochastic_rounding_draws_the_same_bits(fmt: BlockFormat) -> None:
    stochastic = fmt.with_rounding("stochastic")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(37, 70, generator=g) * 2.0 ** torch.randint(-20, 20, (37, 1))
    x[0, :5] = torch.tensor([1e-30, -1e-38, 0.0, -0.0, math.ldexp(1, -140)])
    torch.manual_seed(7)
    a = native(stochastic, x, 0)
    torch.manual_seed(7)
    b = eager(stochastic, x, 0)
    assert same(a, b)
    torch.manual_seed(8)
    assert not torch.equal(native(stochastic, x, 0), a)  # a fresh seed per call


def test_serves_only_what_it_matches() -> None:
    x = torch.randn(4, 32)
    assert native_quantise(MXINT8, x, 1, None, None) is None
    two_d = dataclasses.replace(NVFP4, block_dims=2)
    assert _block._quantise_native(two_d, x, -1, None) is None
    # float64 is rounded to float32 first, by the eager path.
    assert MXFP4.quantise(x.double()).dtype == torch.float64
    # The eager path still raises what it raises.
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        MXFP4.quantise(x, axis=2)


def test_stochastic_counters_wrap_as_the_eager_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seed plus position past 2^32 wraps in both paths (uint32 words)."""
    real = torch.randint

    def seed_near_the_top(*args: Any, **kwargs: Any) -> Tensor:
        if args[:2] == (0, 1 << 32) and args[2] == ():
            return torch.tensor((1 << 32) - 37, dtype=torch.int64)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "randint", seed_near_the_top)
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(3))
    for fmt in (MXFP4.with_rounding("stochastic"), NVFP4.with_rounding("stochastic")):
        for axis in (0, 1):
            assert same(native(fmt, x, axis), eager(fmt, x, axis)), (fmt, axis)
