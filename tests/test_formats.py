"""Tests for unit_scaling.formats: properties, exact rounding, stochastic rounding."""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import Tensor

import unit_scaling.formats._fp as formats
from unit_scaling.formats import (
    FP8_E4M3,
    FP8_E5M2,
    FPFormat,
    format_to_tuple,
    tuple_to_format,
)

FLOAT8 = {FP8_E4M3: torch.float8_e4m3fn, FP8_E5M2: torch.float8_e5m2}
GENERIC = [
    FPFormat(2, 1, "nearest"),
    FPFormat(2, 0, "nearest"),
    FPFormat(3, 2, "nearest", finite=True),
    FPFormat(3, 4, "nearest"),
    FPFormat(4, 3, "nearest"),
    FPFormat(4, 0, "nearest"),
    FPFormat(5, 10, "nearest"),
    FPFormat(8, 7, "nearest"),
]


@pytest.fixture(autouse=True)
def eager() -> Iterator[None]:
    """Run quantisation with torch ops, eagerly, unless a test asks for
    ``compiled`` or ``native``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(formats._KERNELS, "min_numel", 1 << 62)
        patch.setattr(formats, "_native_nearest_args", lambda fmt, x: None)
        yield


@pytest.fixture
def native_kernel(eager: None) -> Iterator[None]:
    """The C++ round-to-nearest kernel for float32 CPU tensors (it must compile
    here: the test fails rather than passing on the fallback)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(formats, "_native_nearest_args", NATIVE_ARGS)
        assert formats._NATIVE_NEAREST.get() is not None, formats._NATIVE_NEAREST.error
        yield


NATIVE_ARGS = formats._native_nearest_args


@pytest.fixture
def compiled(eager: None) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(formats._KERNELS, "min_numel", 1 << 16)
        yield


# An independent reference: enumerate every value, pick the nearest in float64.


def representable(fmt: FPFormat) -> Tensor:
    """All non-negative finite values of ``fmt``, ascending; index = encoding."""
    e, m = fmt.exponent_bits, fmt.mantissa_bits
    bias = 2 ** (e - 1) - 1
    values = []
    for code in range(2 ** (e + m)):
        exponent, mantissa = divmod(code, 2**m)
        if exponent == 2**e - 1 and (not fmt.finite or mantissa == 2**m - 1):
            break  # infinities and NaN (IEEE-like), or the NaN pattern (finite)
        if exponent == 0:
            values.append(math.ldexp(mantissa, 1 - bias - m))
        else:
            values.append(math.ldexp(2**m + mantissa, exponent - bias - m))
    return torch.tensor(values, dtype=torch.float64)


def neighbours(fmt: FPFormat, x: Tensor) -> tuple[Tensor, Tensor]:
    """The representable values at or below, and at or above, each ``|x|``."""
    grid = representable(fmt)
    mag = x.double().abs().clamp(max=grid[-1])
    lo = grid[torch.searchsorted(grid, mag, right=True) - 1]
    hi = grid[torch.searchsorted(grid, mag).clamp(max=len(grid) - 1)]
    return lo, hi


def reference_nearest(fmt: FPFormat, x: Tensor) -> Tensor:
    """Round to nearest, ties to even encoding, saturating; in float64."""
    grid = representable(fmt)
    mag = x.double().abs().clamp(max=grid[-1])
    hi = torch.searchsorted(grid, mag).clamp(max=len(grid) - 1)
    lo = (hi - 1).clamp(min=0)
    midpoint = (grid[lo] + grid[hi]) / 2  # exact: few significant bits
    up = (mag > midpoint) | ((mag == midpoint) & (hi % 2 == 0))
    q = torch.where(up, grid[hi], grid[lo]).copysign(x.double())
    return torch.where(x.isnan(), x.double(), q)


def spread(n: int, low: float, high: float, seed: int = 0) -> Tensor:
    """Signed float64 values with log-uniform magnitudes in [2^low, 2^high)."""
    gen = torch.Generator().manual_seed(seed)
    exponent = torch.rand(n, generator=gen, dtype=torch.float64) * (high - low) + low
    sign = torch.randint(0, 2, (n,), generator=gen) * 2 - 1
    return sign * torch.exp2(exponent)


