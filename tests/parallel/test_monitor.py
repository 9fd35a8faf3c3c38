"""The scale monitor on two processes: each record is that of the global batch."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from unit_scaling.monitor import Monitor

from ._launch import run_distributed

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

ROWS, WIDTH = 8, 16


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(WIDTH, 32), nn.GELU(), nn.Linear(32, 4))


def _batch() -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(ROWS, WIDTH, generator=g), torch.randn(ROWS, 4, generator=g)


def _records(model: nn.Module, forward: nn.Module, x: Tensor, y: Tensor) -> Any:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = Monitor(forward, every=1, optimizer=opt, alerts=None)
    nn.functional.mse_loss(forward(x), y).backward()
    opt.step()
    table = monitor.table()
    return {
        (row.tensor, row.kind, row.statistic): row.value for row in table.itertuples()
    }


def _rank(rank: int, world_size: int) -> Any:
    model = _model()
    x, y = _batch()
    share = slice(rank * ROWS // world_size, (rank + 1) * ROWS // world_size)
    return _records(model, DistributedDataParallel(model), x[share], y[share])


def test_two_processes_record_the_global_batch() -> None:
    ranks = run_distributed(_rank)
    model = _model()
    one = _records(model, model, *_batch())
    assert ranks[0] == ranks[1]  # every process holds the same record
    two = ranks[0]
    assert set(two) == set(one)
    for key, value in one.items():
        _, kind, _ = key
        if kind == "activation_grad":
            continue  # each process's own loss: see below
        assert two[key] == pytest.approx(value, rel=1e-5, abs=1e-12), key
    # A process's activation gradients are those of its own loss, the mean over
    # its half of the batch: twice the global mean's.
    for tensor in ("0", "1", "2"):
        key = (tensor, "activation_grad", "rms")
        assert two[key] == pytest.approx(2 * one[key], rel=1e-5)
