"""Tests for ``coord_check``, ``coord_check_spread`` and ``plot_coord_check``."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import torch
from torch import nn

import unit_scaling as uu
from unit_scaling.analysis import coord_check, coord_check_spread, plot_coord_check
from unit_scaling.app.baseline import StandardTransformerDecoder

WIDTHS = [32, 64, 128]
STEPS = 2
OPTIONS = {"steps": STEPS, "batch_size": 4, "seq_len": 16}


def make_umup(width: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = uu.TransformerDecoder(width, 256, layers=1, heads=width // 16)
    return model, uu.optim.AdamW(model.parameters(), lr=2**-3)


def make_sp(width: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = StandardTransformerDecoder(width, 256, layers=1, heads=width // 16)
    return model, torch.optim.AdamW(model.parameters(), lr=2**-7)


@pytest.fixture(scope="module")
def results() -> pd.DataFrame:
    return pd.concat(
        [
            coord_check(make_umup, WIDTHS, label="u-μP", updates=True, **OPTIONS),
            coord_check(make_sp, WIDTHS, label="SP", updates=True, **OPTIONS),
        ]
    )


def test_records_every_layer_at_every_step_and_width(results: pd.DataFrame) -> None:
    umup = results[results["label"] == "u-μP"]
    assert list(umup.columns) == [
        "label", "width", "step", "module", "group", "type", "rms", "loss",
        "weight_update", "output_update",
    ]  # fmt: skip
    modules = set(umup["module"])
    # leaf modules and the blocks of the layer stack; dropout (p=0) is skipped
    assert {
        "embedding",
        "layers.0",
        "layers.0.mhsa.linear_qkv",
        "projection",
    } <= modules
    assert not any(name.endswith("dropout") for name in modules)
    assert len(umup) == len(WIDTHS) * (STEPS + 1) * len(modules)
    assert set(umup["step"]) == set(range(STEPS + 1))
    assert set(umup["group"]) >= {"layers.*", "layers.*.mhsa.linear_qkv"}
    assert (umup["rms"] > 0).all() and umup["loss"].map(math.isfinite).all()


def test_rms_is_the_layer_output_rms() -> None:
    torch.manual_seed(0)
    df = coord_check(make_umup, [32], steps=0, batch_size=2, seq_len=8, seed=3)
    torch.manual_seed(3)
    model, _ = make_umup(32)
    from unit_scaling.data import Corpus

    batch = next(Corpus(max_bytes=2**20).batches("train", 2, 8, seed=3))
    embedded = model.embedding(batch[:, :-1])
    expected = embedded.pow(2).mean().sqrt().item()
    row = df[df["module"] == "embedding"]
    assert row["rms"].item() == pytest.approx(expected, rel=1e-5)


def test_umup_stays_flat_across_width_and_sp_spreads(results: pd.DataFrame) -> None:
    spread = coord_check_spread(results)
    last = spread[spread["step"] == STEPS]
    # the readout is excluded: μP makes logits vanish like 1/sqrt(width) at init,
    # a trend that a couple of steps only start to undo (see
    # docs/results/coord_check.md)
    shared = ["layers.*", "embedding", "layers.*.mlp.linear_2"]
    by_label = {
        label: part.set_index("group")["spread"]
        for label, part in last.groupby("label")
    }
    for group in shared:
        assert by_label["u-μP"][group] < 0.35, group
    assert by_label["u-μP"].mean() < 0.5 * by_label["SP"].mean()
    sp_block = last[(last["label"] == "SP") & (last["group"] == "layers.*")]
    assert sp_block["slope"].item() > 0.4  # SP activations grow with width


def test_spread_and_slope_of_a_known_power_law() -> None:
    rows = [
        {"label": "m", "width": w, "step": 0, "module": f"l.{i}", "group": "l.*",
         "type": "Linear", "rms": 3.0 * w**0.5, "loss": 0.0}
        for w in (16, 64, 256) for i in range(2)
    ]  # fmt: skip
    spread = coord_check_spread(pd.DataFrame(rows))
    assert spread["slope"].item() == pytest.approx(0.5)
    assert spread["spread"].item() == pytest.approx(0.5 * math.log2(256 / 16))


def test_plot_compares_labels_row_by_row(results: pd.DataFrame, tmp_path: Path) -> None:
    panels = ["embedding", "layers.*", "projection"]
    fig = plot_coord_check(results, panels=panels, title="check")
    grid = [ax for ax in fig.axes if ax.get_visible() and ax.lines]
    assert len(grid) == len(panels) * 2  # a row per panel, a column per label
    assert [ax.get_title() for ax in grid[:2]] == ["u-μP", "SP"]
    assert all(len(ax.lines) == STEPS + 1 for ax in grid)
    assert grid[0].get_xscale() == "log" and grid[0].get_yscale() == "log"
    assert grid[0].lines[0].get_xdata().tolist() == WIDTHS
    path = tmp_path / "coord_check.png"
    fig.savefig(path, dpi=60)
    assert path.stat().st_size > 10_000


def test_plot_single_label_wraps_panels(results: pd.DataFrame) -> None:
    umup = results[results["label"] == "u-μP"]
    fig = plot_coord_check(umup, by="type")
    titled = {ax.get_title() for ax in fig.axes if ax.lines}
    assert titled == set(umup["type"])


def test_include_selects_modules() -> None:
    df = coord_check(
        make_sp, [32], steps=1, batch_size=2, seq_len=8,
        include=lambda name, module: isinstance(module, nn.Embedding),
    )  # fmt: skip
    assert set(df["module"]) == {"embedding"}
    with pytest.raises(ValueError, match="include"):
        coord_check(make_sp, [32], steps=0, include=lambda name, module: False)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="widths"):
        coord_check(make_sp, [])
    with pytest.raises(ValueError, match="widths"):
        coord_check(make_sp, [0])
    with pytest.raises(ValueError, match="steps"):
        coord_check(make_sp, [32], steps=-1)
    df = pd.DataFrame({"label": ["m"], "width": [8], "step": [0], "rms": [1.0]})
    with pytest.raises(ValueError, match="group"):
        plot_coord_check(df)
    with pytest.raises(ValueError, match="no 'label' named"):
        plot_coord_check(df, by="label", panels=["other"])


def test_without_updates_there_are_no_update_columns() -> None:
    df = coord_check(make_sp, [32], steps=1, batch_size=2, seq_len=8)
    assert "weight_update" not in df.columns and "output_update" not in df.columns
    with pytest.raises(ValueError, match="updates=True"):
        plot_coord_check(df, value="output_update")
    with pytest.raises(ValueError, match="updates=True"):
        coord_check_spread(df, value="weight_update")
    with pytest.raises(ValueError, match="value must be one of"):
        plot_coord_check(df, value="gradient")


class _Bigram(nn.Module):
    """An embedding and a linear readout: the two update sizes by hand."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(256, 8)
        self.readout = nn.Linear(8, 256)

    def loss(self, batch: torch.Tensor) -> torch.Tensor:
        logits = self.readout(self.embedding(batch[:, :-1]))
        return nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())


