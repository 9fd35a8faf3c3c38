"""``unit_scaling.export.to_plain``: a unit-scaled model's static scales folded
into the weights of the original architecture."""

from __future__ import annotations

import math
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import unit_scaling as uu
from unit_scaling import zoo
from unit_scaling.app.baseline import StandardTransformerDecoder
from unit_scaling.export import PlainExport, PlainTransformerDecoder, to_plain
from unit_scaling.export._solver import RatioSystem
from unit_scaling.modules import TransformerDecoder
from unit_scaling.transforms import unit_scale

VOCAB = 256


def _trained(model: nn.Module, loss: object, steps: int = 3) -> None:
    """A few u-μP AdamW steps, so that the weights are not at initialisation."""
    optimizer = uu.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        value = loss()  # type: ignore[operator]
        value.backward()
        optimizer.step()
        optimizer.zero_grad()


def _state(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _relative_error(plain: Tensor, unit: Tensor) -> float:
    return float((plain - unit).abs().max() / unit.abs().max())


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def hf_export(
    request: pytest.FixtureRequest,
) -> tuple[str, nn.Module, nn.Module, Tensor, PlainExport, dict[str, Tensor]]:
    torch.manual_seed(0)
    original = zoo.hf_model(request.param, vocab_size=VOCAB, use_cache=False)
    model = unit_scale(original)
    ids = torch.randint(VOCAB, (2, 16))
    _trained(model, lambda: model(input_ids=ids, labels=ids).loss)
    before = _state(model)
    export = to_plain(model, kwargs={"input_ids": ids})
    return request.param, original, model, ids, export, before


def test_hugging_face_model_exports_to_its_own_class(
    hf_export: tuple[str, nn.Module, nn.Module, Tensor, PlainExport, dict[str, Tensor]],
) -> None:
    _, original, model, ids, export, before = hf_export
    assert type(export.module) is type(original)
    assert not export.unfolded
    model.eval()
    export.module.eval()
    with torch.no_grad():
        unit = model(input_ids=ids).logits
        plain = export.module(input_ids=ids).logits
    assert _relative_error(plain, unit) < 1e-4
    assert export.max_rel_error < 1e-4
    assert export.folded  # the scales went somewhere
    # the argument is unchanged
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_exported_config_has_no_unit_scaling_record(
    hf_export: tuple[str, nn.Module, nn.Module, Tensor, PlainExport, dict[str, Tensor]],
) -> None:
    model, export = hf_export[2], hf_export[4]
    config: Any = export.module.config
    assert not hasattr(config, "unit_scaling")
    assert "unit_scaling" not in config.to_dict()
    assert not hasattr(export.module, "unit_scale_report")
    assert hasattr(model.config, "unit_scaling")  # the argument keeps its record
    # Nothing in the plain module refers to unit_scaling (its hooks are gone).
    assert b"unit_scaling" not in pickle.dumps(export.module)


_LOAD = """
import sys
sys.modules["unit_scaling"] = None  # any import of it fails
try:
    import unit_scaling
except ImportError:
    pass
else:
    raise AssertionError("unit_scaling is importable")
import torch
from transformers import AutoModelForCausalLM

model = AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()
ids = torch.load(sys.argv[2])
with torch.no_grad():
    torch.save(model(input_ids=ids).logits, sys.argv[3])
"""


def test_exported_model_loads_without_unit_scaling(
    hf_export: tuple[str, nn.Module, nn.Module, Tensor, PlainExport, dict[str, Tensor]],
    tmp_path: Path,
) -> None:
    _, _, model, ids, export, _ = hf_export
    export.module.save_pretrained(tmp_path / "model")  # type: ignore[operator]
    assert "unit_scaling" not in (tmp_path / "model" / "config.json").read_text()
    torch.save(ids, tmp_path / "ids.pt")
    files = ("model", "ids.pt", "logits.pt")
    subprocess.run(
        [sys.executable, "-c", _LOAD, *(str(tmp_path / f) for f in files)],
        check=True,
        cwd=tmp_path,
    )
    loaded = torch.load(tmp_path / "logits.pt")
    model.eval()
    with torch.no_grad():
        unit = model(input_ids=ids).logits
    assert _relative_error(loaded, unit) < 1e-4


@pytest.fixture(scope="module")
def decoder() -> tuple[TransformerDecoder, Tensor]:
    torch.manual_seed(0)
    model = TransformerDecoder(64, VOCAB, layers=2, heads=4)
    tokens = torch.randint(VOCAB, (2, 17))
    _trained(model, lambda: model.loss(tokens))
    return model, tokens[:, :-1]


def test_decoder_exports_to_its_plain_twin(
    decoder: tuple[TransformerDecoder, Tensor],
) -> None:
    model, ids = decoder
    before = _state(model)
    export = to_plain(model, ids)
    assert isinstance(export.module, PlainTransformerDecoder)
    with torch.no_grad():
        unit, plain = model.eval()(ids), export.module(ids)
    model.train()
    assert _relative_error(plain, unit) < 1e-4
    assert export.seq_len == 16
    assert not export.unfolded
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_decoder_differs_at_other_lengths_and_the_report_says_by_how_much(
    decoder: tuple[TransformerDecoder, Tensor],
) -> None:
    model, ids = decoder
    export = to_plain(model, ids)
    longer = ids.repeat(1, 2)
    with torch.no_grad():
        error = _relative_error(export.module(longer), model.eval()(longer))
    model.train()
    assert error > 1e-3
    assert export.length_errors[32] == pytest.approx(error, rel=1e-3)
    # attention's output scale grows with the keys: c(32) > c(16) > c(8)
    assert export.attention_ratios[32] > 1 > export.attention_ratios[8]
    assert "L=32" in export.length_note and "sequence length 16" in export.length_note


def test_decoder_multipliers_fold_and_loss_mult_is_reported() -> None:
    torch.manual_seed(0)
    model = TransformerDecoder(
        64,
        VOCAB,
        layers=3,
        heads=4,
        residual_mult=0.5,
        mhsa_mult=2.0,
        mlp_mult=0.5,
        embedding_mult=3.0,
        readout_mult=2.0,
        loss_mult=1.5,
    )
    export = to_plain(model, seq_len=12)
    assert export.max_rel_error < 1e-4 and export.seq_len == 12
    (loss,) = export.unfolded
    assert loss.factor == 1.5 and "loss_mult" in loss.reason


def test_standard_decoder_is_the_plain_twin_with_sp_init() -> None:
    torch.manual_seed(0)
    standard = StandardTransformerDecoder(64, VOCAB, layers=2, heads=4)
    twin = TransformerDecoder(64, VOCAB, layers=2, heads=4)
    assert isinstance(standard, PlainTransformerDecoder)
    names = {
        name.replace(".mhsa.", ".").replace(".mlp.", ".")
        for name, _ in twin.named_parameters()
    }
    assert names == {name for name, _ in standard.named_parameters()}
    assert standard.embedding.weight.std().item() == pytest.approx(0.02, rel=0.1)


def test_an_output_scale_after_a_nonlinearity_is_reported() -> None:
    torch.manual_seed(0)
    model = unit_scale(nn.Sequential(nn.Linear(8, 8), nn.GELU()))
    x = torch.randn(4, 8)
    model(x)
    export = to_plain(model, x)
    (unfolded,) = export.unfolded
    assert unfolded.factor is not None and "output" in unfolded.fix
    with torch.no_grad():
        ratio = model(x) / export.module(x)
    # the plain model is off by exactly the factor the report names
    assert float(ratio.mean()) == pytest.approx(unfolded.factor, rel=1e-5)
    assert export.max_rel_error == pytest.approx(abs(1 - 1 / unfolded.factor), 1e-3)


class _ShiftedGain(nn.Module):
    """A residual branch ending in a norm with Gemma's gain ``1 + g``."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)
        self.g = nn.Parameter(0.1 * torch.randn(16))
        self.out = nn.Linear(16, 8)

    def forward(self, x: Tensor) -> Tensor:
        branch = nn.functional.rms_norm(self.linear(x), (16,)) * (1 + self.g)
        out: Tensor = self.out(x + branch)
        return out


def test_a_gain_used_as_one_plus_w_takes_the_residual_weight() -> None:
    torch.manual_seed(0)
    model = unit_scale(_ShiftedGain())
    x = torch.randn(4, 16)
    model(x)
    export = to_plain(model, x)
    assert not export.unfolded and export.max_rel_error < 1e-5
    # the residual add's branch weight is folded into the gain 1 + g
    g = export.module.g  # type: ignore[union-attr]
    factor = export.folded["g"]
    assert torch.allclose(1 + g, factor * (1 + model.g), atol=1e-6)


def test_bad_input() -> None:
    with pytest.raises(TypeError, match="unit_scale"):
        to_plain(nn.Linear(2, 2), torch.randn(1, 2))
    model = unit_scale(nn.Sequential(nn.Linear(4, 4)))
    with pytest.raises(ValueError, match="Call it once"):
        to_plain(model, torch.randn(2, 4))
    model(torch.randn(2, 4))
    with pytest.raises(ValueError, match="example"):
        to_plain(model)
    with pytest.raises(ValueError, match="seq_len"):
        to_plain(model, torch.randn(2, 4), seq_len=4)
    with pytest.raises(ValueError, match="seq_len"):
        to_plain(TransformerDecoder(64, VOCAB, layers=1, heads=4))


def test_solver_reports_the_factor_it_cannot_absorb() -> None:
    system = RatioSystem()
    # y = 0.5 * x W with x and y fixed: W takes the 0.5
    system.relate({"y": 1, "x": -1, "W": -1}, -math.log(0.5), "linear")
    system.anchor("x", 0.0, "input")
    system.anchor("y", 0.0, "output")
    # the plain z is twice the unit-scaled one, but a GELU needs them equal:
    # its input would need multiplying by 1/2
    system.equal("z", "y", math.log(2.0), "scale")
    system.anchor("z", 0.0, "gelu", at_input=True)
    values, conflicts = system.solve(lambda v: 1.0)
    assert math.exp(values["W"]) == pytest.approx(0.5)
    (conflict,) = conflicts
    assert conflict.origin == "gelu" and conflict.at_input
    assert conflict.factor == pytest.approx(0.5)


def _language_models() -> list[object]:
    return [
        pytest.param(
            name,
            id=name,
            marks=[pytest.mark.slow]
            + [pytest.mark.skip(reason="needs transformers")] * (not entry.available()),
        )
        for name, entry in zoo.MODELS.items()
        if entry.family in ("decoder", "moe", "ssm")
    ]


@pytest.mark.parametrize("name", _language_models())
def test_zoo_language_model_exports_or_says_why(name: str) -> None:
    entry = zoo.get(name)
    model = unit_scale(entry.make(seed=0))
    args, kwargs = entry.example(seed=0)
    model(*args, **kwargs)
    try:
        export = to_plain(model, args, kwargs)
    except ValueError as error:  # graph breaks: nothing to fold
        assert "graph breaks" in str(error)
        return
    if export.unfolded:
        assert all(u.reason and u.fix for u in export.unfolded)
        assert export.max_rel_error > 1e-5
    else:
        assert export.max_rel_error < 1e-4


@pytest.mark.parametrize("attention", [False, True])
def test_fp8_trained_models_export_their_master_weights(attention: bool) -> None:
    """A model whose GEMMs run in real FP8 exports the high-precision function
    of its master weights (the FP8 model itself differs by FP8's rounding)."""
    from unit_scaling.float8 import Float8Config, convert_to_float8_training

    config = Float8Config(attention=attention)
    torch.manual_seed(0)
    native = TransformerDecoder(64, VOCAB, layers=2, heads=4)
    ids = torch.randint(VOCAB, (2, 16))
    with torch.no_grad():
        exact = native(ids)
    export = to_plain(convert_to_float8_training(native, config=config), ids)
    with torch.no_grad():
        assert _relative_error(export.module(ids), exact) < 1e-5
    pytest.importorskip("transformers")
    scaled = unit_scale(zoo.hf_model("llama", vocab_size=VOCAB))
    with torch.no_grad():
        exact = scaled(input_ids=ids).logits
        convert_to_float8_training(scaled, config=config)
        fp8 = scaled(input_ids=ids).logits
    export = to_plain(scaled, kwargs={"input_ids": ids})
    assert not export.unfolded
    with torch.no_grad():
        plain = export.module(input_ids=ids).logits
    assert _relative_error(plain, exact) < 1e-5
    assert _relative_error(fp8, exact) > 1e-3  # the FP8 model is another function
