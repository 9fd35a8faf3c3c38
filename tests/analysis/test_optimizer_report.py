"""Tests for ``optimizer_report``: its numbers against u-μP's rules worked out by
hand on a small ``uu.TransformerDecoder``, a plain torch optimizer, names,
schedules, untagged parameters, bad input, and pandas staying optional."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import pandas as pd
import pytest
import torch
from torch import nn

import unit_scaling as uu
from unit_scaling.analysis import format_optimizer_report, optimizer_report
from unit_scaling.optim import lr_scale_func_adam, scaled_parameters

HIDDEN, VOCAB, LAYERS = 16, 32, 2
LR, DECAY = 0.5, 0.1


@pytest.fixture
def model() -> uu.TransformerDecoder:
    torch.manual_seed(0)
    return uu.TransformerDecoder(HIDDEN, VOCAB, layers=LAYERS, heads=2)


def _hand_computed(name: str) -> tuple[str, int, int | None, float]:
    """``(mup_type, fan_in, depth, lr_scale)`` of a parameter of the model above,
    from u-μP's Adam rule: a weight gets ``fan_in^-½``, times ``depth^-½`` inside
    the stack; the readout gets 1."""
    if name == "projection.weight":
        return "output", HIDDEN, None, 1.0
    if name == "embedding.weight":  # (vocab, hidden): fan-in is the width
        return "weight", HIDDEN, None, HIDDEN**-0.5
    fan_in = 4 * HIDDEN if name.endswith("linear_2.weight") else HIDDEN
    return "weight", fan_in, LAYERS, fan_in**-0.5 * LAYERS**-0.5


def test_u_mup_adamw_report_matches_the_rules(model: uu.TransformerDecoder) -> None:
    opt = uu.optim.AdamW(model.parameters(), lr=LR, weight_decay=DECAY)
    report = optimizer_report(opt, model)
    names = [name for name, _ in model.named_parameters()]
    assert report["name"].tolist() == names
    assert report["group"].tolist() == list(range(len(names)))
    assert report["shape"].tolist() == [tuple(p.shape) for p in model.parameters()]
    assert report["rule_applied"].all()
    for row in report.itertuples():
        mup_type, fan_in, depth, scale = _hand_computed(row.name)
        assert row.mup_type == mup_type, row.name
        assert row.fan_in == fan_in, row.name
        assert pd.isna(row.depth) if depth is None else row.depth == depth, row.name
        assert row.lr_scale == pytest.approx(scale), row.name
        assert row.lr == pytest.approx(LR * scale), row.name
        # Independent weight decay: the group's decay is λ / η_p, so each step
        # removes the fraction λ of every weight whatever its learning rate.
        assert row.weight_decay == pytest.approx(DECAY / (LR * scale)), row.name
        assert row.effective_weight_decay == pytest.approx(DECAY), row.name
    by_name = report.set_index("name")
    hidden = by_name.loc["layers.0.mhsa.linear_qkv.weight"]
    assert hidden.lr_scale == pytest.approx(1 / math.sqrt(HIDDEN * LAYERS))
    assert by_name.loc["projection.weight"].lr_scale == 1.0
    # The report reads what the optimizer holds: the lrs it will step with.
    assert report["lr"].tolist() == pytest.approx([g["lr"] for g in opt.param_groups])


def test_plain_torch_optimizer_shows_tags_but_no_rule(
    model: uu.TransformerDecoder,
) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=DECAY)
    report = optimizer_report(opt, model)
    assert len(report) == len(list(model.parameters()))
    assert not report["rule_applied"].any()
    assert (report["lr_scale"] == 1.0).all()
    assert (report["lr"] == LR).all()
    assert (report["group"] == 0).all()
    assert report["effective_weight_decay"].tolist() == pytest.approx(
        [LR * DECAY] * len(report)
    )
    for row in report.itertuples():
        mup_type, fan_in, depth, _ = _hand_computed(row.name)
        assert (row.mup_type, row.fan_in) == (mup_type, fan_in), row.name
        assert pd.isna(row.depth) if depth is None else row.depth == depth, row.name


def test_names_without_a_model(model: uu.TransformerDecoder) -> None:
    opt = uu.optim.Adam(model.parameters(), lr=LR)
    names = optimizer_report(opt)["name"].tolist()
    assert names == [f"group{i}.param0" for i in range(len(names))]
    # Named parameters given to the optimizer name the rows themselves.
    named = uu.optim.Adam(model.named_parameters(), lr=LR)
    assert optimizer_report(named)["name"].tolist() == [
        n for n, _ in model.named_parameters()
    ]
    plain = torch.optim.SGD(model.parameters(), lr=LR)
    assert optimizer_report(plain)["name"].tolist()[:2] == [
        "group0.param0",
        "group0.param1",
    ]


def test_lr_follows_a_schedule_and_the_scale_stays(
    model: uu.TransformerDecoder,
) -> None:
    opt = uu.optim.AdamW(model.parameters(), lr=torch.tensor(LR))
    before = optimizer_report(opt, model)
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5**step)
    opt.step()
    scheduler.step()
    after = optimizer_report(opt, model)
    assert after["lr"].tolist() == pytest.approx((before["lr"] / 2).tolist())
    assert after["lr_scale"].tolist() == before["lr_scale"].tolist()
    assert after["lr"].dtype == float


def test_untagged_parameters_keep_the_base_lr() -> None:
    model = nn.Sequential(uu.Linear(8, 8), nn.Linear(8, 4))
    with pytest.warns(UserWarning, match="no u-μP tags"):
        opt = uu.optim.Adam(
            model.parameters(), lr=LR, allow_non_unit_scaling_params=True
        )
    report = optimizer_report(opt, model).set_index("name")
    assert report["rule_applied"].to_dict() == {
        "0.weight": True,
        "1.weight": False,
        "1.bias": False,
    }
    assert report.loc["0.weight", "lr_scale"] == pytest.approx(8**-0.5)
    assert report.loc["1.weight", "lr_scale"] == 1.0
    assert report.loc["1.weight", "lr"] == LR
    assert pd.isna(report.loc["1.weight", "mup_type"])
    assert report.loc["1.bias", "fan_in"] == 4  # a 1-D parameter: shape[0]


def test_groups_scaled_again_record_fresh_scales(
    model: uu.TransformerDecoder,
) -> None:
    opt = uu.optim.Adam(model.parameters(), lr=LR)
    again = scaled_parameters(opt.param_groups, lr_scale_func_adam)
    expected = [lr_scale_func_adam(p) for p in model.parameters()]
    assert [g["mup_lr_scale"] for g in again] == pytest.approx(expected)


def test_format_is_a_plain_text_table(model: uu.TransformerDecoder) -> None:
    opt = uu.optim.AdamW(model.parameters(), lr=LR, weight_decay=DECAY)
    text = format_optimizer_report(optimizer_report(opt, model))
    lines = text.splitlines()
    assert lines[0].split() == [
        "name",
        "group",
        "shape",
        "mup_type",
        "fan_in",
        "depth",
        "lr_scale",
        "lr",
        "weight_decay",
        "effective_weight_decay",
        "rule_applied",
    ]
    assert len(lines) == 1 + len(list(model.parameters()))
    readout = next(line for line in lines if "projection.weight" in line)
    assert readout.split()[-6:] == ["<NA>", "1", "0.5", "0.2", "0.1", "True"]


def test_bad_input_is_a_type_error(model: uu.TransformerDecoder) -> None:
    with pytest.raises(
        TypeError,
        match=r"optimizer must be a torch\.optim\.Optimizer, got TransformerDecoder",
    ):
        optimizer_report(model)  # type: ignore[arg-type]
    opt = uu.optim.Adam(model.parameters(), lr=LR)
    with pytest.raises(TypeError, match=r"model must be an nn\.Module.*got Adam"):
        optimizer_report(opt, opt)  # type: ignore[arg-type]


def test_pandas_stays_optional() -> None:
    script = textwrap.dedent(
        """
        import sys
        import unit_scaling as uu
        import unit_scaling.analysis as analysis
        print("pandas imported", "pandas" in sys.modules)
        sys.modules["pandas"] = None
        opt = uu.optim.Adam(uu.Linear(4, 4).parameters(), lr=1.0)
        try:
            analysis.optimizer_report(opt)
        except ImportError as error:
            print("ImportError", "torch-unit-scaling[plot]" in str(error))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["pandas imported False", "ImportError True"]


def test_a_weight_stored_in_out_shows_its_tagged_fan_in() -> None:
    stored = uu.Parameter(torch.randn(32, 8), "weight", mup_fan_in=32)  # (in, out)
    model = nn.Module()
    model.proj = stored
    report = optimizer_report(uu.optim.Adam(model.parameters(), lr=LR), model)
    row = report.set_index("name").loc["proj"]
    assert row["fan_in"] == 32  # the tag, not shape[1] = 8
    assert row["lr_scale"] == pytest.approx(32**-0.5)
