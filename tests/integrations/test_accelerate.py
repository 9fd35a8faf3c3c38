"""Accelerate loops with unit-scaled models: stock, and with
``unit_scaling.integrations.accelerate.Accelerator``; one process and two."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

import unit_scaling as uu
import unit_scaling.functional as U
from tests.integrations.models import (
    ROWS,
    accelerate_environment,
    accelerate_step,
    global_rows,
    grads,
    scaled,
    single_process_whole_batch,
    two_process_step,
    whole_batch_grads,
    worst_error,
)
from tests.parallel._launch import run_distributed
from unit_scaling.transforms import checkpoint_record, load_checkpoint_record

accelerate = pytest.importorskip("accelerate")
from unit_scaling.integrations.accelerate import (  # noqa: E402
    Accelerator,
    carries_step_share,
)

# One case of each claim in the default run; the rest under `integration`
# (tests/conftest.py).
DEFAULT_RUN = {
    "test_an_accelerate_loop_accumulates_to_the_whole_batch[2-mean]",
    "test_a_plain_model_keeps_accelerates_mean",
    "test_a_loss_carries_its_share_of_the_step",
    "test_clip_grad_rms_bounds_the_rms",
}


@pytest.fixture(autouse=True)
def _fresh_accelerate_state() -> Iterator[None]:
    """Accelerate keeps its state in process-wide singletons."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


