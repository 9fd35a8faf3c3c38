"""Adapters and other parameters that join a model after ``unit_scale``.

A LoRA adapter (PEFT's ``get_peft_model``) attached to a unit-scaled model
starts from that model's function: its zero ``lora_B`` is kept, not
initialised, the base weights (renamed ``base_layer`` by the wrapper) are not
touched, and its update joins the layer's output as the merged weight's would
(``_unit/adapters.py``), so training moves the function from there. Any
parameter that arrives after ``unit_scale`` is kept as it is and reported.
"""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import unit_scaling as uu
from tests.helpers import tiny_gpt2, tiny_llama
from unit_scaling.transforms import unit_scale
from unit_scaling.transforms._capture import dynamo as _dynamo

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

LOGGER = "unit_scaling.transforms.unit_scale"
ADDED = "kept: added after unit_scale"


def _llama() -> nn.Module:
    torch.manual_seed(0)
    return tiny_llama().eval()


def _gpt2() -> nn.Module:
    torch.manual_seed(0)
    return tiny_gpt2().eval()


MODELS = {"llama": (_llama, ["q_proj", "v_proj"]), "gpt2": (_gpt2, ["c_attn"])}


def _ids() -> Tensor:
    return torch.randint(256, (2, 16), generator=torch.Generator().manual_seed(0))


def _lora(model: nn.Module, targets: list[str]) -> nn.Module:
    config = peft.LoraConfig(r=4, target_modules=targets)
    return peft.get_peft_model(model, config)  # type: ignore[no-any-return]


def _logits(model: nn.Module, ids: Tensor) -> Tensor:
    with torch.no_grad():
        return model(ids).logits  # type: ignore[no-any-return]


def _plain_name(name: str) -> str:
    """A PEFT model's parameter name as the model had it before the adapter."""
    return name.removeprefix("base_model.model.").replace(".base_layer", "")


@pytest.mark.parametrize("name", MODELS)
def test_lora_starts_from_the_unit_scaled_function(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    make, targets = MODELS[name]
    scaled = unit_scale(make(), residual_scaling="u-μP")
    ids = _ids()
    before = _logits(scaled, ids)
    weights = {n: p.detach().clone() for n, p in scaled.named_parameters()}
    # Attached after the first call: the graph is captured again.
    with caplog.at_level(logging.INFO, logger=LOGGER):
        adapted = _lora(scaled, targets)
        assert torch.equal(_logits(adapted, ids), before)
    lora = {n: p for n, p in adapted.named_parameters() if "lora_" in n}
    assert lora
    for n, p in adapted.named_parameters():
        if "lora_B" in n:
            assert not p.any(), n
        elif "lora_A" not in n:
            assert torch.equal(p, weights[_plain_name(n)]), n
    report = scaled.unit_scale_report()
    inits = {r.name: r.init for r in report.parameters}
    for n, p in lora.items():
        assert inits[n.removeprefix("base_model.model.")] == ADDED
        assert (p.mup_type, p.mup_scaling_depth) == ("weight", 2)
    updates = [r for r in report.ops if r.op == "low_rank_update"]
    assert len(updates) == 2 * len(targets)
    assert {r.how for r in updates} == {"analytic"}
    (warning,) = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "joined" in r.getMessage()
    ]
    assert "lora_B" in warning


