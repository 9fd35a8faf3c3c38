"""Golden fixtures for the block formats: torchao's outputs, computed once.

Run ``python -m tests.formats.make_fixtures`` (torchao installed) to rewrite
``block_formats.pt.gz``; the default test run compares ``unit_scaling.formats``
with the file, without torchao, and an integration test checks it is current.

The file holds the inputs (so no random generator must reproduce them), and for
each MX element, scale rule and input dtype torchao's ``to_mx`` scale and element
codes; NVFP4 tensors and ``nvfp4_quantize``'s codes; and, for the FP6 and FP4
element casts, a SHA-256 of torchao's codes for every bfloat16 and float16 bit
pattern (all 2^16 codes would be most of the file; the digest says as much).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

FIXTURES = Path(__file__).with_name("block_formats.pt.gz")
MX_ELEMENTS = ("e4m3", "e5m2", "e3m2", "e2m3", "e2m1")
RULES = ("floor", "ceil", "even", "rceil")
CAST_ELEMENTS = ("e3m2", "e2m3", "e2m1")
ELEMENT_MAX = {"e4m3": 448.0, "e5m2": 57344.0, "e3m2": 28.0, "e2m3": 7.5, "e2m1": 6.0}
BLOCK = 32


def every_pattern(dtype: torch.dtype) -> Tensor:
    """Every 16-bit pattern of ``dtype`` but the NaNs, as float32."""
    x = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
    x = x.view(dtype).float()
    return x[~x.isnan()]


def save(fixtures: dict[str, object], path: Path = FIXTURES) -> None:
    buffer = io.BytesIO()
    torch.save(fixtures, buffer)
    path.write_bytes(gzip.compress(buffer.getvalue(), mtime=0))


def load(path: Path = FIXTURES) -> dict[str, Any]:
    with gzip.open(path) as f:
        fixtures: dict[str, Any] = torch.load(io.BytesIO(f.read()), weights_only=True)
    return fixtures


def digest(codes: Tensor) -> str:
    return hashlib.sha256(codes.contiguous().numpy().tobytes()).hexdigest()


def _adversarial_amaxes() -> list[float]:
    """Block maxima at every scale rule's edges."""
    nearby = []
    for k in (-126, -120, -1, 0, 7, 126):
        for mantissa in (1.0, 1.75, 1.5, 1.9375):
            nearby.append(math.ldexp(mantissa, k))
        for top in ELEMENT_MAX.values():
            nearby.append(math.ldexp(top, k - 8))
            # the midpoint between the element's max and the next power of two
            nearby.append(
                math.ldexp((top + 2.0 ** math.ceil(math.log2(top))) / 2, k - 8)
            )
    amaxes = torch.tensor(nearby, dtype=torch.float32)
    inf = torch.tensor(math.inf)
    amaxes = torch.cat([amaxes, amaxes.nextafter(inf), amaxes.nextafter(-inf)])
    specials = [2.0**-149, 3 * 2.0**-140, 2.0**-127, 2.0**-130, 3.4e38, 2.0**127]
    return [a for a in amaxes.tolist() if 0 < a < math.inf] + specials


def mx_inputs() -> Tensor:
    """float32 blocks of 32: random ones at magnitudes across float32's range,
    adversarial ones at every rule's edges, zeros, infinities and NaN."""
    gen = torch.Generator().manual_seed(0)
    rows = 64
    exponents = torch.randint(-150, 127, (rows, 1), generator=gen).float()
    random = torch.randn(rows, BLOCK, generator=gen) * torch.exp2(exponents)
    amaxes = torch.tensor(_adversarial_amaxes(), dtype=torch.float32)
    # Each adversarial block: its amax at a random place, the rest below it,
    # a quarter of them at exact ties of a coarse grid.
    fill = torch.rand(len(amaxes), BLOCK, generator=gen) * 2 - 1
    coarse = torch.randint(-16, 17, (len(amaxes), BLOCK), generator=gen) / 16
    fill = torch.where(torch.rand(len(amaxes), 1, generator=gen) < 0.25, coarse, fill)
    adversarial = (fill * amaxes[:, None]).clamp(-3.4e38, 3.4e38)
    place = torch.randint(0, BLOCK, (len(amaxes),), generator=gen)
    sign = torch.where(torch.rand(len(amaxes), generator=gen) < 0.5, -1.0, 1.0)
    adversarial[torch.arange(len(amaxes)), place] = amaxes * sign
    special = torch.zeros(6, BLOCK)
    special[1] = -0.0
    special[2, 3], special[3, 5], special[4, 7] = math.inf, -math.inf, math.nan
    special[5, :2] = torch.tensor([math.nan, math.inf])
    special[2:] += torch.randn(4, BLOCK, generator=gen) * (special[2:] == 0)
    return torch.cat([random, adversarial, special])


