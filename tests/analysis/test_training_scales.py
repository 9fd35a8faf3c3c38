"""Tests for ``unit_scaling.analysis.training_scales`` and ``unit-scaling
monitor-plots``: reading a monitor's table back and plotting it over training."""

from __future__ import annotations

import contextlib
import io
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from unit_scaling.analysis import (
    plot_fp8_fractions_over_training,
    plot_scales_over_training,
    read_scales,
)
from unit_scaling.app.cli import main

COLUMNS = ["step", "tensor", "kind", "statistic", "value"]
# In execution order; a weight is named after the module that uses it.
MODULES = ["embed", "layers.0.attn.q", "layers.0.mlp", "layers.1.attn.q", "head"]
STEPS = [0, 10, 20]


def _table() -> pd.DataFrame:
    """A small monitor table; every value is exact in float32 (TensorBoard's)."""
    rows = []
    for step in STEPS:
        for i, module in enumerate(MODULES):
            for kind, tensor, shift in (
                ("activation", module, 0),
                ("activation_grad", module, -3),
                ("weight", f"{module}.weight", -1),
                ("update", f"{module}.weight", -12),
            ):
                log2_rms = shift + i - step // 10
                rows += [
                    (step, tensor, kind, "rms", 2.0**log2_rms),
                    (step, tensor, kind, "log2_rms", float(log2_rms)),
                    (step, tensor, kind, "e4m3_saturated", 0.0),
                    (step, tensor, kind, "e4m3_flushed", 2.0 ** -(i + 4)),
                    (step, tensor, kind, "e5m2_saturated", 0.0),
                    (step, tensor, kind, "e5m2_flushed", 0.0),
                ]
    return pd.DataFrame(rows, columns=COLUMNS)


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return _table()


def _grid(figure: Figure, panel: int = 0) -> np.ndarray:
    """The log₂ RMS a heatmap panel shows, NaN where no cell is coloured."""
    heatmaps = [
        ax for ax in figure.axes if ax.images and ax.get_label() != "<colorbar>"
    ]
    return np.ma.filled(heatmaps[panel].images[0].get_array(), np.nan)


def test_heatmap_is_the_pivoted_log2_rms(table: pd.DataFrame) -> None:
    figure = plot_scales_over_training(table, "activation_grad")
    rows = table[(table.kind == "activation_grad") & (table.statistic == "rms")]
    expected = rows.pivot(index="tensor", columns="step", values="value")
    expected = np.log2(expected.loc[MODULES, STEPS].to_numpy())
    np.testing.assert_array_equal(_grid(figure), expected)
    ax = figure.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == MODULES  # execution order
    labelled = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert set(labelled) <= {str(s) for s in STEPS} and labelled
    assert ax.get_title(loc="left") == "activation gradients"
    norm = ax.images[0].norm
    assert norm.vmin == -norm.vmax  # unit scale is the white middle


def test_gradients_keep_the_forward_order(table: pd.DataFrame) -> None:
    # as a monitor records them: each step's activations forward, then their
    # gradients in the backward pass
    steps = [
        part
        for _, rows in table[table.kind.str.startswith("activation")].groupby("step")
        for part in (
            rows[rows.kind == "activation"],
            rows[rows.kind != "activation"][::-1],
        )
    ]
    ax = plot_scales_over_training(pd.concat(steps), "activation_grad").axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == MODULES


def test_missing_zero_and_non_finite_cells_are_told_apart() -> None:
    table = pd.DataFrame(
        [
            (0, "a", "activation", "rms", 1.0),
            (0, "b", "activation", "rms", 0.0),
            (1, "a", "activation", "rms", math.nan),
            (1, "b", "activation", "rms", 4.0),
            (2, "b", "activation", "rms", math.inf),  # "a" not recorded at step 2
        ],
        columns=COLUMNS,
    )
    ax = plot_scales_over_training(table).axes[0]
    image = ax.images[0].get_array()
    assert image.mask.tolist() == [[False, True, True], [True, False, True]]
    assert image[0, 0] == 0 and image[1, 1] == 2
    zero, non_finite = (c.get_offsets().tolist() for c in ax.collections)
    assert zero == [[0, 1]]  # (column, row)
    assert non_finite == [[1, 0], [2, 1]]