def edges(fmt: FPFormat) -> Tensor:
    """Every value, every midpoint, and their nearest float32 neighbours, in float64.

    Plus zeros, infinities, NaN, saturating values and the smallest subnormal's
    halves, each with both signs.
    """
    grid = representable(fmt)
    mids = (grid[1:] + grid[:-1]) / 2
    points = torch.cat([grid, mids, grid[-1:] * 1.5, grid[1:2] / 4]).float()
    inf = torch.tensor(math.inf)
    around = torch.cat([points, points.nextafter(inf), points.nextafter(-inf)])
    specials = torch.tensor([math.inf, math.nan, 0.0, 3.0e38])
    values = torch.cat([around, specials]).double()
    return torch.cat([values, -values])


def same_bits(a: Tensor, b: Tensor) -> bool:
    """Bitwise equality (so -0 differs from 0), NaNs matched by position."""
    assert a.dtype == b.dtype and a.shape == b.shape
    nan = a.isnan()
    if not torch.equal(nan, b.isnan()):
        return False
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a[~nan].view(ints), b[~nan].view(ints))


def native(fmt: FPFormat, x: Tensor) -> Tensor:
    """The torch cast round trip, with our saturation applied first."""
    mx = fmt.max_absolute_value
    return x.clamp(-mx, mx).to(FLOAT8[fmt]).to(x.dtype)


# OCP FP8: bit-exact with torch's float8 casts.


@pytest.mark.parametrize("fmt", FLOAT8, ids=str)
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str
)
def test_every_fp8_value_round_trips(fmt: FPFormat, dtype: torch.dtype) -> None:
    decoded = torch.arange(256, dtype=torch.uint8).view(FLOAT8[fmt]).to(dtype)
    expected = decoded.clamp(-fmt.max_absolute_value, fmt.max_absolute_value)
    assert same_bits(fmt.quantise(decoded), expected)
    # float64 takes the generic kernel, which must agree with the native cast
    assert same_bits(fmt.quantise(decoded.double()), expected.double())


@pytest.mark.parametrize("fmt", FLOAT8, ids=str)
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str
)
def test_nearest_equals_native_cast(fmt: FPFormat, dtype: torch.dtype) -> None:
    x = torch.cat([spread(20_000, -30, 20), edges(fmt)]).to(dtype)
    assert same_bits(fmt.quantise(x), native(fmt, x))
    # the generic kernel, in float64
    expected = native(fmt, x.float()).double()
    assert same_bits(fmt.quantise(x.double()), expected)


def test_native_casts_differ_only_out_of_range() -> None:
    x = torch.tensor([1e6, -1e6, math.inf, -math.inf])
    assert FP8_E4M3.quantise(x).tolist() == [448, -448, 448, -448]
    assert FP8_E5M2.quantise(x).tolist() == [57344, -57344, 57344, -57344]
    assert x.to(torch.float8_e5m2).float().isinf().all()


def test_ties_go_to_even() -> None:
    # 1.0625 lies halfway between 1 (mantissa 000) and 1.125 (001); 1.1875 between
    # 1.125 and 1.25 (010); 2^-10 halfway between 0 and the smallest subnormal.
    x = torch.tensor([1.0625, 1.1875, -1.0625, 2.0**-10, 3 * 2.0**-10, 464.0])
    expected = [1.0, 1.25, -1.0, 0.0, 2.0**-8, 448.0]
    assert FP8_E4M3.quantise(x).tolist() == expected
    assert FP8_E4M3.quantise(x.double()).tolist() == expected


# Generic formats against the enumerating reference.


