"""Block formats (MX, NVFP4) and their elements: exact against references.

Elements: every bfloat16 and float16 bit pattern against an enumerating
reference, torch's float8 casts and torchao's FP6/FP4 casts (a digest in the
fixtures). Blocks: byte for byte against torchao's ``to_mx`` and
``nvfp4_quantize`` (the fixtures), every difference one the module documents;
the scale rules at their edges; MXINT8, 2-D blocks and stochastic rounding by
their properties.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch
from torch import Tensor

from unit_scaling.formats import (
    FP4_E2M1,
    FP6_E2M3,
    FP6_E3M2,
    FP8_E4M3,
    FP8_E5M2,
    INT8,
    MXFP4,
    MXFP6_E2M3,
    MXFP6_E3M2,
    MXFP8_E4M3,
    MXFP8_E5M2,
    MXINT8,
    NVFP4,
    BlockFormat,
    FPFormat,
    IntFormat,
)
from unit_scaling.formats._codes import element_codes, element_table

from .make_fixtures import CAST_ELEMENTS, MX_ELEMENTS, RULES, digest, every_pattern

ELEMENTS: dict[str, FPFormat | IntFormat] = {
    "e4m3": FP8_E4M3,
    "e5m2": FP8_E5M2,
    "e3m2": FP6_E3M2,
    "e2m3": FP6_E2M3,
    "e2m1": FP4_E2M1,
    "int8": INT8,
}
MX = {
    "e4m3": MXFP8_E4M3,
    "e5m2": MXFP8_E5M2,
    "e3m2": MXFP6_E3M2,
    "e2m3": MXFP6_E2M3,
    "e2m1": MXFP4,
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


# An independent reference: the format's values listed from its definition,
# rounding by distance in float64, ties to the even code.


def grid(element: FPFormat | IntFormat) -> tuple[Tensor, Tensor]:
    """Non-negative values of ``element`` ascending, and each one's code."""
    if isinstance(element, IntFormat):
        k = torch.arange(0, 2 ** (element.bits - 1))
        return k.double() * 2.0 ** (2 - element.bits), k
    e, m = element.exponent_bits, element.mantissa_bits
    bias = 2 ** (e - 1) - 1
    values, codes = [], []
    for code in range(2 ** (e + m)):
        exponent, mantissa = code >> m, code % 2**m
        if exponent == 2**e - 1 and not element.finite:
            continue  # infinities and NaN
        if exponent == 2**e - 1 and element.nan and mantissa == 2**m - 1:
            continue  # the FN NaN pattern
        significand = mantissa if exponent == 0 else 2**m + mantissa
        values.append(significand * 2.0 ** (max(exponent, 1) - bias - m))
        codes.append(code)
    return torch.tensor(values, dtype=torch.float64), torch.tensor(codes)


def reference_round(element: FPFormat | IntFormat, x: Tensor) -> Tensor:
    values, codes = grid(element)
    mag = x.double().abs().clamp(max=values[-1])
    distance = (mag[:, None] - values[None, :]).abs()
    best = distance.min(dim=1, keepdim=True).values
    candidates = distance == best
    # Of two equally near values, the one with the even code.
    even = candidates & (codes[None, :] % 2 == 0)
    pick = torch.where(even.any(1), even.int().argmax(1), candidates.int().argmax(1))
    q = values[pick].copysign(x.double())
    if isinstance(element, IntFormat):
        q = q + 0.0
    return torch.where(x.isnan(), x.double(), q)