def test_all_kinds_one_panel_each(table: pd.DataFrame, tmp_path: Path) -> None:
    path = tmp_path / "all.png"
    figure = plot_scales_over_training(table, "all", path, title="run")
    assert path.stat().st_size > 10_000
    titles = [
        ax.get_title(loc="left") for ax in figure.axes if ax.get_title(loc="left")
    ]
    assert titles == ["activations", "activation gradients", "weights", "updates"]
    weights = [t.get_text() for t in figure.axes[2].get_yticklabels()]
    assert weights == [f"{m}.weight" for m in MODULES]
    # each panel has its own colour scale, wide enough for its values
    assert _grid(figure, 3).min() >= figure.axes[3].images[0].norm.vmin


def test_a_hundred_rows_stay_readable() -> None:
    tensors = [f"layers.{i // 4}.op{i % 4}" for i in range(100)]
    table = pd.DataFrame(
        [(s, t, "activation", "rms", 1.5) for s in range(40) for t in tensors],
        columns=COLUMNS,
    )
    figure = plot_scales_over_training(table)
    labels = figure.axes[0].get_yticklabels()
    assert all(label.get_fontsize() >= 5.5 for label in labels)
    height_points = figure.get_figheight() * 72
    assert len(labels) * labels[0].get_fontsize() * 1.2 < height_points
    assert figure.get_figheight() <= 31
    steps = [t.get_text() for t in figure.axes[0].get_xticklabels() if t.get_text()]
    assert 3 <= len(steps) <= 15


def test_fp8_fractions_are_the_largest_and_median(table: pd.DataFrame) -> None:
    figure = plot_fp8_fractions_over_training(table)
    flushed = figure.axes[1]
    assert flushed.get_title(loc="left") == "E4M3: fraction flushed"
    rows = table[(table.statistic == "e4m3_flushed") & (table.kind == "activation")]
    largest, median = flushed.get_lines()[:2]
    assert largest.get_ydata().tolist() == rows.groupby("step").value.max().tolist()
    assert median.get_ydata().tolist() == rows.groupby("step").value.median().tolist()
    assert flushed.get_yscale() == "log"
    # saturation is zero throughout: no lines, a note naming the kinds
    saturated = figure.axes[0]
    assert saturated.get_lines() == []
    assert "zero at every step" in saturated.get_title(loc="right")
    assert "weights" in saturated.get_title(loc="right")


def test_fp8_fraction_zeros_sit_on_a_bottom_labelled_0() -> None:
    table = pd.DataFrame(
        [
            (step, "a", "activation_grad", f"e5m2_{what}", value)
            for step, value in ((0, 0.0), (1, 1e-3), (2, 0.0))
            for what in ("saturated", "flushed")
        ],
        columns=COLUMNS,
    )
    ax = plot_fp8_fractions_over_training(table, formats=["e5m2"]).axes[1]
    ydata = ax.get_lines()[0].get_ydata()
    assert ydata[1] == 1e-3 and ydata[0] == ydata[2] == pytest.approx(1e-4)
    assert ax.get_yticklabels()[0].get_text() == "0"
    assert ax.get_ylim()[0] < 1e-4


def test_fp8_fractions_need_the_format(table: pd.DataFrame) -> None:
    with pytest.raises(ValueError, match=r"fp16_saturated.*'e4m3', 'e5m2'"):
        plot_fp8_fractions_over_training(table, formats=["fp16"])


def test_csv_round_trip(table: pd.DataFrame, tmp_path: Path) -> None:
    path = tmp_path / "scales.csv"
    table.to_csv(path, index=False)
    pd.testing.assert_frame_equal(read_scales(path), table)
    # the plots read a path as well as a table
    np.testing.assert_array_equal(
        _grid(plot_scales_over_training(path)), _grid(plot_scales_over_training(table))
    )


