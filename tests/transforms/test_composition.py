"""Transforms applied one after another, and transformed modules copied, saved,
trained and moved."""

from __future__ import annotations

import copy
import dataclasses
import io
import logging
import pickle

import pytest
import torch
from torch import Tensor, nn

import unit_scaling.functional as U
from tests.helpers import unit_backward
from tests.transforms.models import CASES, MLP
from unit_scaling.transforms import compile, simulate_fp8, track_scales, unit_scale
from unit_scaling.transforms._capture.engine import (
    Place,
    Transform,
    TransformedForward,
    apply_transform,
    transform_state,
)
from unit_scaling.transforms._capture.library import (
    CallReplacement,
    LibraryRewrite,
    Prepared,
    attention_weights,
)

NANOGPT = CASES["nanogpt"]


def _is_quantiser(node: torch.fx.Node) -> bool:
    return getattr(node.target, "__name__", "").startswith("quantise_")


def test_track_scales_of_unit_scale() -> None:
    model = track_scales(unit_scale(NANOGPT.make()))
    reference = unit_scale(NANOGPT.make())
    out = NANOGPT.run(model)
    torch.testing.assert_close(out, NANOGPT.run(reference))
    unit_backward(out)
    graph = model.scales_graph()
    residual_adds = [n for n in graph.nodes if n.target is U.residual_add]
    assert len(residual_adds) == 4
    assert all(n.meta["metrics"].bwd is not None for n in residual_adds)


def test_track_scales_of_simulate_fp8_of_unit_scale() -> None:
    model = track_scales(simulate_fp8(unit_scale(NANOGPT.make())))
    reference = simulate_fp8(unit_scale(NANOGPT.make()))
    out = NANOGPT.run(model)
    torch.testing.assert_close(out, NANOGPT.run(reference))
    unit_backward(out)
    graph = model.scales_graph()
    quantisers = [n for n in graph.nodes if _is_quantiser(n)]
    assert quantisers
    assert U.residual_add in {n.target for n in graph.nodes}


@pytest.mark.parametrize(
    "order",
    [
        "unit_scale(simulate_fp8(m))",
        "track_scales(unit_scale(simulate_fp8(m)))",
    ],
)
def test_unit_scaling_runs_before_quantisation(
    order: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="unit_scaling.transforms")
    expected_model = simulate_fp8(unit_scale(NANOGPT.make()))
    if order.startswith("track_scales"):
        model = track_scales(unit_scale(simulate_fp8(NANOGPT.make())))
    else:
        model = unit_scale(simulate_fp8(NANOGPT.make()))
    # Same seed, same weights: the reordered chain computes the same function.
    torch.testing.assert_close(NANOGPT.run(model), NANOGPT.run(expected_model))
    messages = [r.getMessage() for r in caplog.records]
    # The reference library's wording, which users grep logs for.
    assert "moving unit scaling backend to precede quantisation backend" in messages
    unit_scaling = messages.index("running unit scaling backend")
    quantising = messages.index("running quantisation backend")
    assert unit_scaling < quantising


def test_unit_scale_is_idempotent() -> None:
    once = unit_scale(CASES["mlp"].make())
    twice = unit_scale(unit_scale(CASES["mlp"].make()))
    x = torch.randn(8, 32)
    torch.testing.assert_close(twice(x), once(x))


# --------------------------------------------------------------------------- #
# Copying and saving.
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "transform",
    [unit_scale, simulate_fp8, lambda m: simulate_fp8(unit_scale(m))],
    ids=["unit_scale", "simulate_fp8", "both"],
)
def test_deepcopy_is_independent(transform) -> None:  # type: ignore[no-untyped-def]
    model = transform(NANOGPT.make())
    expected = NANOGPT.run(model).detach()
    copied = copy.deepcopy(model)
    torch.testing.assert_close(NANOGPT.run(copied), expected)
    with torch.no_grad():
        for p in copied.parameters():
            p.add_(1.0)
    assert not torch.allclose(NANOGPT.run(copied), expected)
    torch.testing.assert_close(NANOGPT.run(model), expected)
    assert all(
        a.data_ptr() != b.data_ptr()
        for a, b in zip(model.parameters(), copied.parameters(), strict=True)
    )


def test_deepcopy_of_tracked_module_tracks_itself() -> None:
    model = track_scales(MLP())
    copied = copy.deepcopy(model)
    x = torch.randn(8, 32)
    copied(x)
    model(10 * x)

    def input_scale(m: nn.Module) -> float:
        graph = m.scales_graph()
        [node] = [n for n in graph.nodes if n.meta.get("clean_name") == "x"]
        return float(node.meta["metrics"].fwd.mean_abs)

    assert input_scale(model) == pytest.approx(10 * input_scale(copied), rel=1e-5)


@pytest.mark.parametrize("save", ["pickle", "torch.save"])
def test_pickling_raises_clear_type_error(save: str) -> None:
    model = unit_scale(MLP())
    with pytest.raises(TypeError, match="state_dict"):
        if save == "pickle":
            pickle.dumps(model)
        else:
            torch.save(model, io.BytesIO())