@pytest.mark.parametrize("recipe", ["mean", "count"])
@pytest.mark.parametrize("k", [2, 4])
def test_an_accelerate_loop_accumulates_to_the_whole_batch(k: int, recipe: str) -> None:
    model = scaled("llama")
    rows = global_rows()
    model(input_ids=rows[:2], labels=rows[:2])  # calibrate once
    whole = whole_batch_grads(model, [rows[: ROWS // 2]])
    step = accelerate_step(
        Accelerator(cpu=True, gradient_accumulation_steps=k),
        model,
        rows[: ROWS // 2],
        ROWS // 2 // k,
        recipe,
    )
    error, where = worst_error(step, whole)
    assert error <= 1e-5, where


def test_the_stock_accelerator_leaves_a_mean_loop_k_to_the_minus_half_off() -> None:
    model = scaled("llama")
    rows = global_rows()[:8]
    whole = whole_batch_grads(model, [rows])
    step = accelerate_step(
        accelerate.Accelerator(cpu=True, gradient_accumulation_steps=4),
        model,
        rows,
        2,
        "mean",
    )
    ratio = step["lm_head.weight"].norm() / whole["lm_head.weight"].norm()
    assert float(ratio) == pytest.approx(0.5, rel=1e-4)


def test_the_stock_accelerator_follows_the_rule_with_hugging_faces_count_recipe() -> (
    None
):
    model = scaled("gpt2")
    rows = global_rows()[:8]
    whole = whole_batch_grads(model, [rows])
    step = accelerate_step(
        accelerate.Accelerator(cpu=True, gradient_accumulation_steps=2),
        model,
        rows,
        4,
        "count",
    )
    error, where = worst_error(step, whole)
    assert error <= 1e-5, where


def test_a_plain_model_keeps_accelerates_mean() -> None:
    torch.manual_seed(0)
    model = nn.Linear(8, 8)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = accelerator.prepare(model)
    x = torch.randn(4, 8)
    with accelerator.accumulate(model):
        accelerator.backward(model(x).pow(2).mean())
    plain = model.weight.grad.clone()  # type: ignore[union-attr]
    model.zero_grad()
    (model(x).pow(2).mean() / 2).backward()
    torch.testing.assert_close(plain, model.weight.grad)


def test_a_loss_carries_its_share_of_the_step() -> None:
    logits = torch.randn(4, 8, requires_grad=True)
    total = U.cross_entropy(logits, torch.randint(8, (4,)), reduction="sum")
    assert carries_step_share(U.step_mean(total, 4, 16) * 2 + 1)
    assert not carries_step_share(total * 2)
    assert not carries_step_share(U.micro_batch_loss(total / 4, 0.5))


def test_clip_grad_rms_bounds_the_rms() -> None:
    accelerator = Accelerator(cpu=True)
    weight = nn.Parameter(torch.zeros(100, 10))
    weight.grad = torch.full((100, 10), 3.0)
    rms = accelerator.clip_grad_rms_([weight], 1.5)
    assert float(rms) == pytest.approx(3.0)
    assert float(weight.grad.pow(2).mean().sqrt()) == pytest.approx(1.5, rel=1e-5)


# --- two processes ------------------------------------------------------------ #


@pytest.mark.distributed
@pytest.mark.parametrize("recipe", ["mean", "count"])
def test_two_processes_compute_one_process_gradients_on_the_global_batch(
    recipe: str,
) -> None:
    whole = single_process_whole_batch()
    ranks = run_distributed(two_process_step, recipe, 2)
    for step in ranks:
        error, where = worst_error(step, whole)
        assert error <= 1e-5, (where, error)


def _first_step(rank: int, world_size: int) -> dict[str, Any]:
    """One step of a ``unit_scale``d model that no call has calibrated, each
    process on its own half of :func:`global_rows`: the reduced gradients, and
    the weights and measurements of the model they belong to."""
    accelerate_environment(rank, world_size)
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(scaled("llama"))
    rows = global_rows().chunk(world_size)[rank]
    accelerator.backward(model(input_ids=rows, labels=rows).loss)
    inner = accelerator.unwrap_model(model)
    weights = {n: t.detach().clone() for n, t in inner.state_dict().items()}
    return {
        "grads": grads(inner),
        "weights": weights,
        "record": checkpoint_record(inner),
    }


@pytest.mark.distributed
def test_processes_calibrate_alike_at_their_first_call() -> None:
    """Their first batches differ; without a shared calibration the processes'
    scales differ by up to 25% and the reduced gradient belongs to no model."""
    ranks = run_distributed(_first_step)
    assert ranks[0]["record"] == ranks[1]["record"]
    model = scaled("llama")
    model.load_state_dict(ranks[0]["weights"])
    load_checkpoint_record(model, ranks[0]["record"])
    whole = whole_batch_grads(model, [global_rows()])
    for rank in ranks:
        error, where = worst_error(rank["grads"], whole)
        assert error <= 1e-5, (where, error)


def _fsdp2_step(rank: int, world_size: int) -> dict[str, Any]:
    """One step of a native u-μP decoder sharded by Accelerate's FSDP2 plugin.

    Accelerate turns its FSDP plugin on only for GPU-like devices (on a CPU it
    falls back to DDP, whatever the plugin says), so the test switches the
    state to FSDP after construction: ``prepare`` then runs Accelerate's own
    FSDP2 preparation (``fsdp2_prepare_model``: torch's ``fully_shard`` per
    ``TransformerLayer`` and on the root), on gloo."""
    accelerate_environment(rank, world_size)
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2,
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["TransformerLayer"],
    )
    accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
    accelerator.state.distributed_type = DistributedType.FSDP
    accelerator.state.fsdp_plugin = plugin
    model = _decoder()
    optimizer = uu.optim.AdamW(model.parameters(), lr=0.5)
    lrs = sorted(g["lr"] for g in optimizer.param_groups)
    model, optimizer = accelerator.prepare(model, optimizer)
    rows = global_rows()[:, :17]
    local = rows[rank * ROWS // world_size : (rank + 1) * ROWS // world_size]
    accelerator.backward(accelerator.unwrap_model(model).loss(local))
    return {
        "sharded": type(model).__name__,
        "tags": {n: getattr(p, "mup_type", None) for n, p in model.named_parameters()},
        "lrs": lrs == sorted(g["lr"] for g in optimizer.param_groups),
        "grads": {
            n: p.grad.full_tensor().detach() for n, p in model.named_parameters()
        },
    }


def _decoder() -> nn.Module:
    torch.manual_seed(0)
    return uu.TransformerDecoder(
        64, 256, layers=2, heads=4, **uu.RECOMMENDED.multipliers
    )


@pytest.mark.distributed
def test_fsdp2_through_accelerates_plugin_keeps_tags_and_the_rule() -> None:
    model = _decoder()
    model.loss(global_rows()[:, :17]).backward()
    whole = grads(model)
    tags = {n: p.mup_type for n, p in model.named_parameters()}  # type: ignore[attr-defined]
    for rank in run_distributed(_fsdp2_step):
        assert rank["sharded"].startswith("FSDP")
        assert rank["tags"] == tags
        assert rank["lrs"]
        error, where = worst_error(rank["grads"], whole)
        assert error <= 1e-5, (where, error)


def test_deepspeed_is_an_error() -> None:
    from accelerate.utils import DistributedType

    accelerator = Accelerator(cpu=True)
    accelerator.state.distributed_type = DistributedType.DEEPSPEED
    with pytest.raises(ValueError, match="DeepSpeed scales and reduces"):
        accelerator.prepare(scaled("llama"))