def test_update_sizes_are_those_of_the_step() -> None:
    def make(width: int) -> tuple[nn.Module, torch.optim.Optimizer]:
        model = _Bigram()
        return model, torch.optim.SGD(model.parameters(), lr=0.5)

    df = coord_check(make, [8], steps=1, batch_size=2, seq_len=8, seed=5, updates=True)
    # the same step by hand
    torch.manual_seed(5)
    model, optimizer = make(8)
    from unit_scaling.analysis._corpus import analysis_corpus

    batch = next(analysis_corpus().batches("train", 2, 8, 5))
    x = model.embedding(batch[:, :-1]).detach()
    w, b = model.readout.weight.detach().clone(), model.readout.bias.detach().clone()
    old_rows = model.embedding.weight.detach().clone()
    model.loss(batch).backward()
    optimizer.step()
    dw, db = model.readout.weight.detach() - w, model.readout.bias.detach() - b
    expected_weight = (dw.square().sum() + db.square().sum()).sqrt() / (
        w.square().sum() + b.square().sum()
    ).sqrt()
    y, dy = x @ w.T + b, x @ dw.T + db
    expected_output = dy.square().mean().sqrt() / y.square().mean().sqrt()
    row = df[(df["module"] == "readout") & (df["step"] == 0)]
    assert row["weight_update"].item() == pytest.approx(
        expected_weight.item(), rel=1e-4
    )
    assert row["output_update"].item() == pytest.approx(
        expected_output.item(), rel=1e-4
    )
    # the embedding's output change is that of the rows the batch looked up
    ids = batch[:, :-1]
    d_rows = model.embedding.weight.detach()[ids] - old_rows[ids]
    expected = d_rows.square().mean().sqrt() / old_rows[ids].square().mean().sqrt()
    row = df[(df["module"] == "embedding") & (df["step"] == 0)]
    assert row["output_update"].item() == pytest.approx(expected.item(), rel=1e-4)
    # no step follows the last measurement
    assert df[df["step"] == 1]["output_update"].isna().all()