def test_state_dict_round_trip() -> None:
    source = unit_scale(NANOGPT.make())
    with torch.no_grad():
        for p in source.parameters():
            p.mul_(1.5)
    target = unit_scale(NANOGPT.make(seed=1))
    target.load_state_dict(source.state_dict())
    torch.testing.assert_close(NANOGPT.run(target), NANOGPT.run(source))
    # ... and into the untransformed architecture.
    plain = NANOGPT.make()
    plain.load_state_dict(source.state_dict())
    for name, value in plain.state_dict().items():
        assert torch.equal(value, source.state_dict()[name]), name


# --------------------------------------------------------------------------- #
# Using a transformed module like any other.
# --------------------------------------------------------------------------- #


def test_training_steps_use_updated_parameters() -> None:
    model = unit_scale(NANOGPT.make())
    optimiser = torch.optim.SGD(model.parameters(), lr=0.05)
    args, _ = NANOGPT.inputs(0)
    losses = []
    for _ in range(4):
        _, loss = model(*args, targets=args[0])
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_train_eval_and_dtype_switches() -> None:
    class Dropout(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(32, 32)
            self.drop = nn.Dropout(0.5)

        def forward(self, x: Tensor) -> Tensor:
            return self.drop(self.fc(x))

    model = unit_scale(Dropout())
    x = torch.randn(16, 32)
    trained = model(x)
    assert (trained == 0).any()
    model.eval()
    evaluated = model(x)
    expected = U.linear(x, model.fc.weight, model.fc.bias, constraint=None)
    torch.testing.assert_close(evaluated, expected)
    model.double()
    assert model(x.double()).dtype == torch.float64
    torch.testing.assert_close(model(x.double()).float(), expected)


# --------------------------------------------------------------------------- #
# The engine: places, frozen configuration, run-time state.
# --------------------------------------------------------------------------- #


def test_chain_is_ordered_by_place_not_by_name() -> None:
    # A transform of our own, named like none of ours, placed to observe.
    seen: list[str] = []

    def observe(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
        seen.append("observe")
        return gm

    observer = Transform(name="zzz", place=Place.OBSERVE, graph_pass=observe)
    model = unit_scale(apply_transform(nn.Linear(4, 4), observer))
    config = transform_state(model).config  # type: ignore[union-attr]
    assert [t.place for t in config.transforms] == [Place.REWRITE, Place.OBSERVE]
    model(torch.randn(2, 4))
    assert seen == ["observe"]


def test_transform_configuration_is_frozen() -> None:
    transform = Transform(name="x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        transform.name = "y"  # type: ignore[misc]


def test_backend_after_eager_transform_is_an_error() -> None:
    with pytest.raises(ValueError, match="cannot follow track_scales"):
        compile(track_scales(nn.Linear(4, 4)))


def test_engine_takes_the_module_through_each_stage_once() -> None:
    # copy -> prepare (the library rewrite) -> chain -> install -> set up, all
    # inside the one apply_transform call, on the copy only.
    class Opaque(nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            return x * 2

    calls: list[tuple[nn.Module, object, frozenset[type[nn.Module]]]] = []

    def setup(module: nn.Module, state: object, prepared: Prepared) -> None:
        calls.append((module, state, prepared.matched))
        # set up sees the prepared copy, its forward already installed
        assert isinstance(module[1], CallReplacement)
        assert isinstance(module.forward, TransformedForward)

    original = nn.Sequential(nn.Linear(4, 4), Opaque(), nn.MultiheadAttention(4, 1))
    transform = Transform(
        name="x",
        rewrite=LibraryRewrite(((Opaque, lambda x: x + 1),)),
        setup=setup,
    )
    model = apply_transform(original, transform)
    assert len(calls) == 1
    module, state, matched = calls[0]
    assert module is model and state is transform_state(model)
    assert matched == {Opaque}
    # the user's module is untouched; the copy is rewritten
    assert isinstance(original[1], Opaque)
    assert isinstance(original[2], nn.MultiheadAttention)
    assert type(model[2]).__name__ == "AttentionFunctions"
    assert "forward" not in original.__dict__
    # what the rewrite found to keep whole joined the chain's opaque functions
    assert attention_weights in state.config.non_recurse  # type: ignore[attr-defined]
    assert attention_weights not in transform.non_recurse


def test_chain_is_checked_before_the_module_is_copied() -> None:
    copies = 0

    class Counted(nn.Linear):
        def __deepcopy__(self, memo: dict[int, object]) -> Counted:
            nonlocal copies
            copies += 1
            return self

    with pytest.raises(ValueError, match="cannot follow track_scales"):
        compile(track_scales(Counted(4, 4)))
    assert copies == 1  # track_scales' copy; compile's check came first


def test_copies_start_with_fresh_run_state() -> None:
    model = unit_scale(nn.Linear(4, 4))
    model(torch.randn(2, 4))
    state = transform_state(model)
    assert state is not None and state.captures
    copied = copy.deepcopy(model)
    copied_state = transform_state(copied)
    assert copied_state is not None and copied_state is not state
    assert not copied_state.captures and copied_state.config is state.config
    torch.testing.assert_close(copied(torch.ones(2, 4)), model(torch.ones(2, 4)))


def test_stacked_transform_keeps_what_unit_scale_initialised() -> None:
    # The weights unit_scale initialised are not initialised again when a
    # later transform captures afresh.
    scaled = unit_scale(nn.Linear(8, 8))
    scaled(torch.randn(2, 8))
    weight = scaled.weight.detach().clone()
    tracked = track_scales(scaled)
    tracked(torch.randn(2, 8))
    torch.testing.assert_close(tracked.weight, weight)