def same(a: Tensor, b: Tensor) -> bool:
    """Bitwise equality (so -0 differs from 0), NaNs matched by position."""
    nan = a.isnan()
    ints = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return torch.equal(nan, b.isnan()) and torch.equal(
        a[~nan].view(ints), b[~nan].view(ints)
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", list(ELEMENTS))
def test_every_16_bit_pattern_rounds_as_the_reference(
    name: str, dtype: torch.dtype
) -> None:
    element = ELEMENTS[name]
    x = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
    x = x.view(dtype)
    q = element.quantise(x)
    expected = torch.cat(
        [reference_round(element, chunk) for chunk in x.float().split(8192)]
    )
    assert same(q, expected.to(dtype))
    # codes and values agree both ways
    finite = ~x.isnan()
    codes = element_codes(element, q[finite].float())
    assert same(element_table(element)[codes.long()], q[finite].float())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", ["e4m3", "e5m2"])
def test_fp8_codes_are_torchs_casts(name: str, dtype: torch.dtype) -> None:
    element = ELEMENTS[name]
    x = every_pattern(dtype)
    limit = element.max_absolute_value
    native = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[name]
    expected = x.clamp(-limit, limit).to(native).view(torch.uint8)
    assert torch.equal(element_codes(element, element.quantise(x)), expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", CAST_ELEMENTS)
def test_fp6_fp4_codes_are_torchaos_casts(
    fixtures: dict[str, Any], name: str, dtype: torch.dtype
) -> None:
    element = ELEMENTS[name]
    x = every_pattern(dtype)
    codes = element_codes(element, element.quantise(x))
    assert digest(codes) == fixtures[f"cast/{dtype}/{name}"]


# The scale rules at their edges, against float64 arithmetic.


def expected_e8m0(fmt: BlockFormat, amax: float) -> int:
    if math.isnan(amax) or (math.isinf(amax) and fmt.scale_rule != "rceil"):
        return 255
    if math.isinf(amax):
        return 254
    if amax == 0:
        return 0
    top = fmt.element.max_absolute_value
    emax = math.floor(math.log2(top))
    fraction, exponent = math.frexp(amax)  # exact, subnormals included
    if fmt.scale_rule == "rceil":
        descale = float(torch.tensor(amax) / torch.tensor(top))  # float32 division
        if descale == 0:
            return 0
        fraction, exponent = math.frexp(descale)
        return min(max(exponent - (fraction == 0.5) + 127, 0), 254)
    if fmt.scale_rule == "even":
        bits = 1 + (
            fmt.element.mantissa_bits if isinstance(fmt.element, FPFormat) else 6
        )
        rounded = math.floor(fraction * 2**bits + 0.5) / 2**bits
        fraction, exponent = math.frexp(math.ldexp(rounded, exponent))
    log2 = exponent - 1 + (fmt.scale_rule == "ceil" and fraction > 0.5)
    return min(max(log2 - emax + 127, 0), 254)


EDGE_AMAXES = [
    amax
    for k in (-140, -130, -127, -126, -100, -1, 0, 1, 5, 60, 120, 127)
    for amax in (
        2.0**k,
        float(torch.tensor(2.0**k).nextafter(torch.tensor(0.0))),
        1.75 * 2.0**k,
        1.96875 * 2.0**k,
    )
    if amax > 0
] + [0.0, 2.0**-149, math.inf, math.nan, 448.0 * 2**100, 6.0 * 2**-130]


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("fmt", [*MX.values(), MXINT8], ids=str)
def test_scale_rules_at_their_edges(fmt: BlockFormat, rule: str) -> None:
    fmt = dataclasses.replace(fmt, scale_rule=rule)  # type: ignore[arg-type]
    blocks = torch.zeros(len(EDGE_AMAXES), 32)
    blocks[:, 5] = torch.tensor(EDGE_AMAXES)
    blocks[:, 6] = -blocks[:, 5] / 3
    codes = fmt.encode(blocks).scales[:, 0].tolist()
    assert codes == [expected_e8m0(fmt, a) for a in EDGE_AMAXES]
    # ceil and rceil never saturate the largest value (within E8M0's range)
    values = fmt.quantise(blocks)[:, 5]
    inside = (blocks[:, 5] > 2.0**-100) & (blocks[:, 5] < 2.0**120)
    if rule in ("ceil", "rceil"):
        assert (values[inside] >= blocks[inside, 5] * (1 - 2**-3)).all()


# Byte for byte against torchao (the fixtures).


def explained_mx_differences(
    fmt: BlockFormat, x: Tensor, torchao_scales: Tensor
) -> Tensor:
    """Blocks where this module departs from torchao on purpose (``_block``'s
    notes 2-4): a NaN scale here (infinities), scale 2^-127 on a non-zero block
    (floor rules), or torchao's float32 ``log2`` rounding down (rceil)."""
    blocks = x.float().reshape(-1, 32)
    amax = blocks.abs().amax(-1)
    ours = fmt.encode(x).scales.reshape(-1)
    if fmt.scale_rule == "rceil":
        descale = amax / fmt.element.max_absolute_value
        log2_rounds_down = torch.ceil(torch.log2(descale)) + 127 < ours
        return log2_rounds_down & (torchao_scales + 1 == ours)
    return (amax.isinf() & (ours == 255)) | ((ours == 0) & (amax > 0))


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("element", MX_ELEMENTS)
def test_mx_equals_torchao_byte_for_byte(
    fixtures: dict[str, Any], element: str, rule: str, dtype: str
) -> None:
    fmt = dataclasses.replace(MX[element], scale_rule=rule)  # type: ignore[arg-type]
    x = fixtures[f"mx/{dtype}/input"]
    scales = fixtures[f"mx/{dtype}/{element}/{rule}/scales"].reshape(-1)
    codes = fixtures[f"mx/{dtype}/{element}/{rule}/elements"].reshape(-1, 32)
    enc = fmt.encode(x)
    explained = explained_mx_differences(fmt, x, scales)
    same_scale = enc.scales.reshape(-1) == scales
    assert (same_scale | explained).all()
    nan_block = enc.scales.reshape(-1) == 255  # elements do not matter
    same_codes = (enc.elements.reshape(-1, 32) == codes).all(-1)
    assert (same_codes | explained | nan_block).all()


def test_mx_differences_from_torchao_are_seen(fixtures: dict[str, Any]) -> None:
    x = fixtures["mx/float32/input"]
    for rule in RULES:
        fmt = dataclasses.replace(MXFP8_E4M3, scale_rule=rule)  # type: ignore[arg-type]
        scales = fixtures[f"mx/float32/e4m3/{rule}/scales"].reshape(-1)
        assert explained_mx_differences(fmt, x, scales).any(), rule


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_nvfp4_equals_torchao_but_for_its_order(
    fixtures: dict[str, Any], dtype: str
) -> None:
    """Scales equal unless below 2^-6 (torchao's clamp); elements equal where
    scales are, unless torchao's order of operations rounds the scaled value to
    another E2M1 value (``_block``'s notes 1 and 6); an all-zero tensor has NaN
    scales in torchao (0 / 0), zero here."""
    index = 0
    while f"nvfp4/{dtype}/{index}/input" in fixtures:
        x = fixtures[f"nvfp4/{dtype}/{index}/input"]
        scales = fixtures[f"nvfp4/{dtype}/{index}/scales"]
        codes = fixtures[f"nvfp4/{dtype}/{index}/elements"]
        enc = NVFP4.encode(x)
        ours = enc.scales.view(torch.float8_e4m3fn).float()
        # torchao's order: block scale (amax_b / 6) / (amax / 2688), clamped to
        # [2^-6, 448]; elements x * ((1 / per_tensor) / block scale)
        per_tensor = x.abs().amax().float() / (448.0 * 6.0)
        amax = x.float().reshape(*scales.shape, 16).abs().amax(-1)
        theirs = ((amax / 6.0) / per_tensor).clamp(2**-6, 448.0)
        theirs = theirs.to(torch.float8_e4m3fn)
        assert torch.equal(theirs.view(torch.uint8), scales)
        theirs = theirs.float()
        inverse = (1.0 / per_tensor) / theirs
        scaled = x.float().reshape(*scales.shape, 16) * inverse.unsqueeze(-1)
        their_codes = element_codes(FP4_E2M1, FP4_E2M1.quantise(scaled))
        finite = theirs.isfinite().repeat_interleave(16, -1)
        assert torch.equal(their_codes.reshape(codes.shape)[finite], codes[finite])
        # Ours differ only below 2^-6 or by the last bit of the order's rounding.
        clamped = ours < 2**-6
        step = (enc.scales.int() - scales.int()).abs()
        assert ((step == 0) | clamped | (step == 1)).all()
        assert ((step == 1) & ~clamped).float().mean() < 0.02
        differ = (enc.elements != codes).reshape(*scales.shape, 16)
        assert (differ & (step == 0).unsqueeze(-1)).float().mean() < 0.01
        index += 1
    assert index > 1


# Properties: MXINT8, padding, axes, 2-D blocks, stochastic rounding.


def test_mxint8_is_k_over_64_times_a_floor_scale() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 32, generator=gen) * torch.exp2(
        torch.randn(64, 1, generator=gen) * 20
    )
    enc = MXINT8.encode(x)
    scale = torch.exp2(enc.scales.float() - 127)
    amax = x.abs().amax(-1, keepdim=True)
    assert torch.equal(scale, torch.exp2(torch.floor(torch.log2(amax))))
    k = enc.elements.view(torch.int8).float()
    assert k.abs().max() <= 127
    q = MXINT8.quantise(x)
    assert torch.equal(q, k * scale / 64)
    # half a step, or what saturation at 127/64 of the scale clips
    clipped = x.abs() - 127 / 64 * scale
    assert ((q - x).abs() <= torch.maximum(scale / 128, clipped)).all()
    assert torch.equal(enc.decode(), q)


@pytest.mark.parametrize(
    "fmt", [MXFP8_E4M3, MXFP4, MXINT8, NVFP4, dataclasses.replace(NVFP4, block_dims=2)]
)
def test_decode_of_encode_is_quantise(fmt: BlockFormat) -> None:
    x = torch.randn(3, 40, 37, dtype=torch.bfloat16)
    enc = fmt.encode(x, axis=1 if fmt.block_dims == 1 else -1)
    q = fmt.quantise(x, axis=1 if fmt.block_dims == 1 else -1)
    assert same(enc.decode(torch.bfloat16), q)
    assert enc.elements.shape == x.shape


def test_padding_is_zeros_and_dropped() -> None:
    x = torch.randn(5, 40)
    padded = torch.cat([x, torch.zeros(5, 24)], dim=1)
    assert torch.equal(MXFP4.quantise(x), MXFP4.quantise(padded)[:, :40])
    assert MXFP4.encode(x).scales.shape == (5, 2)
    assert NVFP4.encode(x, axis=0).scales.shape == (1, 40)


def test_axis_is_the_contraction_axis() -> None:
    x = torch.randn(64, 48)
    assert torch.equal(MXFP6_E3M2.quantise(x, axis=0), MXFP6_E3M2.quantise(x.T).T)
    assert torch.equal(NVFP4.quantise(x, axis=-2), NVFP4.quantise(x.T).T)


@pytest.mark.parametrize("fmt", [NVFP4, MXFP8_E5M2], ids=str)
def test_2d_blocks_quantise_w_and_its_transpose_alike(fmt: BlockFormat) -> None:
    fmt = dataclasses.replace(fmt, block_dims=2, block_size=16)
    w = torch.randn(4, 50, 36) * torch.exp2(torch.randint(-8, 8, (4, 50, 1)))
    assert torch.equal(fmt.quantise(w), fmt.quantise(w.mT).mT)
    assert torch.equal(fmt.quantise(w, axis=-2), fmt.quantise(w))
    enc = fmt.encode(w)
    assert enc.scales.shape == (4, 4, 3)
    assert torch.equal(enc.scales.mT, fmt.encode(w.mT).scales)


def test_nvfp4_static_tensor_scale() -> None:
    x = torch.randn(8, 32)
    amax = x.abs().amax()
    assert torch.equal(NVFP4.quantise(x, tensor_amax=amax), NVFP4.quantise(x))
    assert torch.equal(NVFP4.quantise(x, tensor_amax=float(amax)), NVFP4.quantise(x))
    assert not torch.equal(NVFP4.quantise(x, tensor_amax=100.0), NVFP4.quantise(x))


@pytest.mark.parametrize("fmt", [MXFP4, MXINT8, NVFP4], ids=str)
def test_stochastic_rounding_is_unbiased_and_lands_on_neighbours(
    fmt: BlockFormat,
) -> None:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    block = torch.randn(1, 16, generator=gen)
    block[0, 0] = 4.0  # fixes the scales
    draws = 4000
    x = block.expand(draws, 16).contiguous()
    stochastic = fmt.with_rounding("stochastic")
    q = stochastic.quantise(x, tensor_amax=4.0 if fmt.scale == "e4m3" else None)
    down = fmt.quantise(block, tensor_amax=4.0 if fmt.scale == "e4m3" else None)
    # The neighbours: nearest rounding of the values just below and above.
    nearest = fmt.quantise(
        torch.cat([block, q]), tensor_amax=4.0 if fmt.scale == "e4m3" else None
    )
    assert torch.equal(nearest[1:], q)  # every draw is on the grid
    low = torch.minimum(q.min(0).values, down[0])
    high = torch.maximum(q.max(0).values, down[0])
    assert ((q == low) | (q == high)).all()  # one of two neighbours
    between = high > low
    p_up = torch.where(between, (block[0] - low) / (high - low), 0.0)
    observed = torch.where(between, (q == high).float().mean(0), 0.0)
    bound = 5 * torch.sqrt(p_up * (1 - p_up) / draws) + 1e-6
    assert ((observed - p_up).abs() <= bound).all()


# Names, strings and bad input.


def test_constants() -> None:
    assert [f.element.max_absolute_value for f in MX.values()] == [
        448.0,
        57344.0,
        28.0,
        7.5,
        6.0,
    ]
    assert INT8.max_absolute_value == 127 / 64
    assert (NVFP4.block_size, NVFP4.scale) == (16, "e4m3")
    assert str(MXFP8_E4M3) == "E4M3FN-RN/32/E8M0-floor"
    assert (
        str(dataclasses.replace(NVFP4, block_dims=2)) == "E2M1FNN-RN/16x16/E4M3-nearest"
    )
    assert str(MXINT8.with_rounding("stochastic")) == "INT8-SR/32/E8M0-floor"


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"element": "e4m3"}, TypeError, "element"),
        ({"element": FPFormat(5, 10)}, ValueError, "element"),
        ({"element": FP8_E4M3, "block_size": 0}, ValueError, "block_size"),
        ({"element": FP8_E4M3, "block_size": 2.0}, TypeError, "block_size"),
        ({"element": FP8_E4M3, "scale": "e5m2"}, ValueError, "scale"),
        ({"element": FP8_E4M3, "scale_rule": "nearest"}, ValueError, "scale_rule"),
        ({"element": FP4_E2M1, "scale": "e4m3"}, ValueError, "scale_rule"),
        ({"element": FP8_E4M3, "block_dims": 3}, ValueError, "block_dims"),
    ],
)
def test_bad_formats(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        BlockFormat(**kwargs)


def test_bad_input() -> None:
    from unit_scaling.formats import format_to_tuple

    with pytest.raises(TypeError, match="format_to_tuple takes an FPFormat"):
        format_to_tuple(MXFP4)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="x must be a floating-point"):
        MXFP4.quantise(torch.ones(32, dtype=torch.int32))
    with pytest.raises(ValueError, match="axis"):
        MXFP4.quantise(torch.ones(4, 32), axis=2)
    with pytest.raises(TypeError, match="axis"):
        MXFP4.quantise(torch.ones(4, 32), axis=True)
    with pytest.raises(ValueError, match="at least 1"):
        MXFP4.quantise(torch.tensor(1.0))
    with pytest.raises(ValueError, match="last two axes"):
        dataclasses.replace(NVFP4, block_dims=2).quantise(torch.ones(2, 3, 4), axis=0)
    with pytest.raises(ValueError, match="tensor_amax"):
        MXFP4.quantise(torch.ones(32), tensor_amax=1.0)
    with pytest.raises(ValueError, match="tensor_amax"):
        NVFP4.quantise(torch.ones(32), tensor_amax=torch.ones(2))
    with pytest.raises(ValueError, match="nan=False"):
        FPFormat(2, 1, nan=False)
    with pytest.raises(ValueError, match="bits"):
        IntFormat(1)


@pytest.mark.integration
def test_fixtures_are_current(fixtures: dict[str, Any]) -> None:
    """The committed fixtures are what torchao gives now."""
    pytest.importorskip("torchao.prototype.mx_formats")
    from .make_fixtures import make

    fresh = make()
    assert fresh.keys() == fixtures.keys()
    for key, value in fresh.items():
        if isinstance(value, Tensor) and value.is_floating_point():
            assert same(value, fixtures[key]), key
        elif isinstance(value, Tensor):
            assert torch.equal(value, fixtures[key]), key
        elif key != "torchao_version":
            assert value == fixtures[key], key
