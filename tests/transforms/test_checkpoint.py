"""Checkpoints of unit-scaled models come back as the same model.

``unit_scale`` must not initialise trained weights again, and must reuse the
scales it measured, so that a model saved and loaded (``save_pretrained`` /
``from_pretrained``, ``torch.save`` / ``torch.load(weights_only=True)``,
``state_dict`` / ``load_state_dict``, ``torch.distributed.checkpoint``) computes
the same function, and training resumed from it follows the uninterrupted run.
"""

from __future__ import annotations

import copy
import io
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import unit_scaling as uu
from unit_scaling import zoo
from unit_scaling.transforms import (
    checkpoint_record,
    load_checkpoint_record,
    unit_scale,
)

transformers = pytest.importorskip("transformers")

DECODERS = [n for n in zoo.names() if zoo.get(n).family == "decoder"]
RELATIVE = 1e-6  # outputs after a reload, relative to before


def _ids(seed: int, batch: int = 4, seq: int = 33) -> Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(256, (batch, seq), generator=generator)


def _llama() -> nn.Module:
    torch.manual_seed(0)
    return zoo.hf_model("llama", vocab_size=256)


def _gpt2() -> nn.Module:
    torch.manual_seed(0)
    return zoo.hf_model(
        "gpt2",
        vocab_size=256,
        use_cache=False,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )


HF_FACTORIES = {"llama": _llama, "gpt2": _gpt2}


def _loss(model: nn.Module, ids: Tensor) -> Tensor:
    loss: Tensor = model(input_ids=ids, labels=ids).loss
    return loss


def _train(
    model: nn.Module, optimizer: torch.optim.Optimizer, steps: int, start: int
) -> list[float]:
    losses = []
    for step in range(start, start + steps):
        loss = _loss(model, _ids(step))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def _relative(a: Tensor, b: Tensor) -> float:
    return float((a - b).norm() / b.norm())


def _trained(factory: Callable[[], nn.Module], steps: int = 5) -> tuple[Any, Any]:
    model = unit_scale(factory())
    optimizer = uu.optim.AdamW(model.parameters(), lr=2**-4)
    _train(model, optimizer, steps, start=0)
    return model, optimizer


@pytest.mark.parametrize("family", sorted(HF_FACTORIES))
def test_save_pretrained_and_back(family: str, tmp_path: Path) -> None:
    model, _ = _trained(HF_FACTORIES[family])
    ids = _ids(100)
    before = model(input_ids=ids).logits
    model.save_pretrained(tmp_path)
    assert "unit_scaling" in (tmp_path / "config.json").read_text()
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    again = unit_scale(loaded)
    assert _relative(again(input_ids=ids).logits, before) <= RELATIVE
    # The trained weights, not initialised ones.
    for (name, p), q in zip(model.named_parameters(), again.parameters(), strict=True):
        assert torch.equal(p, q), name
    # What the issue saw: initialised again, the model is another one.
    fresh = unit_scale(
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path), init_weights=True
    )
    assert _relative(fresh(input_ids=ids).logits, before) > 0.01


def test_the_choice_is_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model, _ = _trained(_llama, steps=1)
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    with caplog.at_level(logging.INFO, logger="unit_scaling.transforms.unit_scale"):
        unit_scale(loaded)
        unit_scale(loaded, init_weights=True)
        unit_scale(_llama(), init_weights=False)
    text = caplog.text
    assert "records that it was trained unit-scaled" in text
    assert "init_weights=True" in text and "init_weights=False" in text


def test_the_original_model_is_left_alone() -> None:
    original = _llama()
    model = unit_scale(original)
    model(input_ids=_ids(0))
    assert hasattr(model.config, "unit_scaling")
    assert not hasattr(original.config, "unit_scaling")


@pytest.mark.parametrize("called_first", [False, True])
def test_torch_save_and_load_weights_only(called_first: bool) -> None:
    model, _ = _trained(_gpt2)
    ids = _ids(100)
    before = model(input_ids=ids).logits
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    target = unit_scale(_gpt2())
    if called_first:  # its graphs hold scales measured on other weights
        target(input_ids=ids)
    target.load_state_dict(state)
    assert _relative(target(input_ids=ids).logits, before) <= RELATIVE


def test_state_dict_in_memory() -> None:
    model, _ = _trained(_llama)
    ids = _ids(100)
    before = model(input_ids=ids).logits
    target = unit_scale(_llama())
    target.load_state_dict(model.state_dict())
    assert _relative(target(input_ids=ids).logits, before) <= RELATIVE


def test_a_record_beside_a_tensor_only_checkpoint(tmp_path: Path) -> None:
    """torch.distributed.checkpoint keeps tensors (and flattens dicts): the
    record goes beside them, as JSON text."""
    import json

    import torch.distributed.checkpoint as dcp

    model, _ = _trained(_llama)
    ids = _ids(100)
    before = model(input_ids=ids).logits
    dcp.save(
        {
            "model": dict(model.state_dict()),
            "unit_scaling": json.dumps(checkpoint_record(model)),
        },
        checkpoint_id=tmp_path,
    )
    target = unit_scale(_llama())
    state = {"model": dict(target.state_dict()), "unit_scaling": ""}
    dcp.load(state, checkpoint_id=tmp_path)
    target.load_state_dict(state["model"])
    load_checkpoint_record(target, json.loads(state["unit_scaling"]))
    assert _relative(target(input_ids=ids).logits, before) <= RELATIVE


