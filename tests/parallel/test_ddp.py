"""DDP: a u-μP decoder trained on two processes matches one process, step by step."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel

import unit_scaling as uu
import unit_scaling.functional as U
from unit_scaling.parallel import allreduce_hook

from ._launch import once_per_session, run_distributed
from ._reference import (
    LR,
    global_batches,
    lrs,
    make_model,
    single_process_run,
    tags,
    train,
)

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]


def _ddp_run(rank: int, world_size: int, hook: bool) -> dict[str, Any]:
    model = make_model()
    ddp = DistributedDataParallel(model)
    if hook:
        ddp.register_comm_hook(None, allreduce_hook)
    optimizer = uu.optim.AdamW(model.named_parameters(), lr=LR)

    def loss_fn(batch: Tensor) -> Tensor:  # through the wrapper, so DDP syncs grads
        logits = ddp(batch[:, :-1])
        return U.cross_entropy(logits.flatten(end_dim=-2), batch[:, 1:].flatten())

    result = train(model, optimizer, global_batches(), loss_fn)
    return {**result, "lrs": lrs(optimizer), "tags": tags(ddp.module)}


def _both_reductions(rank: int, world_size: int) -> dict[str, Any]:
    return {
        "hook": _ddp_run(rank, world_size, True),
        "mean": _ddp_run(rank, world_size, False),
    }


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest) -> Any:
    return once_per_session(
        request,
        "ddp",
        lambda: (single_process_run(), run_distributed(_both_reductions)),
    )


def test_losses_match_a_single_process_run(runs: Any) -> None:
    reference, ranks = runs
    for rank in ranks:
        assert rank["hook"]["losses"] == pytest.approx(reference["losses"], rel=1e-5)
    assert reference["losses"][-1] < reference["losses"][0]  # it did train


def test_gradients_match_with_the_unit_scaled_hook(runs: Any) -> None:
    reference, ranks = runs
    for rank in ranks:
        for name, grad in reference["grads"].items():
            # (Kernels and all-reduce sum in different orders in the workers and
            # in the test process: up to ~4e-5 relative on a few elements.)
            torch.testing.assert_close(
                rank["hook"]["grads"][name], grad, rtol=1e-4, atol=1e-5
            )


def test_torch_mean_reduction_is_sqrt_world_size_too_small(runs: Any) -> None:
    # Why the hook exists: a unit-scaled gradient grows like sqrt(batch).
    reference, ranks = runs
    for name, grad in reference["grads"].items():
        mean = ranks[0]["mean"]["grads"][name]
        torch.testing.assert_close(mean * math.sqrt(2), grad, rtol=1e-4, atol=1e-5)
    # Adam does not see a constant gradient scale, so its losses still match.
    assert ranks[0]["mean"]["losses"] == pytest.approx(reference["losses"], rel=1e-5)


def test_tags_and_learning_rates_survive_ddp(runs: Any) -> None:
    reference, ranks = runs
    for rank in ranks:
        assert rank["hook"]["tags"] == reference["tags"]
        assert rank["hook"]["lrs"] == reference["lrs"]
    assert all(mup_type is not None for mup_type, *_ in reference["tags"].values())