def test_umup_updates_move_hidden_outputs_alike_at_every_width(
    results: pd.DataFrame,
) -> None:
    """μP's statement: a step moves each hidden layer's output by an amount
    independent of width; under SP a fixed Adam lr moves wider layers more."""
    spread = coord_check_spread(results, value="output_update")
    first = spread[spread["step"] == 0].set_index(["label", "group"])["slope"]
    # (not the readout: its output starts ∝ width^-½ by design, so its relative
    # change does not measure the update's effect until training has lifted it)
    hidden = ["layers.*.mhsa.linear_qkv", "layers.*.mhsa.linear_o"]
    hidden += ["layers.*.mlp.linear_gate", "layers.*.mlp.linear_2"]
    for group in hidden:
        assert abs(first["u-μP", group]) < 0.15, group
    assert first["SP", "layers.*.linear_gate"] > 0.25
    # u-μP's Adam rule lr/sqrt(fan_in) for the embedding table (fan_in = width)
    assert first["u-μP", "embedding"] == pytest.approx(-0.5, abs=0.1)


def test_plot_of_an_update_column(results: pd.DataFrame) -> None:
    fig = plot_coord_check(
        results, panels=["embedding", "projection"], value="output_update"
    )
    grid = [ax for ax in fig.axes if ax.lines]
    assert all(len(ax.lines) == STEPS for ax in grid)  # no step after the last
    assert "Δy" in grid[0].get_ylabel()
    # by default only the modules with parameters of their own get a panel; one
    # asked for without any says so (and the figure still draws)
    umup = results[results["label"] == "u-μP"]
    fig = plot_coord_check(umup, value="output_update")
    titles = {ax.get_title() for ax in fig.axes if ax.get_visible() and ax.lines}
    assert "embedding" in titles and "layers.*" not in titles
    fig = plot_coord_check(umup, panels=["layers.*"], value="output_update")
    fig.canvas.draw()
    assert any(t.get_text() == "no data" for ax in fig.axes for t in ax.texts)


def test_the_replay_leaves_a_batch_norms_running_statistics_alone() -> None:
    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = nn.Embedding(256, 8)
            self.norm = nn.BatchNorm1d(8)
            self.readout = nn.Linear(8, 256)

        def loss(self, batch: torch.Tensor) -> torch.Tensor:
            x = self.norm(self.embedding(batch[:, :-1]).transpose(1, 2))
            logits = self.readout(x.transpose(1, 2))
            return nn.functional.cross_entropy(
                logits.flatten(0, 1), batch[:, 1:].flatten()
            )

    def make(width: int) -> tuple[nn.Module, torch.optim.Optimizer]:
        model = Model()
        return model, torch.optim.SGD(model.parameters(), lr=0.1)

    kept: list[nn.Module] = []

    def keep(width: int) -> tuple[nn.Module, torch.optim.Optimizer]:
        model, optimizer = make(width)
        kept.append(model)
        return model, optimizer

    coord_check(keep, [8], steps=2, batch_size=2, seq_len=8, updates=True)
    coord_check(keep, [8], steps=2, batch_size=2, seq_len=8)
    with_updates, without = kept
    assert with_updates.norm.num_batches_tracked.item() == 3  # one per forward
    assert torch.equal(with_updates.norm.running_mean, without.norm.running_mean)
    assert torch.equal(with_updates.norm.running_var, without.norm.running_var)