@pytest.mark.parametrize("path", ["from_pretrained", "state_dict"])
def test_resumed_training_follows_the_uninterrupted_run(
    path: str, tmp_path: Path
) -> None:
    model, optimizer = _trained(_llama, steps=5)
    lrs = [g["lr"] for g in optimizer.param_groups]
    if path == "from_pretrained":
        model.save_pretrained(tmp_path)
        loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
        resumed = unit_scale(loaded)
    else:
        resumed = unit_scale(_llama())
        resumed.load_state_dict(model.state_dict())
    resumed_optimizer = uu.optim.AdamW(resumed.parameters(), lr=2**-4)
    resumed_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    assert [g["lr"] for g in resumed_optimizer.param_groups] == lrs
    expected = _train(model, optimizer, 20, start=5)
    got = _train(resumed, resumed_optimizer, 20, start=5)
    for step, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert a == pytest.approx(b, rel=1e-5), f"resumed step {step}"


@pytest.mark.parametrize("name", DECODERS)
def test_every_zoo_decoder_round_trips(name: str) -> None:
    entry = zoo.get(name)
    model = unit_scale(entry.make(0))
    optimizer = uu.optim.AdamW(model.parameters(), lr=2**-5)
    for seed in range(2):
        entry.run(model, seed, 0).float().square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    with torch.no_grad():
        before = entry.run(model.eval(), 7, 0)
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    target = unit_scale(entry.make(1))  # other initial weights
    target.load_state_dict(torch.load(buffer, weights_only=True))
    with torch.no_grad():
        after = entry.run(target.eval(), 7, 0)
    assert _relative(after, before) <= RELATIVE, name


def test_native_models_keep_their_weights() -> None:
    """Parameters of uu modules are unit-scaled by construction: unit_scale
    keeps them (a trained native model is not initialised again)."""
    torch.manual_seed(0)
    native = uu.TransformerDecoder(64, 256, layers=2, heads=4)
    optimizer = uu.optim.AdamW(native.parameters(), lr=0.1)
    for step in range(3):
        native.loss(_ids(step)).backward()
        optimizer.step()
        optimizer.zero_grad()
    scaled = unit_scale(native)
    scaled(_ids(9)[:, :-1])
    pairs = zip(native.named_parameters(), scaled.parameters(), strict=True)
    for (name, p), q in pairs:
        assert torch.equal(p, q), name
    # and a native model's own round trip
    again = uu.TransformerDecoder(64, 256, layers=2, heads=4)
    buffer = io.BytesIO()
    torch.save(native.state_dict(), buffer)
    buffer.seek(0)
    again.load_state_dict(torch.load(buffer, weights_only=True))
    ids = _ids(10)[:, :-1]
    assert torch.equal(again(ids), native(ids))


def test_init_weights_false_keeps_plain_weights() -> None:
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
    kept = unit_scale(model, init_weights=False)
    kept(torch.randn(4, 16))
    for p, q in zip(model.parameters(), kept.parameters(), strict=True):
        assert torch.equal(p, q)
    initialised = unit_scale(model)
    assert not torch.equal(initialised[0].weight, model[0].weight)


def test_a_record_of_another_residual_rule_is_refused(tmp_path: Path) -> None:
    model, _ = _trained(_llama, steps=1)
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="residual_scaling"):
        unit_scale(loaded, residual_scaling="u-μP")


def test_bad_records_and_arguments_are_refused() -> None:
    model = unit_scale(nn.Sequential(nn.Linear(16, 16)))
    with pytest.raises(ValueError, match="format"):
        load_checkpoint_record(model, {"format": 99})
    with pytest.raises(ValueError, match="got NoneType"):
        load_checkpoint_record(model, None)  # type: ignore[arg-type]
    damaged = {"format": checkpoint_record(model)["format"], "regions": 3}
    with pytest.raises(ValueError, match="damaged"):
        load_checkpoint_record(model, damaged)
    with pytest.raises(ValueError, match="not made by unit_scale"):
        checkpoint_record(nn.Linear(2, 2))
    with pytest.raises(TypeError, match=r"nn\.Module"):
        checkpoint_record("model")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="init_weights"):
        unit_scale(nn.Linear(2, 2), init_weights="yes")  # type: ignore[arg-type]


def test_loaded_weights_are_kept_without_a_record() -> None:
    """A state dict without metadata (as DCP loads one) still holds trained
    weights: the first call does not initialise them again."""
    model, _ = _trained(_llama)
    target = unit_scale(_llama())
    target.load_state_dict(dict(model.state_dict()))  # a plain dict: no metadata
    target(input_ids=_ids(100))
    for (name, p), q in zip(model.named_parameters(), target.parameters(), strict=True):
        assert torch.equal(p, q), name