def test_lora_attached_before_the_first_call_trains() -> None:
    """The adapter's parameters are there at the first capture, but were not
    when ``unit_scale`` set the model up: the same function, and training on
    a fixed batch lowers the loss, the base weights frozen."""
    make, targets = MODELS["llama"]
    original = make()
    ids = _ids()
    want = _logits(unit_scale(original, residual_scaling="u-μP"), ids)
    adapted = _lora(unit_scale(original, residual_scaling="u-μP"), targets)
    frozen = {
        n: p.clone() for n, p in adapted.named_parameters() if not p.requires_grad
    }
    output = adapted(ids, labels=ids)
    assert torch.equal(output.logits.detach(), want)
    assert all(not p.any() for n, p in adapted.named_parameters() if "lora_B" in n)
    trained = [p for p in adapted.parameters() if p.requires_grad]
    optimizer = uu.optim.AdamW(trained, lr=2**-4)
    losses = []
    for _ in range(4):
        loss = adapted(ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    for n, p in adapted.named_parameters():
        assert n in frozen or "lora_" in n
        assert n not in frozen or torch.equal(p, frozen[n]), n


def test_unit_scale_of_a_peft_model_is_refused() -> None:
    adapted = _lora(_gpt2(), ["c_attn"])
    with pytest.raises(ValueError, match=r"get_peft_model\(unit_scale\(model\)"):
        unit_scale(adapted)


class _Block(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.out = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(F.gelu(self.proj(x)))


class _Adapted(nn.Module):
    """A hand-written LoRA-style adapter (no PEFT class to recognise), with
    dropout on its input, as PEFT's ``lora_dropout``."""

    def __init__(self, base: nn.Linear, ranks: tuple[int, ...]) -> None:
        super().__init__()
        self.base = base
        self.dropout = nn.Dropout(0.25)
        self.downs = nn.ModuleList(
            nn.Linear(base.in_features, r, bias=False) for r in ranks
        )
        self.ups = nn.ModuleList(
            nn.Linear(r, base.out_features, bias=False) for r in ranks
        )
        for up in self.ups:
            nn.init.zeros_(up.weight)

    def forward(self, x: Tensor) -> Tensor:
        y = self.base(x)
        for down, up in zip(self.downs, self.ups, strict=True):
            y = y + up(down(self.dropout(x))) * 0.5
        return y


def test_a_hand_written_adapter_computes_its_merged_weight() -> None:
    torch.manual_seed(0)
    scaled = unit_scale(_Block())
    x = torch.randn(8, 16)
    want = scaled(x).detach()
    base = scaled.proj
    scaled.proj = _Adapted(base, ranks=(2, 3))
    assert torch.equal(scaled(x), want)
    assert torch.equal(copy.deepcopy(scaled)(x), want)
    ops = [r for r in scaled.unit_scale_report().ops if r.op == "low_rank_update"]
    assert [r.detail for r in ops] == [
        "low-rank adapter (rank 2, scaling 0.5): the merged weight's function",
        "low-rank adapter (rank 3, scaling 0.5): the merged weight's function",
    ]
    scaled.eval()
    with torch.no_grad():
        for up in scaled.proj.ups:
            up.weight.normal_()
        adapted = scaled(x)
        delta = sum(
            0.5 * up.weight @ down.weight
            for down, up in zip(scaled.proj.downs, scaled.proj.ups, strict=True)
        )
        scaled.proj = base
        base.weight += delta
        torch.testing.assert_close(scaled(x), adapted, rtol=1e-5, atol=1e-5)


class _Gained(nn.Module):
    """A layer times a gain that was not there when ``unit_scale`` was called."""

    def __init__(self, layer: nn.Module, width: int = 16) -> None:
        super().__init__()
        self.layer = layer
        self.gain = nn.Parameter(torch.full((width,), 3.0))

    def forward(self, x: Tensor) -> Tensor:
        return self.layer(x) * self.gain


def test_a_parameter_added_by_hand_is_kept(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    scaled = unit_scale(_Block())
    x = torch.randn(8, 16)
    scaled(x)
    scaled.proj = _Gained(scaled.proj)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        scaled(x)
    assert torch.equal(scaled.proj.gain, torch.full((16,), 3.0))
    records = {r.name: r for r in scaled.unit_scale_report().parameters}
    assert records["proj.gain"].init == ADDED
    assert records["proj.layer.weight"].init == "initialised before"
    assert scaled.proj.gain.mup_type == "norm"  # from its use: a gain
    (message,) = [r.getMessage() for r in caplog.records if "joined" in r.getMessage()]
    assert "proj.gain" in message


@pytest.mark.parametrize("guards", ["as needed", "kept"])
def test_resized_embeddings_are_kept(
    guards: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``resize_token_embeddings`` gives the table new data of another shape:
    kept (its old rows unit-scaled, its new ones as the library drew them).
    torch 2.11's Dynamo would not see the new data unless the capture keeps the
    guards on parameters' tensors; "kept" keeps them on any torch, so that
    that way of capturing stays tested."""
    if guards == "kept":
        monkeypatch.setattr(_dynamo, "PARAMETER_DATA_SWAPS_RECOMPILE", False)
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16
    )
    scaled = unit_scale(transformers.GPT2LMHeadModel(config).eval())
    ids = torch.randint(64, (2, 8), generator=torch.Generator().manual_seed(0))
    scaled(ids)
    old = scaled.get_input_embeddings().weight.detach().clone()
    scaled.resize_token_embeddings(80)
    resized = scaled.get_input_embeddings().weight.detach().clone()
    assert torch.equal(resized[:64], old)
    scaled(ids)
    assert torch.equal(scaled.get_input_embeddings().weight, resized)
    inits = {r.name: r.init for r in scaled.unit_scale_report().parameters}
    assert inits["transformer.wte.weight"] == ADDED
