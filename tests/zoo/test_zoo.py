"""Tests for ``unit_scaling.zoo``: every model builds, runs both shape sets plainly
and backpropagates; inputs are deterministic in the seed; the registry covers
every family and answers bad names with the valid ones."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, get_args

import pytest
import torch
from torch import Tensor, nn

from unit_scaling import zoo

FAMILIES = get_args(zoo.Family)


def _entries(*, mark_slow: bool = False) -> list[Any]:
    return [
        pytest.param(
            entry, id=entry.name, marks=[pytest.mark.slow] * (mark_slow and entry.slow)
        )
        for entry in zoo.MODELS.values()
    ]


def _require(entry: zoo.ZooModel) -> None:
    if not entry.available():
        needs = ", ".join(entry.requires)
        pytest.skip(
            f"{entry.name} needs {needs}: pip install 'torch-unit-scaling[zoo]'"
        )


def _tensors(inputs: zoo.Inputs) -> list[Tensor]:
    args, kwargs = inputs
    return [v for v in (*args, *kwargs.values()) if isinstance(v, Tensor)]


@pytest.mark.parametrize("entry", _entries(mark_slow=True))
def test_model_runs_both_variants_and_backpropagates(entry: zoo.ZooModel) -> None:
    _require(entry)
    model = entry.make(seed=0)
    assert model.training
    shapes = []
    for variant in (0, 1):
        model.zero_grad(set_to_none=True)
        out = entry.run(model, seed=0, variant=variant)
        assert isinstance(out, Tensor) and out.is_floating_point()
        assert torch.isfinite(out).all(), f"variant {variant}: non-finite output"
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        out.backward(grad)
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        assert all(torch.isfinite(g).all() for g in grads)
        assert any(g.count_nonzero() > 0 for g in grads), "no parameter got a gradient"
        shapes.append(out.shape)
    assert shapes[0] != shapes[1]
    with torch.no_grad():
        again = [entry.run(model, seed=0, variant=0) for _ in range(2)]
    assert torch.equal(*again), "forward is not deterministic (random in training?)"


@pytest.mark.parametrize("entry", _entries())
def test_variants_differ_in_batch_and_another_dimension(entry: zoo.ZooModel) -> None:
    first, second = (_tensors(entry.example(0, v)) for v in (0, 1))
    assert first[0].shape[0] != second[0].shape[0], "same batch size"
    assert any(a.shape[1:] != b.shape[1:] for a, b in zip(first, second, strict=True))


@pytest.mark.parametrize("entry", _entries())
@pytest.mark.parametrize("variant", [0, 1])
def test_example_is_deterministic_in_seed(entry: zoo.ZooModel, variant: int) -> None:
    state = torch.random.get_rng_state()
    first = _tensors(entry.example(seed=3, variant=variant))
    assert torch.equal(torch.random.get_rng_state(), state), "used the global RNG"
    same = _tensors(entry.example(seed=3, variant=variant))
    other = _tensors(entry.example(seed=4, variant=variant))
    assert all(torch.equal(a, b) for a, b in zip(first, same, strict=True))
    assert any(not torch.equal(a, b) for a, b in zip(same, other, strict=True))


@pytest.mark.parametrize("variant", [-1, 2])
def test_example_rejects_an_unknown_variant(variant: int) -> None:
    with pytest.raises(ValueError, match="use 0"):
        zoo.get("mlp").example(variant=variant)


@pytest.mark.parametrize("name", ["mlp", "gpt2"])
def test_make_is_deterministic_in_seed(name: str) -> None:
    entry = zoo.get(name)
    _require(entry)

    def weights(seed: int) -> list[Tensor]:
        return list(entry.make(seed).state_dict().values())

    first, same, other = weights(0), weights(0), weights(1)
    assert all(torch.equal(a, b) for a, b in zip(first, same, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(first, other, strict=True))


def test_make_names_the_extra_when_a_requirement_is_missing() -> None:
    entry = zoo.ZooModel(
        "missing",
        "torch",
        nn.Identity,
        zoo.get("mlp").inputs,
        lambda out: out,
        requires=("no_such_package_for_the_zoo",),
    )
    assert not entry.available()
    with pytest.raises(ImportError, match=re.escape("torch-unit-scaling[zoo]")):
        entry.make()


def test_get_and_names_list_valid_options_for_bad_input() -> None:
    with pytest.raises(ValueError, match=r"gpt2.*mlp"):
        zoo.get("gpt-5")
    with pytest.raises(ValueError, match=r"decoder.*torch"):
        zoo.names("transformer")


def test_names_filters_by_family_and_speed() -> None:
    assert zoo.names() == list(zoo.MODELS)
    assert zoo.names(include_slow=False) == [
        name for name, entry in zoo.MODELS.items() if not entry.slow
    ]
    for family in FAMILIES:
        assert {zoo.get(n).family for n in zoo.names(family)} == {family}
        assert zoo.names(family, include_slow=False), f"{family}: all slow"
    assert sum(len(zoo.names(f)) for f in FAMILIES) == len(zoo.MODELS)


def test_registry_entries_are_well_formed() -> None:
    families = [entry.family for entry in zoo.MODELS.values()]
    assert families == sorted(families, key=FAMILIES.index), "not grouped by family"
    for name, entry in zoo.MODELS.items():
        assert name == entry.name == str(entry)
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", name)
        assert entry.description and entry.features
        assert set(entry.requires) <= {"transformers", "diffusers"}


def test_zoo_covers_every_family_and_feature() -> None:
    entries = list(zoo.MODELS.values())
    counts: Counter[str] = Counter(entry.family for entry in entries)
    assert len(entries) >= 32
    assert set(counts) == set(FAMILIES)
    minimum = {"decoder": 8, "moe": 2, "encoder": 3, "encoder-decoder": 3}
    minimum |= {"vision": 3, "conv": 3, "diffusion": 2, "ssm": 1, "torch": 5}
    assert all(counts[family] >= n for family, n in minimum.items()), counts

    def features(family: str) -> set[str]:
        return {f for e in entries if e.family == family for f in e.features}

    assert "speech" in features("encoder-decoder")
    assert "windowed-attention" in features("vision")
    assert {"batch-norm", "group-norm", "depthwise-conv"} <= features("conv")
    assert "inplace-ops" in features("torch")
    plain = [e.build() for e in entries if e.family == "torch"]
    assert any(isinstance(model, nn.Sequential) for model in plain)