def _write_tensorboard(table: pd.DataFrame, directory: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(directory))
    for step, tensor, kind, statistic, value in table.itertuples(index=False):
        writer.add_scalar(f"scales/{tensor}/{kind}/{statistic}", value, step)
        writer.add_scalar("loss", 1.0, step)  # not a scale: ignored
    writer.close()


def test_tensorboard_round_trip(table: pd.DataFrame, tmp_path: Path) -> None:
    _write_tensorboard(table, tmp_path / "run")
    for source in (tmp_path / "run", tmp_path):  # a folder holding one run too
        pd.testing.assert_frame_equal(read_scales(source), table)
    _write_tensorboard(table.head(6), tmp_path / "second")
    with pytest.raises(ValueError, match=r"several runs \['run', 'second'\]"):
        read_scales(tmp_path)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.csv", None, "does not exist; expected a CSV"),
        ("bad.csv", "step,tensor,value\n0,a,1.0\n", r"lacks the column\(s\) \['kind'"),
        ("bad_step.csv", "step,tensor,kind,statistic,value\nx,a,b,c,1\n", "integers"),
        ("scales.txt", "", "expected a .csv or .parquet"),
        ("empty_dir", "", "no TensorBoard event files"),
    ],
)
def test_read_errors_say_what_to_pass(
    name: str, content: str | None, message: str, tmp_path: Path
) -> None:
    path = tmp_path / name
    if name == "empty_dir":
        path.mkdir()
    elif content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=message):
        read_scales(path)


def test_readers_not_installed_name_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "scales.parquet").write_bytes(b"")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "events.out.tfevents.0").write_bytes(b"")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    reader = "tensorboard.backend.event_processing.event_accumulator"
    monkeypatch.setitem(sys.modules, reader, None)
    with pytest.raises(ImportError, match="needs pyarrow"):
        read_scales(tmp_path / "scales.parquet")
    with pytest.raises(ImportError, match=r'"torch-unit-scaling\[tensorboard\]"'):
        read_scales(tmp_path / "run")


def test_plot_errors(table: pd.DataFrame) -> None:
    with pytest.raises(ValueError, match=r"no 'rms' rows of kind 'weight_grad'"):
        plot_scales_over_training(table, "weight_grad")
    with pytest.raises(ValueError, match="lacks the column"):
        plot_scales_over_training(table.drop(columns="kind"))
    with pytest.raises(TypeError, match="expected a pandas DataFrame"):
        plot_fp8_fractions_over_training([1, 2])  # type: ignore[arg-type]


def _cli(*argv: str) -> tuple[int, str]:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = main(["monitor-plots", *argv])
    return status, printed.getvalue()


def test_cli_writes_the_pngs(table: pd.DataFrame, tmp_path: Path) -> None:
    table.to_csv(tmp_path / "scales.csv", index=False)
    status, printed = _cli(str(tmp_path / "scales.csv"), "--out", str(tmp_path / "a"))
    assert status == 0
    names = ["scales_activation.png", "scales_activation_grad.png"]
    names += ["scales_weight.png", "scales_update.png", "fp8_fractions.png"]
    assert printed.splitlines() == [f"wrote {tmp_path / 'a' / n}" for n in names]
    assert all((tmp_path / "a" / n).stat().st_size > 10_000 for n in names)

    _write_tensorboard(table, tmp_path / "log")
    out = tmp_path / "b"
    assert _cli(str(tmp_path / "log"), "--out", str(out), "--kind", "all")[0] == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "fp8_fractions.png",
        "scales_all.png",
    ]


def test_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["monitor-plots", str(tmp_path / "nothing.csv")]) == 2
    assert "does not exist" in capsys.readouterr().err
    only_rms = _table()
    only_rms[only_rms.statistic == "rms"].to_csv(tmp_path / "rms.csv", index=False)
    status, printed = _cli(str(tmp_path / "rms.csv"), "--out", str(tmp_path))
    assert status == 0
    assert "no fp8_fractions.png" in printed
