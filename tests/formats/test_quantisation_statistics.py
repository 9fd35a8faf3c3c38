"""What a block format does to a tensor, measured by hand and by
``quantisation_statistics``, and the same numbers through ``track_scales``,
``graph_to_dataframe`` and ``plot``."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import Tensor, nn

from unit_scaling.formats import (
    MXFP4,
    MXFP8_E4M3,
    NVFP4,
    BlockFormat,
    quantisation_statistics,
)
from unit_scaling.transforms import track_scales

FORMATS = [MXFP8_E4M3, MXFP4, NVFP4, dataclasses.replace(NVFP4, block_dims=2)]


def _wide(*shape: int, seed: int = 0) -> Tensor:
    """Normal values times 2^k, k uniform in [-30, 10]: some blocks with a
    dynamic range too wide for the format, so elements flush."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * 2.0 ** torch.randint(
        -30, 10, shape, generator=g
    )


@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_statistics_by_hand(fmt: BlockFormat) -> None:
    x = _wide(48, 80)
    x[0, :3] = 0.0
    q = fmt.quantise(x)
    s = quantisation_statistics(x, fmt)
    flushed = ((x != 0) & (q == 0)).double().mean().item()
    assert s.flushed == pytest.approx(flushed) and s.flushed > 0
    error = (q.double() - x.double()).square()
    assert s.mse == pytest.approx(error.mean().item())
    sqnr = 10 * math.log10(x.double().square().sum().item() / error.sum().item())
    assert s.sqnr_db == pytest.approx(sqnr)
    # Saturated: above the element maximum times the block's scale, which is
    # the largest |q| in a block holding one (each block's scale from encode).
    if fmt.scale == "e8m0":
        scales = fmt.encode(x).scales.double()
        limit = fmt.element.max_absolute_value * 2.0 ** (scales - 127)
        limit = limit.repeat_interleave(32, -1)[:, : x.shape[1]]
        saturated = (x.abs().double() > limit).double().mean().item()
        assert s.saturated == pytest.approx(saturated) and s.saturated > 0
    assert 0 <= s.saturated < 0.2


def test_saturation_and_block_range_exactly() -> None:
    # One block of 32: amax 7 in E2M1 under the floor rule gets scale 1, so 7
    # saturates to 6; the others are 1 and 2^-5 (flushed: below half of 0.5).
    x = torch.zeros(1, 32)
    x[0, :3] = torch.tensor([7.0, 1.0, 2.0**-5])
    s = quantisation_statistics(x, MXFP4)
    assert s.saturated == 1 / 32 and s.flushed == 1 / 32
    assert s.block_range_median == pytest.approx(math.log2(7 / 2**-5))
    assert s.mse == pytest.approx((1 + 2.0**-10) / 32)
    nothing = quantisation_statistics(torch.ones(2, 32), MXFP4)
    assert nothing.sqnr_db == math.inf and nothing.mse == 0 and nothing.flushed == 0


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match="fmt must be a BlockFormat"):
        quantisation_statistics(torch.ones(4), "MXFP4")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="floating-point"):
        quantisation_statistics(torch.ones(4, dtype=torch.int64), MXFP4)
    with pytest.raises(TypeError, match="block_format must be a BlockFormat"):
        track_scales(nn.Linear(4, 4), block_format="MXFP4")  # type: ignore[arg-type]


def test_track_scales_records_them() -> None:
    torch.manual_seed(0)
    layer = nn.Linear(64, 32)
    model = track_scales(layer, block_format=MXFP4)
    x = _wide(8, 64)
    model(x).square().sum().backward()
    metrics = {
        n.meta["clean_name"]: n.meta["metrics"]
        for n in model.scales_graph().nodes
        if "metrics" in n.meta
    }
    weight = quantisation_statistics(layer.weight, MXFP4)
    assert metrics["weight"].fwd.block_sqnr_db == pytest.approx(weight.sqnr_db)
    assert metrics["weight"].fwd.block_range_max == pytest.approx(
        weight.block_range_max
    )
    grad = quantisation_statistics(model.weight.grad, MXFP4)  # type: ignore[arg-type]
    assert metrics["weight"].bwd.block_mse == pytest.approx(grad.mse)
    inputs = quantisation_statistics(x, MXFP4)
    assert metrics["input"].fwd.block_flushed == pytest.approx(inputs.flushed)
    assert inputs.flushed > 0
    # Without a block format the fields are NaN.
    plain = track_scales(nn.Linear(64, 32))
    plain(x).sum().backward()
    node = next(n for n in plain.scales_graph().nodes if "metrics" in n.meta)
    assert math.isnan(node.meta["metrics"].fwd.block_sqnr_db)


def test_dataframe_and_plot_show_them(tmp_path: object) -> None:
    pytest.importorskip("matplotlib")
    from unit_scaling.analysis import graph_to_dataframe, plot

    model = track_scales(
        nn.Sequential(nn.Linear(64, 64), nn.GELU()), block_format=NVFP4
    )
    model(_wide(16, 64)).sum().backward()
    graph = model.scales_graph()
    df = graph_to_dataframe(graph)
    for column in ("block_flushed", "block_saturated", "block_mse", "block_sqnr_db"):
        assert df[column].notna().all(), column
    assert (df.block_range_max >= df.block_range_median).all()
    ax = plot(graph, metric="block_sqnr_db")
    assert "noise" in ax.get_xlabel()
    plain = track_scales(nn.Linear(8, 8))
    plain(torch.randn(2, 8)).sum().backward()
    with pytest.raises(ValueError, match="block_format="):
        plot(plain.scales_graph(), metric="block_sqnr_db")