@pytest.mark.parametrize("fmt", GENERIC, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_nearest_equals_reference(fmt: FPFormat, dtype: torch.dtype) -> None:
    top = math.log2(fmt.max_absolute_value) + 2
    bottom = math.log2(fmt.min_absolute_subnormal) - 3
    x = torch.cat([spread(20_000, bottom, top, seed=1), edges(fmt)]).to(dtype)
    expected = reference_nearest(fmt, x).to(dtype)
    assert same_bits(fmt.quantise(x), expected)


@pytest.mark.parametrize(
    ("fmt", "dtype", "cast"),
    [
        (FPFormat(5, 10, "nearest"), torch.float32, torch.float16),
        (FPFormat(8, 7, "nearest"), torch.float32, torch.bfloat16),
        (FPFormat(8, 23, "nearest"), torch.float64, torch.float32),
    ],
    ids=["E5M10=float16", "E8M7=bfloat16", "E8M23=float32"],
)
def test_nearest_equals_ieee_cast(
    fmt: FPFormat, dtype: torch.dtype, cast: torch.dtype
) -> None:
    top = math.log2(fmt.max_absolute_value)
    if fmt.bits <= 16:
        ties = edges(fmt)
    else:  # too many values to enumerate: midpoints of random neighbours instead
        points = spread(50_000, -149, top, seed=7).float()
        after = points.nextafter(torch.tensor(math.inf)).double()
        ties = torch.cat([points.double(), (points.double() + after) / 2])
    x = torch.cat([spread(50_000, -155, top, seed=2), ties]).to(dtype)
    x = x[x.abs() <= fmt.max_absolute_value]
    assert same_bits(fmt.quantise(x), x.to(cast).to(dtype))


def test_finite_encoding_uses_top_exponent() -> None:
    fmt = FPFormat(3, 2, "nearest", finite=True)
    assert representable(fmt)[-4:].tolist() == [14.0, 16.0, 20.0, 24.0]
    assert fmt.max_absolute_value == 24.0
    assert FPFormat(3, 2, "nearest").max_absolute_value == 14.0


@pytest.mark.parametrize("fmt", [FPFormat(4, 3, "stochastic"), FP8_E4M3], ids=str)
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str
)
def test_dtype_and_shape_are_kept(fmt: FPFormat, dtype: torch.dtype) -> None:
    for shape in [(), (0,), (1,), (3, 4, 5)]:
        x = torch.randn(shape, dtype=dtype)
        q = fmt.quantise(x)
        assert q.dtype == dtype and q.shape == x.shape
    x = torch.randn(8, 6, dtype=dtype).t()  # not contiguous
    q = fmt.quantise(x)
    assert q.shape == x.shape
    if fmt.rounding == "nearest":
        assert same_bits(q, fmt.quantise(x.contiguous()))


def test_quantise_rejects_integers() -> None:
    with pytest.raises(TypeError, match="floating-point"):
        FP8_E4M3.quantise(torch.arange(3))


def test_quantise_has_no_gradient() -> None:
    x = torch.randn(4, requires_grad=True)
    assert not FP8_E4M3.quantise(x).requires_grad


# Stochastic rounding.


def stochastic_points(fmt: FPFormat) -> list[tuple[float, float]]:
    """Pairs of neighbouring values: normal, subnormal, boundary, top, below all."""
    grid = representable(fmt).tolist()
    sub = fmt.min_absolute_subnormal
    pairs = [(1.0, grid[grid.index(1.0) + 1]), (grid[-2], grid[-1]), (0.0, sub)]
    if fmt.mantissa_bits:
        pairs += [
            (sub, 2 * sub),
            (fmt.min_absolute_normal - sub, fmt.min_absolute_normal),
        ]
    return pairs


