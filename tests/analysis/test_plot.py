"""Tests for ``unit_scaling.analysis.plot``."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
import torch
from matplotlib.axes import Axes
from torch import Tensor, fx, nn
from torch.fx import Graph

from unit_scaling.analysis import plot, scales_graph
from unit_scaling.transforms import (
    Metrics,
    prune_non_float_tensors,
    prune_same_scale_tensors,
)


def _expected_rows(graph: Graph, metric: str = "mean_abs", zeros: bool = False) -> int:
    """Rows plot() should draw, counted independently of its implementation."""
    pruned = prune_same_scale_tensors(prune_non_float_tensors(graph))
    count = 0
    for node in pruned.nodes:
        m = node.meta.get("metrics")
        if m is None:
            continue
        values = [getattr(m.fwd, metric)] + ([getattr(m.bwd, metric)] if m.bwd else [])
        count += zeros or any(v != 0 for v in values)
    return count


def _marker_xs(ax: Axes, colour_index: int) -> list[float]:
    """x positions of the forward (0) or backward (1) markers."""
    return [float(x) for x, _ in ax.collections[colour_index].get_offsets()]


@pytest.mark.parametrize("which", ["plain", "unit_scaled"])
def test_saves_readable_png(
    which: str, plain_graph: Graph, unit_scaled_graph: Graph, tmp_path: Path
) -> None:
    graph = plain_graph if which == "plain" else unit_scaled_graph
    ax = plot(graph, title=f"{which} nanoGPT")
    path = tmp_path / f"{which}.png"
    ax.figure.savefig(path, dpi=80)
    assert path.stat().st_size > 20_000
    assert len(ax.get_yticks()) == _expected_rows(graph)
    assert ax.get_xscale() == "log"
    assert ax.xaxis.get_transform().base == 2
    assert ax.get_title(loc="left") == f"{which} nanoGPT"
    # the figure grows with the rows: at least ~0.15 inch per row
    assert ax.figure.get_figheight() >= 0.15 * len(ax.get_yticks())
    legend = [t.get_text() for t in ax.figure.legends[0].get_texts()]
    assert legend[:2] == ["forward (tensor)", "backward (grad)"]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert "wte.weight" in labels
    assert any(label.startswith("h.0.c_attn") for label in labels)  # module path


def test_unit_scaled_markers_sit_near_one(
    plain_graph: Graph, unit_scaled_graph: Graph
) -> None:
    def median_distance_from_one(graph: Graph, direction: int) -> float:
        xs = sorted(abs(math.log2(x)) for x in _marker_xs(plot(graph), direction))
        return xs[len(xs) // 2]

    for direction in (0, 1):
        unit = median_distance_from_one(unit_scaled_graph, direction)
        assert unit < 1.5
        assert unit < median_distance_from_one(plain_graph, direction) - 2


def test_markers_are_the_metric_values(plain_graph: Graph) -> None:
    for metric in ("std", "abs_max"):
        ax = plot(plain_graph, metric=metric, prune_same_scale=False)
        pruned = prune_non_float_tensors(plain_graph)
        expected = [
            getattr(n.meta["metrics"].fwd, metric)
            for n in pruned.nodes
            if "metrics" in n.meta and getattr(n.meta["metrics"].fwd, metric) > 0
        ]
        assert _marker_xs(ax, 0) == pytest.approx(expected)
        assert ax.get_xlabel().startswith(Metrics.get_full_name(metric))


def test_same_scale_pruning_is_optional(plain_graph: Graph) -> None:
    pruned = len(plot(plain_graph).get_yticks())
    full = len(plot(plain_graph, prune_same_scale=False).get_yticks())
    assert full > pruned


def test_arrows_and_error_bars_are_optional(plain_graph: Graph) -> None:
    ax = plot(plain_graph)
    assert len(ax.texts) > 10  # arrows are annotations
    assert len(ax.lines) > 2 * len(ax.get_yticks())  # bars plus row separators
    bare = plot(plain_graph, show_arrows=False, show_error_bars=False)
    assert len(bare.texts) == 0
    assert len(bare.lines) < len(ax.lines)


def test_axis_limits(plain_graph: Graph) -> None:
    ax = plot(plain_graph, xmin=2**-10, xmax=2**4)
    assert ax.get_xlim() == pytest.approx((2**-10, 2**4))
    with pytest.raises(ValueError, match="xmin"):
        plot(plain_graph, xmin=4.0, xmax=2.0)
    with pytest.raises(ValueError, match="xmin"):
        plot(plain_graph, xmin=0.0)


def test_draws_into_given_axes(plain_graph: Graph) -> None:
    _, (left, right) = plt.subplots(1, 2)
    ax = plot(plain_graph, title="SP", ax=right)
    assert ax is right
    assert right.get_legend() is not None
    assert len(left.collections) == 0


class _WithZeros(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(x) + torch.zeros_like(x)


def test_zero_tensors_hidden_unless_asked() -> None:
    graph = scales_graph(
        _WithZeros(), torch.randn(4, 8), loss_fn=lambda m, x: m(x).sum()
    )
    hidden = [t.get_text() for t in plot(graph).get_yticklabels()]
    shown_ax = plot(graph, show_zero_tensors=True)
    shown = [t.get_text() for t in shown_ax.get_yticklabels()]
    assert "zeros_like" not in hidden
    assert "zeros_like" in shown
    assert len(shown) == _expected_rows(graph, zeros=True) == len(hidden) + 1
    # the zero is drawn as a hollow marker at the left edge
    assert any(
        float(x) == pytest.approx(shown_ax.get_xlim()[0])
        for c in shown_ax.collections
        for x, _ in c.get_offsets()
    )


class _Overflows(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x * float("inf")


def test_non_finite_values_marked_at_right_edge() -> None:
    graph = scales_graph(
        _Overflows(), torch.randn(4, 8), loss_fn=lambda m, x: m(x), backward=False
    )
    ax = plot(graph, show_arrows=False)
    red = [
        c for c in ax.collections if c.get_offsets().shape[0] and c.get_sizes()[0] == 40
    ]
    assert len(red) == 1
    assert float(red[0].get_offsets()[0][0]) == pytest.approx(ax.get_xlim()[1])


def test_bad_metric_lists_valid_ones(plain_graph: Graph) -> None:
    with pytest.raises(ValueError, match=r"mean_abs.*e5m2_underflow"):
        plot(plain_graph, metric="rms")


def test_rejects_graphs_without_metrics() -> None:
    traced = fx.symbolic_trace(nn.Linear(2, 2)).graph
    with pytest.raises(ValueError, match="track_scales"):
        plot(traced)
    with pytest.raises(TypeError, match="scales_graph"):
        plot("graph")  # type: ignore[arg-type]
