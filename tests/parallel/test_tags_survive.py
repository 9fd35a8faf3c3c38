"""u-μP tags survive the ways torch replaces or wraps parameters (one process).

DDP and FSDP2 are covered with real process groups in ``test_ddp.py`` and
``test_fsdp.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn

import unit_scaling as uu
from unit_scaling.data import VOCAB_SIZE

from ._reference import (
    HEADS,
    LAYERS,
    LR,
    WIDTH,
    lrs,
    make_model,
    tags,
)


@pytest.fixture
def swap_mode() -> Iterator[None]:
    """torch's opt-in mode where conversions swap tensors into the same objects."""
    old = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    yield
    torch.__future__.set_swap_module_params_on_conversion(old)


def _built_on_meta() -> nn.Module:
    with torch.device("meta"):
        return uu.TransformerDecoder(WIDTH, VOCAB_SIZE, LAYERS, HEADS)


def _load_assign(model: nn.Module) -> nn.Module:
    model.load_state_dict(make_model().state_dict(), assign=True)
    return model


CONVERSIONS: dict[str, Callable[[], nn.Module]] = {
    "to(meta)": lambda: make_model().to("meta"),
    "meta, to_empty": lambda: _built_on_meta().to_empty(device="cpu"),
    "to(meta), to_empty": lambda: make_model().to("meta").to_empty(device="cpu"),
    "meta, load_state_dict(assign=True)": lambda: _load_assign(_built_on_meta()),
}


@pytest.mark.parametrize("convert", CONVERSIONS.values(), ids=CONVERSIONS.keys())
def test_conversions_that_replace_parameters_keep_tags(convert: Any) -> None:
    expected = tags(make_model())
    model = convert()
    assert tags(model) == expected
    assert all(type(p) is uu.Parameter for p in model.parameters())
    assert lrs(uu.optim.AdamW(model.named_parameters(), lr=LR)) == lrs(
        uu.optim.AdamW(make_model().named_parameters(), lr=LR)
    )


@pytest.mark.usefixtures("swap_mode")
@pytest.mark.parametrize(
    "convert",
    [lambda m: m.to(torch.float64), lambda m: m.to("meta")],
    ids=["to(float64)", "to(meta)"],
)
def test_swap_mode_keeps_tags_and_parameter_objects(convert: Any) -> None:
    model = make_model()
    expected, objects = tags(model), list(model.parameters())
    convert(model)
    assert tags(model) == expected
    assert all(p is q for p, q in zip(model.parameters(), objects, strict=True))
    assert all(type(p) is uu.Parameter for p in model.parameters())


MODULES: dict[str, Callable[[], nn.Module]] = {
    "Linear": lambda: uu.Linear(4, 8, bias=True),
    "LinearReadout": lambda: uu.LinearReadout(4, 8),
    "Conv1d": lambda: uu.Conv1d(4, 8, 3, bias=True),
    "LayerNorm": lambda: uu.LayerNorm(4, elementwise_affine=True),
    "RMSNorm": lambda: uu.RMSNorm(4, elementwise_affine=True),
    "Embedding": lambda: uu.Embedding(10, 4),
    "DepthSequential": lambda: uu.DepthSequential(uu.Linear(4, 4), uu.Linear(4, 4)),
}


@pytest.mark.parametrize("make", MODULES.values(), ids=MODULES.keys())
def test_every_module_owning_parameters_keeps_tags(make: Any) -> None:
    module = make()
    expected = tags(module)
    assert all(mup_type is not None for mup_type, *_ in expected.values())
    module.to("meta").to_empty(device="cpu")
    assert tags(module) == expected


def test_torch_compile_keeps_tags() -> None:
    # The compiled wrapper holds the same parameter objects under "_orig_mod.".
    model = make_model()
    compiled = torch.compile(model)
    assert tags(compiled) == {f"_orig_mod.{n}": t for n, t in tags(model).items()}
    optimizer = uu.optim.AdamW(compiled.parameters(), lr=LR)
    expected = uu.optim.AdamW(model.parameters(), lr=LR)
    assert [g["lr"] for g in optimizer.param_groups] == [
        g["lr"] for g in expected.param_groups
    ]


class _StoredInOut(nn.Module):
    """A unit-scaled layer beside a weight stored ``(in, out)``: all three tags set."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = uu.Linear(8, 8)
        self.proj = uu.Parameter(torch.randn(8, 16), "weight", 2, mup_fan_in=8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) @ self.proj


@pytest.fixture
def one_process_group() -> Iterator[None]:
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.usefixtures("one_process_group")
def test_fully_shard_keeps_every_tag_the_fan_in_too() -> None:
    from unit_scaling.parallel import fully_shard

    model = _StoredInOut()
    expected = tags(model)
    lr = lrs(uu.optim.AdamW(model.named_parameters(), lr=LR))
    fully_shard(model)
    assert type(model.proj).__name__ == "DTensor"  # replaced: the tags re-attached
    assert tags(model) == expected and expected["proj"] == ("weight", 2, 8)
    assert lrs(uu.optim.AdamW(model.named_parameters(), lr=LR)) == lr
    assert lr["proj"] == LR / (8**0.5 * 2**0.5)  # the fan-in tag, not shape[1] = 16


def test_a_weight_gathered_in_fp8_keeps_every_tag() -> None:
    from unit_scaling.float8 import convert_to_float8_training
    from unit_scaling.parameter import retag

    layer = convert_to_float8_training(nn.Sequential(uu.Linear(16, 16)))[0]
    retag(layer.weight, "weight", 3, 16)
    before = tags(layer)
    layer.fsdp_prepare_parameters()  # what fully_shard calls before sharding
    assert type(layer.weight.data).__name__ == "_FSDPFloat8Weight"
    assert tags(layer) == before and before["weight"] == ("weight", 3, 16)