@pytest.mark.parametrize(
    "fmt",
    [FPFormat(4, 3), FPFormat(5, 2), FPFormat(4, 3, finite=True), FPFormat(2, 0)],
    ids=str,
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_stochastic_rounding_is_unbiased(fmt: FPFormat, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    n = 50_000
    pairs = torch.tensor(stochastic_points(fmt), dtype=torch.float64)
    lo, hi = pairs.repeat_interleave(6, 0).unbind(1)
    fraction = torch.tensor([0.1, 0.5, 0.77]).repeat_interleave(2).repeat(len(pairs))
    sign = torch.tensor([1.0, -1.0]).repeat(3 * len(pairs))
    value = (sign * (lo + fraction * (hi - lo))).to(dtype)
    p = (value.double().abs() - lo) / (hi - lo)  # after rounding to dtype
    q = fmt.quantise(value[:, None].expand(-1, n)).double().abs()
    assert ((q == lo[:, None]) | (q == hi[:, None])).all()
    p_hat = (q == hi[:, None]).double().mean(1)
    bound = 5 * (p * (1 - p) / n).sqrt()
    assert ((p_hat - p).abs() <= bound).all(), (p_hat - p) / bound


def test_stochastic_rounding_lands_on_neighbours() -> None:
    fmt = FPFormat(4, 3)
    x = torch.cat([spread(50_000, -14, 10, seed=3), edges(fmt)]).float()
    q = fmt.quantise(x).double()
    lo, hi = neighbours(fmt, x)
    finite = ~x.isnan()
    assert ((q[finite].abs() == lo[finite]) | (q[finite].abs() == hi[finite])).all()
    assert torch.equal(q.signbit()[finite], x.signbit()[finite])
    assert q[x.isnan()].isnan().all()


def test_stochastic_rounding_keeps_representable_values_and_signs() -> None:
    fmt = FPFormat(5, 2, "stochastic")
    grid = representable(fmt).float()
    values = torch.cat([grid, -grid])
    assert same_bits(fmt.quantise(values), values)
    special = torch.tensor([math.inf, -math.inf, 1e9, -0.0, math.nan])
    assert same_bits(
        fmt.quantise(special),
        torch.tensor([57344.0, -57344.0, 57344.0, -0.0, math.nan]),
    )


@pytest.mark.parametrize(
    ("srbits", "fraction", "expected"),
    [
        (1, 0.25, 0.0),
        (1, 0.5, 0.5),
        (1, 0.9, 0.5),
        (2, 0.2, 0.0),
        (2, 0.3, 0.25),
        (2, 0.75, 0.75),
        (3, 0.99, 0.875),
    ],
)
def test_srbits_truncate_the_rounding_probability(
    srbits: int, fraction: float, expected: float
) -> None:
    torch.manual_seed(0)
    fmt = FPFormat(4, 3, "stochastic", srbits)
    n = 50_000
    sub = fmt.min_absolute_subnormal
    lo, hi = torch.tensor([(1.0, 1.125), (sub, 2 * sub), (0.0, sub)]).unbind(1)
    value = lo + fraction * (hi - lo)
    q = fmt.quantise(value[:, None].expand(-1, n))
    p_hat = (q == hi[:, None]).double().mean(1)
    bound = 5 * math.sqrt(expected * (1 - expected) / n)
    assert ((p_hat - expected).abs() <= bound).all(), p_hat


def test_stochastic_rounding_follows_the_seed() -> None:
    fmt = FPFormat(4, 3)
    x = torch.randn(1000)
    torch.manual_seed(1)
    a = fmt.quantise(x)
    torch.manual_seed(1)
    b = fmt.quantise(x)
    c = fmt.quantise(x)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_stochastic_bfloat16_input() -> None:
    torch.manual_seed(0)
    q = FPFormat(4, 3).quantise(torch.full((20_000,), 1.0625, dtype=torch.bfloat16))
    assert q.dtype == torch.bfloat16
    assert set(q.unique().tolist()) == {1.0, 1.125}
    assert abs(q.double().mean().item() - 1.0625) < 0.001


# Properties, names, tuples, errors.


@pytest.mark.parametrize(
    ("fmt", "bits", "max_value", "min_normal", "min_subnormal"),
    [
        (FPFormat(4, 3), 8, 240.0, 2.0**-6, 2.0**-9),
        (FP8_E4M3, 8, 448.0, 2.0**-6, 2.0**-9),
        (FP8_E5M2, 8, 57344.0, 2.0**-14, 2.0**-16),
        (FPFormat(2, 1), 4, 3.0, 1.0, 0.5),
        (FPFormat(5, 10), 16, 65504.0, 2.0**-14, 2.0**-24),
        (FPFormat(8, 7), 16, torch.finfo(torch.bfloat16).max, 2.0**-126, 2.0**-133),
        (FPFormat(8, 23), 32, torch.finfo(torch.float32).max, 2.0**-126, 2.0**-149),
    ],
    ids=str,
)
def test_properties(
    fmt: FPFormat, bits: int, max_value: float, min_normal: float, min_subnormal: float
) -> None:
    assert fmt.bits == bits
    assert fmt.max_absolute_value == max_value
    assert fmt.min_absolute_normal == min_normal
    assert fmt.min_absolute_subnormal == min_subnormal
    if fmt.bits <= 16:
        grid = representable(fmt)
        assert (grid[1].item(), grid[-1].item()) == (min_subnormal, max_value)


def test_ocp_formats_match_torch_finfo() -> None:
    for fmt, dtype in FLOAT8.items():
        info = torch.finfo(dtype)
        assert fmt.max_absolute_value == info.max
        assert fmt.min_absolute_normal == info.tiny
        assert fmt.min_absolute_subnormal == info.smallest_normal * info.eps


@pytest.mark.parametrize(
    ("fmt", "name"),
    [
        (FPFormat(4, 3), "E4M3-SR"),
        (FPFormat(4, 3, "nearest"), "E4M3-RN"),
        (FP8_E4M3, "E4M3FN-RN"),
        (FP8_E5M2, "E5M2-RN"),
        (FPFormat(5, 2, srbits=7), "E5M2-SR7"),
    ],
)
def test_str(fmt: FPFormat, name: str) -> None:
    assert str(fmt) == name


@pytest.mark.parametrize(
    "fmt", [FPFormat(4, 3), FP8_E4M3, FP8_E5M2, FPFormat(3, 4, srbits=5)], ids=str
)
def test_tuple_round_trip(fmt: FPFormat) -> None:
    assert tuple_to_format(format_to_tuple(fmt)) == fmt
    assert tuple_to_format(list(format_to_tuple(fmt))) == fmt


def test_tuple_prefix_and_bad_length() -> None:
    assert tuple_to_format((4, 3)) == FPFormat(4, 3)
    assert format_to_tuple(FPFormat(4, 3)) == (4, 3, "stochastic", 0, False)
    with pytest.raises(ValueError, match="format tuple"):
        tuple_to_format((4,))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"exponent_bits": 1, "mantissa_bits": 3}, ValueError, "exponent_bits"),
        ({"exponent_bits": 9, "mantissa_bits": 3}, ValueError, "exponent_bits"),
        ({"exponent_bits": 4, "mantissa_bits": -1}, ValueError, "mantissa_bits"),
        ({"exponent_bits": 4, "mantissa_bits": 24}, ValueError, "mantissa_bits"),
        ({"exponent_bits": 4.0, "mantissa_bits": 3}, TypeError, "exponent_bits"),
        ({"exponent_bits": 4, "mantissa_bits": True}, TypeError, "mantissa_bits"),
        (
            {"exponent_bits": 4, "mantissa_bits": 3, "rounding": "up"},
            ValueError,
            "rounding",
        ),
        ({"exponent_bits": 4, "mantissa_bits": 3, "srbits": -1}, ValueError, "srbits"),
        ({"exponent_bits": 4, "mantissa_bits": 3, "srbits": 2.0}, TypeError, "srbits"),
        (
            {
                "exponent_bits": 4,
                "mantissa_bits": 3,
                "rounding": "nearest",
                "srbits": 4,
            },
            ValueError,
            "srbits",
        ),
        (
            {"exponent_bits": 4, "mantissa_bits": 0, "finite": True},
            ValueError,
            "finite",
        ),
        (
            {"exponent_bits": 8, "mantissa_bits": 3, "finite": True},
            ValueError,
            "finite",
        ),
        ({"exponent_bits": 4, "mantissa_bits": 3, "finite": 1}, TypeError, "finite"),
    ],
)
def test_errors(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        FPFormat(**kwargs)


# Gradients.


def test_quantise_fwd_passes_the_gradient_through() -> None:
    x = torch.tensor([0.3, -1000.0, 5e-4], requires_grad=True)
    y = FP8_E4M3.quantise_fwd(x)
    assert torch.equal(y, FP8_E4M3.quantise(x))
    grad = torch.tensor([0.3, 0.7, -1e-5])
    y.backward(grad)
    assert x.grad is not None and torch.equal(x.grad, grad)


@pytest.mark.parametrize("fmt", [FP8_E5M2, FPFormat(3, 2, "nearest")], ids=str)
def test_quantise_bwd_quantises_the_gradient(fmt: FPFormat) -> None:
    x = torch.tensor([0.3, -1000.0, 5e-4], requires_grad=True)
    y = fmt.quantise_bwd(x)
    assert torch.equal(y, x)
    grad = torch.tensor([0.3, 1e9, -1e-5])
    y.backward(grad)
    assert x.grad is not None and torch.equal(x.grad, fmt.quantise(grad))


# The compiled kernels.


def test_compiled_kernels_equal_eager(compiled: None) -> None:
    n = 1 << 16
    x = torch.cat([spread(n, -30, 20, seed=4), edges(FPFormat(4, 3))]).float()
    cases = [
        (FP8_E4M3, torch.float32),
        (FP8_E4M3, torch.bfloat16),
        (FP8_E5M2, torch.float32),
        (FPFormat(3, 4, "nearest"), torch.float32),
        (FPFormat(5, 10, "nearest"), torch.float32),
        (FPFormat(4, 3, "stochastic"), torch.float32),
        (FPFormat(5, 2, "stochastic", 5), torch.float32),
    ]
    for fmt, dtype in cases:
        xd = x.to(dtype)
        torch.manual_seed(0)
        fast = fmt.quantise(xd)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(formats._KERNELS, "min_numel", 1 << 62)
            torch.manual_seed(0)
            slow = fmt.quantise(xd)
        assert same_bits(fast, slow), fmt
        if fmt.rounding == "nearest":
            assert same_bits(fast, reference_nearest(fmt, xd).to(dtype)), fmt
    assert formats._KERNELS.error is None


# The C++ round-to-nearest kernel.


@pytest.mark.parametrize("fmt", [FP8_E4M3, FP8_E5M2, *GENERIC], ids=str)
def test_native_kernel_equals_reference(native_kernel: None, fmt: FPFormat) -> None:
    served = fmt.mantissa_bits >= 1 and fmt.exponent_bits <= 7
    top = math.log2(fmt.max_absolute_value) + 2
    bottom = math.log2(fmt.min_absolute_subnormal) - 3
    x = torch.cat([spread(20_000, bottom, top, seed=8), edges(fmt)]).float()
    assert (NATIVE_ARGS(fmt, x) is not None) == served
    expected = reference_nearest(fmt, x).float()
    # the vectorised body, its tail (sizes not a multiple of the vector width),
    # and two threads (one per 2^16 elements)
    for n in (x.numel(), 7, 21):
        assert same_bits(fmt.quantise(x[:n]), expected[:n]), n
    big = x.repeat(7)
    assert big.numel() >= 2 * formats._NUMEL_PER_THREAD
    assert same_bits(fmt.quantise(big), expected.repeat(7))


def test_native_kernel_takes_only_what_it_serves(native_kernel: None) -> None:
    x = torch.randn(64)
    assert NATIVE_ARGS(FP8_E4M3, x) is not None
    assert NATIVE_ARGS(FP8_E4M3, x.double()) is None
    assert NATIVE_ARGS(FP8_E4M3, x.bfloat16()) is None
    assert NATIVE_ARGS(FP8_E4M3, x[::2]) is None  # not contiguous
    assert NATIVE_ARGS(FPFormat(4, 3, "stochastic"), x) is None
    assert NATIVE_ARGS(FPFormat(4, 0, "nearest"), x) is None
    assert NATIVE_ARGS(FPFormat(8, 7, "nearest"), x) is None
    # strided input goes through a contiguous copy, the result keeps the shape
    m = spread(600, -12, 10, seed=9).float().reshape(20, 30).t()
    assert same_bits(FP8_E4M3.quantise(m), native(FP8_E4M3, m))


def test_traced_by_torch_compile(native_kernel: None) -> None:
    # fullgraph: the native kernel's checks must not break the graph
    sr, rn = FPFormat(4, 3, srbits=3), FPFormat(3, 2, "nearest")

    def f(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        y = FP8_E5M2.quantise_bwd(FP8_E4M3.quantise_fwd(x))
        return y, rn.quantise(x), sr.quantise(x)

    x = spread(1000, -10, 10, seed=5).float().requires_grad_()
    y, nearest, stochastic = torch.compile(f, fullgraph=True)(x)
    assert same_bits(y, FP8_E4M3.quantise(x))
    assert same_bits(nearest, rn.quantise(x))
    lo, hi = neighbours(sr, x.detach())
    assert ((stochastic.abs() == lo) | (stochastic.abs() == hi)).all()
    grad = spread(1000, -20, 20, seed=6).float()
    y.backward(grad)
    assert x.grad is not None and same_bits(x.grad, FP8_E5M2.quantise(grad))


def test_compile_failure_falls_back_to_eager(
    compiled: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(kernel: Any) -> Any:
        def run(*args: Any) -> Tensor:
            raise RuntimeError("no compiler")

        return run

    monkeypatch.setattr(formats._KERNELS, "compiled", broken)
    monkeypatch.setattr(formats._KERNELS, "error", None)
    x = torch.randn(1 << 16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        q = FPFormat(4, 3, "nearest").quantise(x)
    assert any("no compiler" in str(w.message) for w in caught)
    assert same_bits(q, reference_nearest(FPFormat(4, 3, "nearest"), x).float())
    assert formats._KERNELS.error is not None
