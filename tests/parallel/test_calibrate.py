"""A ``unit_scale`` output measures its scales at its first call, from that
call's batch: ``calibrate`` makes the measurement the same on every process."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from unit_scaling.parallel import allreduce_hook, calibrate, calibrate_at_first_call
from unit_scaling.transforms import checkpoint_record, unit_scale

from ._launch import run_distributed

VOCAB, WIDTH = 32, 16


class _Tagger(nn.Module):
    """Token ids in, a loss out: its gradient scales depend on the tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.mix = nn.Linear(WIDTH, WIDTH)
        self.out = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.out(torch.relu(self.mix(self.embed(ids))))
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def _model() -> nn.Module:
    torch.manual_seed(0)
    return unit_scale(_Tagger())


def _batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Skewed token counts, different on each process."""
    generator = torch.Generator().manual_seed(rank)
    ids = torch.randint(4 + 12 * rank, (4, 8), generator=generator)
    return ids, torch.randint(VOCAB, (4, 8), generator=generator)


def _first_step(rank: int, world_size: int, hooked: bool) -> dict[str, Any]:
    model = _model()
    if hooked:
        calibrate_at_first_call(model)
    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(None, allreduce_hook)
    ddp(*_batch(rank)).backward()
    return checkpoint_record(model)


@pytest.mark.distributed
def test_the_first_call_calibrates_on_process_0s_batch() -> None:
    alone = _model()
    calibrate(alone, *_batch(0))
    want = checkpoint_record(alone)
    for rank in run_distributed(_first_step, True):
        assert rank == want


@pytest.mark.distributed
def test_without_it_the_processes_measure_different_scales() -> None:
    first, second = run_distributed(_first_step, False)
    assert first["grad_scales"] != second["grad_scales"]


def test_the_hook_calls_once_more_at_the_first_call_only() -> None:
    model = _model()
    calls = []
    model.register_forward_pre_hook(lambda module, args: calls.append(len(args)))
    calibrate_at_first_call(model)
    calibrate_at_first_call(model)  # one hook, however often asked
    with torch.no_grad():
        model(*_batch(0))
        assert len(calls) == 2
        model(*_batch(1))
    assert len(calls) == 3
