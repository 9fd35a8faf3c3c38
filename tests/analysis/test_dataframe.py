"""Tests for ``unit_scaling.analysis.graph_to_dataframe``."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import Tensor, fx, nn
from torch.fx import Graph

import unit_scaling as uu
from unit_scaling.analysis import graph_to_dataframe, scales_graph
from unit_scaling.transforms import Metrics, track_scales

ID_COLUMNS = ["name", "node", "op", "target", "requires_grad", "direction"]


def test_one_row_per_tensor_and_direction(plain_graph: Graph) -> None:
    df = graph_to_dataframe(plain_graph)
    assert list(df.columns) == ID_COLUMNS + Metrics.names()
    tracked = [n for n in plain_graph.nodes if "metrics" in n.meta]
    with_grad = [n for n in tracked if n.meta["metrics"].bwd is not None]
    assert len(df) == len(tracked) + len(with_grad)
    assert (df["direction"] == "fwd").sum() == len(tracked)
    assert df["node"].is_unique is False  # each tensor has a fwd and a bwd row
    assert not df.duplicated(["node", "direction"]).any()


def test_values_equal_the_metrics(plain_graph: Graph) -> None:
    df = graph_to_dataframe(plain_graph).set_index(["node", "direction"])
    for node in plain_graph.nodes:
        metrics = node.meta.get("metrics")
        if metrics is None:
            continue
        for direction in ("fwd", "bwd"):
            data = getattr(metrics, direction)
            if data is None:
                assert (node.name, direction) not in df.index
                continue
            row = df.loc[(node.name, direction)]
            assert row["name"] == node.meta["clean_name"]
            assert row["op"] == node.op
            assert row[Metrics.names()].to_dict() == pytest.approx(
                dataclasses.asdict(data), nan_ok=True
            )


def test_identifies_parameters_and_ops(plain_graph: Graph) -> None:
    df = graph_to_dataframe(plain_graph)
    params = df[df["requires_grad"]]
    assert "wte.weight" in set(params["name"])
    assert set(params["op"]) == {"placeholder"}
    assert {
        "F.embedding",
        "F.layer_norm",
        "F.linear",
        "F.gelu",
        "F.scaled_dot_product_attention",
        "add",
        "view",
    } <= set(df["target"])


def test_fp8_fractions() -> None:
    class Amplify(nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            return x * 2.0**9  # |x| > 448/512 ≈ 0.875 overflows E4M3

    x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    graph = scales_graph(Amplify(), x, loss_fn=lambda m, b: m(b).sum())
    df = graph_to_dataframe(graph).set_index(["node", "direction"])
    out = df.loc[("mul", "fwd")]
    expected = (x.abs() * 2.0**9 > 448).float().mean().item()
    assert out["e4m3_overflow"] == pytest.approx(expected)
    assert 0.3 < out["e4m3_overflow"] < 0.45
    assert out["e5m2_overflow"] == 0
    assert df.loc[("mul", "bwd")]["e4m3_overflow"] == 0  # gradient is all ones


def test_forward_only_has_no_bwd_rows() -> None:
    model = track_scales(uu.Linear(8, 4))
    model(torch.randn(3, 8))
    df = graph_to_dataframe(model.scales_graph())
    assert set(df["direction"]) == {"fwd"}
    assert {"weight", "input"} <= set(df["name"])


def test_rejects_graphs_without_metrics() -> None:
    with pytest.raises(ValueError, match="track_scales"):
        graph_to_dataframe(fx.symbolic_trace(nn.Linear(2, 2)).graph)
    with pytest.raises(TypeError, match="scales_graph"):
        graph_to_dataframe([1, 2])  # type: ignore[arg-type]