def nvfp4_inputs() -> list[Tensor]:
    """float32 matrices (each with its own per-tensor amax) of 16-blocks whose
    magnitudes spread over 2^-20 .. 2^2 of the tensor's, at several scales."""
    gen = torch.Generator().manual_seed(1)
    tensors = []
    for scale in (-100, -10, 0, 10, 100):
        spread = torch.randint(-20, 3, (32, 4, 1), generator=gen).float()
        x = torch.randn(32, 4, 16, generator=gen) * torch.exp2(spread + scale)
        tensors.append(x.reshape(32, 64))
    tensors.append(torch.zeros(16, 32))
    return tensors


def _torchao_mx(x: Tensor, element: str, rule: str) -> tuple[Tensor, Tensor]:
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.kernels import unpack_uint4
    from torchao.prototype.mx_formats.mx_tensor import to_mx

    dtypes = {
        "e4m3": torch.float8_e4m3fn,
        "e5m2": torch.float8_e5m2,
        "e3m2": "fp6_e3m2",
        "e2m3": "fp6_e2m3",
        "e2m1": torch.float4_e2m1fn_x2,
    }
    mode = getattr(ScaleCalculationMode, rule.upper())
    scales, data = to_mx(x, dtypes[element], BLOCK, mode)
    data = data.view(torch.uint8)
    if element == "e2m1":
        data = unpack_uint4(data)
    return scales.view(torch.uint8), data


def _torchao_nvfp4(x: Tensor) -> tuple[Tensor, Tensor]:
    from torchao.prototype.mx_formats.kernels import unpack_uint4
    from torchao.prototype.mx_formats.nvfp4_tensor import (
        nvfp4_quantize,
        per_tensor_amax_to_scale,
    )

    per_tensor = per_tensor_amax_to_scale(x.abs().amax().float())
    scales, data = nvfp4_quantize(x, 16, per_tensor)
    return scales.view(torch.uint8), unpack_uint4(data)


def _torchao_cast(x: Tensor, element: str) -> Tensor:
    from torchao.prototype.mx_formats import kernels

    cast = {
        "e3m2": kernels.f32_to_f6_e3m2_unpacked,
        "e2m3": kernels.f32_to_f6_e2m3_unpacked,
        "e2m1": kernels.f32_to_f4_unpacked,
    }[element]
    return cast(x)


def make() -> dict[str, object]:
    """Everything the fixture file holds, computed with torchao."""
    out: dict[str, object] = {}
    inputs = {"float32": mx_inputs()}
    inputs["bfloat16"] = inputs["float32"].bfloat16()
    for dtype_name, x in inputs.items():
        out[f"mx/{dtype_name}/input"] = x
        for element in MX_ELEMENTS:
            for rule in RULES:
                scales, codes = _torchao_mx(x, element, rule)
                out[f"mx/{dtype_name}/{element}/{rule}/scales"] = scales
                out[f"mx/{dtype_name}/{element}/{rule}/elements"] = codes
    for i, x32 in enumerate(nvfp4_inputs()):
        for dtype_name, x in (("float32", x32), ("bfloat16", x32.bfloat16())):
            scales, codes = _torchao_nvfp4(x)
            out[f"nvfp4/{dtype_name}/{i}/input"] = x
            out[f"nvfp4/{dtype_name}/{i}/scales"] = scales
            out[f"nvfp4/{dtype_name}/{i}/elements"] = codes
    for dtype in (torch.bfloat16, torch.float16):
        x = every_pattern(dtype)
        for element in CAST_ELEMENTS:
            out[f"cast/{dtype}/{element}"] = digest(_torchao_cast(x, element))
    import torchao

    out["torchao_version"] = torchao.__version__
    return out


if __name__ == "__main__":
    save(make())
    print(f"wrote {FIXTURES} ({FIXTURES.stat().st_size} bytes)")
