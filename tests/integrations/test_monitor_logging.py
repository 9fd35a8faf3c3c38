"""The scale monitor's records reach TensorBoard and ``Trainer``'s reporters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import unit_scaling as uu
from tests.integrations.models import MODELS, Tokens, arguments
from unit_scaling.monitor import Monitor

pytest.importorskip("tensorboard")
transformers = pytest.importorskip("transformers")

from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)

from unit_scaling.integrations.hf import MonitorCallback, add_monitor  # noqa: E402
from unit_scaling.integrations.tensorboard import TensorBoardLogger  # noqa: E402

# The default run's share (tests/conftest.py): a Trainer run each way is ~4 s.
DEFAULT_RUN = [
    "test_a_tensorboard_event_file_receives_the_tags",
    "test_trainer_reporters_receive_the_tags[callbacks]",
]


def _scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)]
        for tag in events.Tags()["scalars"]
    }


def test_a_tensorboard_event_file_receives_the_tags(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(uu.Linear(8, 8), uu.GELU(), uu.Linear(8, 1))
    opt = uu.optim.AdamW(model.parameters(), lr=0.01)
    log = TensorBoardLogger(tmp_path)
    monitor = Monitor(model, every=2, optimizer=opt, loggers=[log], alerts=None)
    for _ in range(4):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
    log.close()
    scalars = _scalars(tmp_path)
    table = monitor.table()
    assert len(scalars) == len(table[table.step == 0])
    row = table[
        (table.tensor == "0")
        & (table.kind == "activation")
        & (table.statistic == "rms")
    ]
    got = scalars["scales/0/activation/rms"]
    assert [s for s, _ in got] == [0, 2]
    assert [v for _, v in got] == pytest.approx(row.value.tolist(), rel=1e-6)
    assert "scales/2.weight/update/relative_rms" in scalars


@pytest.mark.parametrize("added", ["callbacks", "add_monitor"])
def test_trainer_reporters_receive_the_tags(
    added: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TensorBoard's reporter runs before a user's callbacks: the scales must
    reach it all the same."""
    torch.manual_seed(0)
    model = MODELS["llama"]()
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "logs"))
    args = arguments(
        tmp_path,
        max_steps=4,
        learning_rate=1e-3,
        report_to=["tensorboard"],
        logging_steps=100,
    )
    options: dict[str, Any] = {"every": 2, "max_tensors": 3, "alerts": None}
    callbacks = [MonitorCallback(**options)] if added == "callbacks" else []
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=Tokens(), callbacks=callbacks
    )
    callback = callbacks[0] if callbacks else add_monitor(trainer, **options)
    trainer.train()
    scalars = _scalars(tmp_path / "logs")
    scales = {t: v for t, v in scalars.items() if t.startswith("train/scales/")}
    assert scales, sorted(scalars)
    assert callback.monitor is not None
    table = callback.monitor.table()
    assert sorted(set(table.step)) == [2, 4]  # Trainer's numbering
    for tag, values in scales.items():
        tensor, kind, statistic = tag.removeprefix("train/scales/").rsplit("/", 2)
        for step, value in values:
            row = table[
                (table.step == step)
                & (table.tensor == tensor)
                & (table.kind == kind)
                & (table.statistic == statistic)
            ]
            assert value == pytest.approx(float(row.value.iloc[0]), rel=1e-5)
    # the record's scalars are bounded: 3 tensors per kind
    assert table[table.step == 2].groupby("kind").tensor.nunique().max() == 3
