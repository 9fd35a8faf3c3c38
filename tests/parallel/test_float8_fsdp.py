"""FSDP2 on a model converted to real FP8: the same training as one process."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from torch import nn

import unit_scaling as uu
from unit_scaling.float8 import Float8Linear, convert_to_float8_training
from unit_scaling.parallel import fully_shard

from ._launch import once_per_session, run_distributed
from ._reference import LR, global_batches, lrs, make_model, tags, train

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]


def _fp8_model() -> nn.Module:
    return convert_to_float8_training(make_model())


def _run(model: nn.Module) -> dict[str, Any]:
    optimizer = uu.optim.AdamW(model.named_parameters(), lr=LR)
    result = train(model, optimizer, global_batches())
    return {**result, "lrs": lrs(optimizer), "tags": tags(model)}


def _sharded_run(rank: int, world_size: int) -> dict[str, Any]:
    warnings.filterwarnings("ignore", "FSDP2-wrapped module")
    model = _fp8_model()
    for layer in model.layers:  # type: ignore[union-attr]
        fully_shard(layer)
    fully_shard(model)
    converted = sum(isinstance(m, Float8Linear) for m in model.modules())
    try:
        convert_to_float8_training(model)
        refused = ""
    except ValueError as error:
        refused = str(error)
    return {**_run(model), "converted": converted, "refused": refused}


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest) -> Any:
    return once_per_session(
        request,
        "float8_fsdp",
        lambda: (_run(_fp8_model()), run_distributed(_sharded_run)),
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
        assert rank["losses"] == pytest.approx(reference["losses"], rel=1e-5)
        assert rank["tags"] == reference["tags"]
        assert rank["lrs"] == reference["lrs"]
    for name, expected in reference["grads"].items():
        off = ((ranks[0]["grads"][name] - expected).norm() / expected.norm()).item()
        assert off < 1e-5, (name, off)
