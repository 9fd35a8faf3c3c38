"""Distributed checkpoints of a sharded u-μP model resume training exactly."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

import unit_scaling as uu
from unit_scaling.parallel import fully_shard

from ._launch import once_per_session, run_distributed
from ._reference import (
    LR,
    checkpoint_state,
    full,
    global_batches,
    lrs,
    make_model,
    tags,
    train,
)

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

SAVED_AFTER = 3  # steps trained before the checkpoint; two more follow it


def _sharded(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = make_model(seed)  # no mesh: torch's default, all ranks
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    optimizer = uu.optim.AdamW(model.named_parameters(), lr=LR, weight_decay=2**-10)
    return model, optimizer


def _snapshot(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Everything that must be restored, gathered to full tensors."""
    options = StateDictOptions(full_state_dict=True)
    optim = get_optimizer_state_dict(model, optimizer, options=options)
    return {
        "params": {n: full(p) for n, p in model.named_parameters()},
        "optim_state": optim["state"],
        "param_groups": [
            {k: v for k, v in g.items() if k != "params"} for g in optim["param_groups"]
        ],
        "lrs": lrs(optimizer),
        "tags": tags(model),
    }


def _save_and_resume(rank: int, world_size: int, directory: str) -> dict[str, Any]:
    warnings.filterwarnings("ignore", "FSDP2-wrapped module")
    batches = global_batches(SAVED_AFTER + 2)

    model, optimizer = _sharded(seed=0)
    train(model, optimizer, batches[:SAVED_AFTER])
    dcp.save(checkpoint_state(model, optimizer), checkpoint_id=directory)
    saved = _snapshot(model, optimizer)
    continued = train(model, optimizer, batches[SAVED_AFTER:])
    continued_params = {n: full(p) for n, p in model.named_parameters()}

    fresh, fresh_optimizer = _sharded(seed=1)
    before_load = {n: full(p) for n, p in fresh.named_parameters()}
    state = checkpoint_state(fresh, fresh_optimizer)
    dcp.load(state, checkpoint_id=directory)
    set_model_state_dict(fresh, state["model"])
    set_optimizer_state_dict(fresh, fresh_optimizer, state["optim"])
    loaded = _snapshot(fresh, fresh_optimizer)
    resumed = train(fresh, fresh_optimizer, batches[SAVED_AFTER:])
    return {
        "saved": saved,
        "loaded": loaded,
        "before_load": before_load,
        "continued": continued["losses"],
        "resumed": resumed["losses"],
        "continued_params": continued_params,
        "resumed_params": {n: full(p) for n, p in fresh.named_parameters()},
    }


@pytest.fixture(scope="module")
def ranks(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> list[dict[str, Any]]:
    directory = tmp_path_factory.mktemp("checkpoint")
    return once_per_session(
        request, "checkpoint", lambda: run_distributed(_save_and_resume, str(directory))
    )


def test_the_fresh_model_started_different(ranks: list[dict[str, Any]]) -> None:
    saved, before = ranks[0]["saved"]["params"], ranks[0]["before_load"]
    assert not any(torch.equal(saved[n], before[n]) for n in saved)


def test_parameters_tags_and_learning_rates_are_restored(
    ranks: list[dict[str, Any]],
) -> None:
    for rank in ranks:
        saved, loaded = rank["saved"], rank["loaded"]
        for name, param in saved["params"].items():
            assert torch.equal(loaded["params"][name], param), name
        assert loaded["tags"] == saved["tags"]
        assert all(mup_type is not None for mup_type, *_ in loaded["tags"].values())
        assert loaded["lrs"] == saved["lrs"]
        assert loaded["param_groups"] == saved["param_groups"]


def test_optimizer_state_is_restored(ranks: list[dict[str, Any]]) -> None:
    for rank in ranks:
        saved, loaded = rank["saved"]["optim_state"], rank["loaded"]["optim_state"]
        assert saved.keys() == loaded.keys()
        for name, state in saved.items():
            assert state.keys() == {"step", "exp_avg", "exp_avg_sq"}
            for key, value in state.items():
                assert torch.equal(loaded[name][key], value), (name, key)


def test_resumed_training_repeats_the_next_steps_exactly(
    ranks: list[dict[str, Any]],
) -> None:
    for rank in ranks:
        assert rank["resumed"] == rank["continued"]
        for name, param in rank["continued_params"].items():
            assert torch.equal(rank["resumed_params"][name], param), name
