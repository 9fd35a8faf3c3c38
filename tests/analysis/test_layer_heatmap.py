"""Tests for ``unit_scaling.analysis.layer_heatmap``: a big model's scales as
one cell per op of each layer, and ``plot``/``report`` switching to it."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import torch
from matplotlib.axes import Axes
from matplotlib.image import imread
from torch import fx, nn
from torch.fx import Graph, Node

import unit_scaling as uu
from unit_scaling.analysis import (
    LayerPath,
    example_batch,
    parse_layer_path,
    plot,
    plot_layer_heatmap,
    scales_graph,
)
from unit_scaling.app.cli import main
from unit_scaling.transforms import prune_non_float_tensors, prune_same_scale_tensors

DEFAULT_RUN = [
    "test_parse_layer_path[transformer.h.7.attn-expected0]",
    "test_parse_layer_path[layers.0.mlp.experts.3.w1.weight-expected1]",
    "test_parse_layer_path[lm_head.weight-expected2]",
    "test_parse_layer_path[-expected3]",
    "test_one_cell_per_op_and_layer",
    "test_from_a_monitor_table",
    "test_colour_bar_in_binades_with_fp8_ranges",
    "test_forward_only_graph_has_one_panel",
    "test_errors",
    "test_plot_switches_to_the_heatmap_for_big_models",
]
LAYERS = 6


@pytest.fixture(scope="module")
def deep_graph() -> Graph:
    torch.manual_seed(0)
    model = uu.TransformerDecoder(32, 256, layers=LAYERS, heads=2)
    return scales_graph(model, example_batch(batch_size=2, seq_len=16))


def _tracked(graph: Graph) -> list[Node]:
    pruned = prune_same_scale_tensors(prune_non_float_tensors(graph))
    return [n for n in pruned.nodes if "metrics" in n.meta]


def _log2_rms(node: Node, direction: str) -> float:
    data = getattr(node.meta["metrics"], direction)
    return math.log2(math.hypot(data.std, data.abs_mean))


def _grid(ax: Axes) -> np.ndarray:
    return np.ma.filled(ax.images[0].get_array(), np.nan)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("transformer.h.7.attn", LayerPath("transformer.h", 7, "attn")),
        (
            "layers.0.mlp.experts.3.w1.weight",  # the first integer is the layer
            LayerPath("layers", 0, "mlp.experts.3.w1.weight"),
        ),
        ("lm_head.weight", LayerPath("", None, "lm_head.weight")),
        ("", LayerPath("", None, "")),
    ],
)
def test_parse_layer_path(path: str, expected: LayerPath) -> None:
    assert parse_layer_path(path) == expected


def test_one_cell_per_op_and_layer(deep_graph: Graph, tmp_path: Path) -> None:
    nodes = _tracked(deep_graph)
    assert len(nodes) > 120
    path = tmp_path / "layers.png"
    figure = plot_layer_heatmap(deep_graph, title="deep", path=path)
    assert path.stat().st_size > 20_000
    forward, backward = figure.axes[:2]
    columns = ["embed", *map(str, range(LAYERS)), "head"]
    assert [t.get_text() for t in forward.get_xticklabels()] == columns
    labels = [t.get_text() for t in forward.get_yticklabels()]
    assert len(labels) < len(nodes) / 4
    assert labels[:2] == ["embedding.weight", "embedding: x"]  # execution order
    assert "mhsa.linear_qkv: linear" in labels and labels[-1] == "projection: logits"
    for ax, direction in ((forward, "fwd"), (backward, "bwd")):
        grid = _grid(ax)
        assert grid.shape == (len(labels), len(columns))
        # every tensor in a cell of its own: none overwritten, none left out
        expected = sorted(_log2_rms(n, direction) for n in nodes)
        assert sorted(grid[np.isfinite(grid)]) == pytest.approx(expected)
        # the layers repeat the same ops
        assert len(set(np.isfinite(grid[:, 1:-1]).sum(axis=0))) == 1
    row = labels.index("mhsa.linear_qkv.weight")
    weight = next(
        n for n in nodes if n.meta["clean_name"] == "layers.3.mhsa.linear_qkv.weight"
    )
    assert _grid(forward)[row, columns.index("3")] == pytest.approx(
        _log2_rms(weight, "fwd")
    )
    parameter_labels = [
        t for t in forward.get_yticklabels() if t.get_text() == "mhsa.linear_qkv.weight"
    ]
    assert parameter_labels[0].get_fontstyle() == "italic"


def _monitor_table() -> pd.DataFrame:
    modules = ["embed", "layers.0.attn.q", "layers.0", "layers.1.attn.q", "layers.1"]
    rows = []
    for step in (0, 5):
        for i, module in enumerate([*modules, "head"]):
            value = 2.0 ** (i - step)
            rows += [
                (step, module, "activation", "rms", value),
                (step, module, "activation_grad", "rms", value / 8),
                (step, module, "activation", "abs_max", 4 * value),
            ]
            if "attn" in module:
                rows.append((step, f"{module}.weight", "weight", "rms", value / 2))
                rows.append((step, f"{module}.weight", "update", "rms", 1e-4))
    return pd.DataFrame(rows, columns=["step", "tensor", "kind", "statistic", "value"])


def test_from_a_monitor_table() -> None:
    table = _monitor_table()
    figure = plot_layer_heatmap(table)  # the last step, 5
    forward, backward = figure.axes[:2]
    labels = [t.get_text() for t in forward.get_yticklabels()]
    assert labels == ["embed", "attn.q.weight", "attn.q", "(layer output)", "head"]
    columns = [t.get_text() for t in forward.get_xticklabels()]
    assert columns == ["embed", "0", "1", "head"]
    nan = math.nan
    np.testing.assert_array_equal(
        _grid(forward),
        [
            [-5, nan, nan, nan],
            [nan, -5, -3, nan],  # weights: half their module's RMS
            [nan, -4, -2, nan],
            [nan, -3, -1, nan],
            [nan, nan, nan, 0],
        ],
    )
    assert _grid(backward)[2, 1] == -7  # activation_grad
    assert np.isnan(_grid(backward)[1]).all()  # no weight gradients recorded
    assert _grid(plot_layer_heatmap(table, step=0).axes[0])[0, 0] == 0
    assert _grid(plot_layer_heatmap(table, metric="abs_max").axes[0])[0, 0] == -3
    with pytest.raises(ValueError, match=r"at step 7; steps recorded: \[0, 5\]"):
        plot_layer_heatmap(table, step=7)


def test_colour_bar_in_binades_with_fp8_ranges() -> None:
    figure = plot_layer_heatmap(_monitor_table())
    bar = figure.axes[-1]
    assert bar.get_ylabel() == "log₂ RMS (binades from 1)"
    assert {t.get_text() for t in bar.texts} == {"E4M3", "E5M2"}
    assert all(float(t).is_integer() for t in bar.get_yticks())
    low, high = figure.axes[0].images[0].norm.vmin, figure.axes[0].images[0].norm.vmax
    assert low == -high and high >= 7  # spans the smallest gradient, -7


def test_forward_only_graph_has_one_panel() -> None:
    graph = scales_graph(
        nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)),
        torch.randn(3, 4),
        loss_fn=lambda model, x: model(x).sum(),
        backward=False,
    )
    figure = plot_layer_heatmap(graph)
    heatmaps = [ax for ax in figure.axes if ax.images]
    assert len(heatmaps) == 1
    assert heatmaps[0].get_title(loc="left") == "forward: values"


def test_errors(deep_graph: Graph) -> None:
    with pytest.raises(ValueError, match="unknown metric 'bogus'"):
        plot_layer_heatmap(deep_graph, metric="bogus")
    with pytest.raises(ValueError, match="track_scales"):
        plot_layer_heatmap(fx.symbolic_trace(nn.Linear(2, 2)).graph)
    with pytest.raises(ValueError, match="lacks the column"):
        plot_layer_heatmap(_monitor_table().drop(columns="statistic"))


def test_plot_switches_to_the_heatmap_for_big_models(deep_graph: Graph) -> None:
    ax = plot(deep_graph, title="deep")
    heatmaps = [a for a in ax.figure.axes if a.images]
    assert ax is heatmaps[0] and len(heatmaps) == 2
    assert ax.figure.get_suptitle() == "deep"
    assert len(plot(deep_graph, per_tensor=True).get_yticks()) > 120
    _, given = plt.subplots()
    assert plot(deep_graph, ax=given) is given  # drawn per tensor into it
    with pytest.raises(ValueError, match="pass ax=None"):
        plot(deep_graph, per_tensor=False, ax=given)


def test_report_draws_big_models_compactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "deep_models.py").write_text(
        "import unit_scaling as uu\n"
        "def make():\n"
        f"    return uu.TransformerDecoder(32, 256, layers={LAYERS}, heads=2)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    heights = {}
    for flags in ([], ["--per-tensor"]):
        out = tmp_path / ("per_tensor" if flags else "compact")
        argv = ["report", "deep_models:make", "--batch-size", "2", "--seq-len", "8"]
        assert main([*argv, "--out", str(out), *flags]) == 0
        heights[bool(flags)] = imread(out / "scales_after.png").shape[0]
    assert heights[False] < heights[True] / 2
