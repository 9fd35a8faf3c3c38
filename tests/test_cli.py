"""The command-line interface: ``demo`` and ``report`` on tiny settings."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from unit_scaling.app import demo
from unit_scaling.app.cli import main


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One tiny demo run through the CLI, shared by the demo tests."""
    out = tmp_path_factory.mktemp("demo")
    capture = io.StringIO()
    with contextlib.redirect_stdout(capture):
        status = main(
            [
                "demo",
                "--steps",
                "40",
                "--width",
                "32",
                "--layers",
                "1",
                "--out",
                str(out),
            ]
        )
    assert status == 0
    return out, capture.getvalue()


def test_demo_writes_plots_and_report(demo_run: tuple[Path, str]) -> None:
    out, printed = demo_run
    for name in ("loss_curves.png", "umup_scales.png", "report.md"):
        path = out / name
        assert path.exists() and path.stat().st_size > 500, name
    for parametrisation, precision in demo.VARIANTS:
        assert f"| {parametrisation} {precision} |" in printed
    report = (out / "report.md").read_text()
    assert "![validation loss](loss_curves.png)" in report
    assert "steps: 40" in report
    # the scale monitor's records, plots and alerts
    for name in (
        "scales_umup_fp32.png",
        "scales_sp_fp32.png",
        "fp8_fractions_sp_fp8.png",
    ):
        assert (out / name).stat().st_size > 500, name
        assert f"]({name})" in report
    assert "## What the scale monitor saw" in report
    assert "| SP FP32 |" in report.split("## What the scale monitor saw")[1]


def test_demo_losses_decrease(demo_run: tuple[Path, str]) -> None:
    _, printed = demo_run
    rows = [
        line
        for line in printed.splitlines()
        if line.startswith("| ")
        and line.split("|")[1].strip() in {f"{p} {q}" for p, q in demo.VARIANTS}
    ]
    assert len(rows) == len(demo.VARIANTS)
    for row in rows:
        _, name, train, validation_loss, tokens_per_second, _ = row.split("|")
        assert float(train) < 5.0, name
        # Untrained byte-level models start at ln(256) = 5.5 nats.
        assert float(validation_loss) < 5.0, name
        assert float(tokens_per_second.replace(",", "")) > 0, name


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--steps", "0"], "steps must be a positive integer"),
        (["demo", "--width", "30"], "width must be a multiple"),
        (["demo", "--lr-umup", "-1"], "lr_umup must be positive"),
        (["report", "hf:gpt3"], "unknown Hugging Face model 'hf:gpt3'"),
        (["report", "hf:gpt2:huge"], "size in ['tiny', 'small']"),
        (["report", "no_colon"], "expected package.module:factory"),
        (["report", "no_such_module_xyz:make"], "cannot import module"),
        (["report", "os:no_such_factory"], "has no 'no_such_factory'"),
        (["report", "os:getcwd"], "returned str; expected an nn.Module"),
    ],
)
def test_bad_arguments_give_clear_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_unknown_subcommand_and_missing_model_exit_with_usage() -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["train"])
    assert exit_info.value.code == 2
    with pytest.raises(SystemExit):
        main(["report"])


def test_report_on_hugging_face_config(tmp_path: Path) -> None:
    status = main(
        [
            "report",
            "hf:gpt2:tiny",
            "--batch-size",
            "2",
            "--seq-len",
            "16",
            "--out",
            str(tmp_path),
        ]
    )
    assert status == 0
    table = pd.read_csv(tmp_path / "scales.csv")
    assert set(table.version) == {"before", "after"}
    assert {"e4m3_overflow", "e5m2_underflow", "mean_abs"} <= set(table.columns)
    after = table[table.version == "after"]
    before = table[table.version == "before"]
    # unit_scale brings gradients up from the tiny values of a standard model.
    assert after[after.direction == "bwd"].mean_abs.median() > 10 * (
        before[before.direction == "bwd"].mean_abs.median()
    )
    for name in ("scales_before.png", "scales_after.png"):
        assert (tmp_path / name).stat().st_size > 1000
    assert "| before |" in (tmp_path / "report.md").read_text()


def test_report_on_a_factory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_models.py").write_text(
        "import unit_scaling as uu\n"
        "def make():\n"
        "    return uu.TransformerDecoder(32, 256, layers=1, heads=2)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "out"
    assert (
        main(
            [
                "report",
                "my_models:make",
                "--batch-size",
                "2",
                "--seq-len",
                "8",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert (out / "scales.csv").exists()


def test_console_script_and_module_entry_point() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "unit_scaling", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "demo" in result.stdout and "report" in result.stdout
