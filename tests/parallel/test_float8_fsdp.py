"""FSDP2 on a model converted to real FP8: the same training as one process."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    set_model_state_dict,
    set_optimizer_state_dict,
)

import unit_scaling as uu
from unit_scaling.float8 import Float8Linear, convert_to_float8_training
from unit_scaling.float8._fsdp import _FSDPFloat8Weight
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


def _fp8_model() -> nn.Module:
    return convert_to_float8_training(make_model())


def _run(model: nn.Module) -> dict[str, Any]:
    optimizer = uu.optim.AdamW(model.named_parameters(), lr=LR)
    result = train(model, optimizer, global_batches())
    return {**result, "lrs": lrs(optimizer), "tags": tags(model)}


def _sharded(seed: int = 0) -> nn.Module:
    model = convert_to_float8_training(make_model(seed))
    for layer in model.layers:  # type: ignore[union-attr]
        fully_shard(layer)
    fully_shard(model)
    return model


def _checkpoint(directory: str) -> dict[str, Any]:
    """Train 3 steps, save with DCP, train 2 more; a fresh model loads the
    checkpoint and trains the same 2 steps."""
    batches = global_batches(5)
    model = _sharded()
    optimizer = uu.optim.AdamW(model.named_parameters(), lr=LR)
    train(model, optimizer, batches[:3])
    state = checkpoint_state(model, optimizer)
    saved_dtypes = {
        name: value.dtype for name, value in state["model"].items() if "weight" in name
    }
    dcp.save(state, checkpoint_id=directory)
    continued = train(model, optimizer, batches[3:])
    fresh = _sharded(seed=1)
    fresh_optimizer = uu.optim.AdamW(fresh.named_parameters(), lr=LR)
    state = checkpoint_state(fresh, fresh_optimizer)
    dcp.load(state, checkpoint_id=directory)
    set_model_state_dict(fresh, state["model"])
    set_optimizer_state_dict(fresh, fresh_optimizer, state["optim"])
    resumed = train(fresh, fresh_optimizer, batches[3:])
    return {
        "saved_dtypes": saved_dtypes,
        "continued": continued["losses"],
        "resumed": resumed["losses"],
        "same_params": all(
            torch.equal(full(p), full(q))
            for p, q in zip(model.parameters(), fresh.parameters(), strict=True)
        ),
    }


def _sharded_run(rank: int, world_size: int, directory: str) -> dict[str, Any]:
    warnings.filterwarnings("ignore", "FSDP2-wrapped module")
    model = _sharded()
    converted = sum(isinstance(m, Float8Linear) for m in model.modules())
    # What the layer sees while it runs, and what FSDP2 all-gathers.
    seen: dict[str, Any] = {}
    layer = model.layers[0].mlp.linear_1  # type: ignore[index,union-attr]

    def record_weight(module: nn.Module, args: Any) -> None:
        seen.setdefault("weight", type(module.weight.data).__name__)

    layer.register_forward_pre_hook(record_weight)
    pre_all_gather = _FSDPFloat8Weight.fsdp_pre_all_gather

    def recording(
        self: Any, mesh: Any, size: Any, stride: Any, module: Any, policy: Any
    ) -> Any:  # (FSDP2 reads the signature)
        inputs, metadata = pre_all_gather(self, mesh, size, stride, module, policy)
        seen.setdefault("gathered", set()).update(str(t.dtype) for t in inputs)
        return inputs, metadata

    _FSDPFloat8Weight.fsdp_pre_all_gather = recording  # type: ignore[method-assign]
    try:
        convert_to_float8_training(model)
        refused = ""
    except ValueError as error:
        refused = str(error)
    result = _run(model)
    _FSDPFloat8Weight.fsdp_pre_all_gather = pre_all_gather  # type: ignore[method-assign]
    return {
        **result,
        "seen": {"weight": seen["weight"], "gathered": sorted(seen["gathered"])},
        "converted": converted,
        "refused": refused,
        "checkpoint": _checkpoint(directory),
    }


@pytest.fixture(scope="module")
def runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Any:
    directory = str(tmp_path_factory.mktemp("float8_checkpoint"))
    return once_per_session(
        request,
        "float8_fsdp",
        lambda: (_run(_fp8_model()), run_distributed(_sharded_run, directory)),
    )


def test_the_layers_stay_fp8_after_sharding(runs: Any) -> None:
    _, ranks = runs
    # 5 per layer (qkv, output, up, gate, down) in 2 layers; the readout is a
    # Float8LinearReadout.
    assert all(rank["converted"] == 10 for rank in ranks)
    # Converting after sharding would be too late: refused, with the order.
    assert all("convert it first, then shard" in rank["refused"] for rank in ranks)


def test_sharded_fp8_training_matches_one_process(runs: Any) -> None:
    reference, ranks = runs
    for rank in ranks:
        # The weights travel as FP8 bytes and reach the layer as FP8 values:
        # the values a cast inside the layer would give, so the same training.
        assert rank["seen"]["weight"] == "_GatheredFloat8"
        assert rank["seen"]["gathered"] == ["torch.uint8"]
        assert rank["losses"] == pytest.approx(reference["losses"], rel=1e-5)
        assert rank["tags"] == reference["tags"]
        assert rank["lrs"] == reference["lrs"]
    for name, expected in reference["grads"].items():
        off = ((ranks[0]["grads"][name] - expected).norm() / expected.norm()).item()
        assert off < 1e-5, (name, off)


def test_a_checkpoint_keeps_float32_masters_and_resumes_exactly(runs: Any) -> None:
    _, ranks = runs
    for rank in ranks:
        checkpoint = rank["checkpoint"]
        assert set(checkpoint["saved_dtypes"].values()) == {torch.float32}
        assert checkpoint["resumed"] == checkpoint["continued"]
        assert checkpoint["same_params"]
