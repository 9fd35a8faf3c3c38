"""unit_scale tags every parameter for u-μP (transforms/_unit/tags.py), and can weight
residual branches by u-μP's depth-dependent rule."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import unit_scaling as uu
from unit_scaling import zoo
from unit_scaling.parameter import has_parameter_data
from unit_scaling.transforms import unit_scale


def _zoo_params() -> list[object]:
    params = []
    for name in zoo.names():
        missing = zoo.get(name).requires if not zoo.get(name).available() else ()
        marks = [pytest.mark.skip(reason=f"needs {missing}")] if missing else []
        params.append(pytest.param(name, id=name, marks=marks))
    return params


def _untagged(module: nn.Module) -> list[str]:
    return [n for n, p in module.named_parameters() if not has_parameter_data(p)]


@pytest.mark.parametrize("name", _zoo_params())
def test_every_zoo_parameter_is_tagged_and_the_input_is_not(name: str) -> None:
    original = zoo.get(name).make(0)
    scaled = unit_scale(original)
    assert _untagged(scaled) == []
    tags = scaled.unit_scale_report().tags
    assert set(tags) == {n for n, _ in scaled.named_parameters(remove_duplicate=False)}
    assert all(type(p) is nn.Parameter for p in original.parameters())
    assert not any(hasattr(p, "mup_type") for p in original.parameters())
    uu.optim.AdamW(scaled.parameters(), lr=1e-3)  # raises on an untagged one


class Stack(nn.Module):
    """A pre-norm decoder of plain torch layers, with parameters only the graph
    explains (an expert-style weight, a layer scale) and one never used."""

    def __init__(self, width: int = 32, layers: int = 3, vocab: int = 50) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width))
            for _ in range(layers)
        )
        self.expert = nn.Parameter(torch.randn(width, width))
        self.gain = nn.Parameter(torch.full((width,), 0.1))
        self.unused = nn.Parameter(torch.zeros(3))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, ids: Tensor) -> Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = x + block(x)
        x = x + self.gain * F.linear(x, self.expert)
        return self.head(self.norm(x))


def _tags(module: nn.Module) -> dict[str, tuple[str, int | None]]:
    return {
        name: (p.mup_type, p.mup_scaling_depth)  # type: ignore[attr-defined]
        for name, p in module.named_parameters()
    }


def test_types_and_depths_from_layers_then_the_graph() -> None:
    scaled = unit_scale(Stack())
    tags = _tags(scaled)
    assert tags["embed.weight"] == ("weight", None)
    assert tags["blocks.0.0.weight"] == ("norm", 3)
    assert tags["blocks.2.1.weight"] == ("weight", 3)
    assert tags["blocks.1.1.bias"] == ("bias", 3)
    assert tags["norm.bias"] == ("bias", None)
    assert tags["head.weight"] == ("output", None)
    # No layer owns these: generic by rank until the graph shows their use.
    assert tags["expert"] == ("weight", None) and tags["gain"] == ("bias", None)
    scaled(torch.randint(50, (2, 8)))
    tags = _tags(scaled)
    assert tags["expert"] == ("weight", None)
    assert tags["gain"] == ("norm", None)
    report = scaled.unit_scale_report()
    assert report.tags["gain"].source == "graph"
    assert [t.name for t in report.generic_tags] == ["unused"]


def test_a_type_the_graph_changes_is_warned(caplog: pytest.LogCaptureFixture) -> None:
    class Concat(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.token = nn.Parameter(torch.randn(16))  # a vector, used as a table
            self.proj = nn.Linear(16, 16)

        def forward(self, x: Tensor) -> Tensor:
            token = self.token.expand(x.shape[0], 1, 16)
            return self.proj(torch.cat([token, x], dim=1))

    scaled = unit_scale(Concat())
    assert scaled.token.mup_type == "bias"
    with caplog.at_level(logging.WARNING, logger="unit_scaling"):
        scaled(torch.randn(2, 4, 16))
    assert scaled.token.mup_type == "weight"
    assert "token (weight)" in caplog.text and "build it again" in caplog.text


def test_a_sequential_of_blocks_at_the_root_gives_their_depth() -> None:
    root = nn.Sequential(*(nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(4)))
    scaled = unit_scale(root)
    assert _tags(scaled)["2.0.weight"] == ("weight", 4)


def test_a_tied_readout_and_its_table_learn_by_the_output_rule() -> None:
    """A table tied to the readout (GPT-2) gets the output rule's lr, not the
    weight rule's lr/sqrt(width): with the latter the readout's updates shrink
    as the model widens (docs/results/umup_width.md)."""
    for width in (16, 64):
        model = Stack(width)
        model.head.weight = model.embed.weight
        scaled = unit_scale(model)
        assert scaled.head.weight is scaled.embed.weight
        assert scaled.embed.weight.mup_type == "output"
        assert scaled.embed.weight.mup_scaling_depth is None
        report = scaled.unit_scale_report().tags
        assert report["head.weight"].detail.startswith("readout tied to an embedding")
        assert report["embed.weight"].mup_type == "output"
        opt = uu.optim.AdamW(scaled.parameters(), lr=0.5)
        lr = next(
            g["lr"] for g in opt.param_groups if g["params"][0] is scaled.head.weight
        )
        assert lr == 0.5  # the same at every width
    untied = unit_scale(Stack(64))
    assert untied.embed.weight.mup_type == "weight"
    assert untied.head.weight.mup_type == "output"


def test_tags_of_a_native_model_are_kept() -> None:
    native = uu.TransformerDecoder(32, 64, layers=2, heads=2)
    scaled = unit_scale(native)
    assert _tags(scaled) == _tags(native)
    assert {t.source for t in scaled.unit_scale_report().tags.values()} == {"model"}


def test_tags_survive_copies_and_come_from_the_model_not_the_weights() -> None:
    ids = torch.randint(50, (2, 8))
    scaled = unit_scale(Stack())
    scaled(ids)
    expected = _tags(scaled)
    assert _tags(copy.deepcopy(scaled)) == expected
    again = unit_scale(Stack())
    again.load_state_dict(scaled.state_dict())
    again(ids)
    assert _tags(again) == expected


def test_u_mup_optimizer_trains_a_transformed_model() -> None:
    torch.manual_seed(0)
    scaled = unit_scale(Stack(), residual_scaling="u-μP")
    opt = uu.optim.AdamW(scaled.parameters(), lr=2**-4)
    ids = torch.randint(50, (8, 16))
    losses = []
    for _ in range(30):
        logits = scaled(ids[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    lrs = {g["params"][0].mup_type: g["lr"] for g in opt.param_groups}
    assert lrs["output"] == pytest.approx(2**-4)


def _taus(scaled: nn.Module) -> list[float]:
    return [
        float(r.detail.removeprefix("tau="))
        for r in scaled.unit_scale_report().ops
        if r.how == "residual"
    ]


def test_residual_weights_follow_the_chosen_rule() -> None:
    ids = torch.randint(50, (2, 8))
    fixed = unit_scale(Stack())
    fixed(ids)
    assert _taus(fixed) == [0.5] * 4
    mup = unit_scale(Stack(), residual_scaling="u-μP")
    mup(ids)
    rule = uu.transformer_residual_scaling_rule()
    assert _taus(mup) == pytest.approx([rule(i, 4) for i in range(4)])
    custom = unit_scale(Stack(), residual_scaling=lambda i, n: 0.1 * (i + 1))
    custom(ids)
    assert _taus(custom) == pytest.approx([0.1, 0.2, 0.3, 0.4])


def test_unknown_residual_rule() -> None:
    with pytest.raises(ValueError, match="residual_scaling must be 'fixed', 'u-μP'"):
        unit_scale(Stack(), residual_scaling="mup")


def _lrs(module: nn.Module, lr: float = 1.0) -> dict[str, float]:
    opt = uu.optim.AdamW(module.named_parameters(), lr=lr)
    return {n: g["lr"] for g in opt.param_groups for n in g["param_names"]}


def test_a_gpt2_conv1d_weight_learns_by_its_true_fan_in() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_embd=32, n_layer=2, n_head=2, vocab_size=64, n_positions=16
    )
    original = transformers.GPT2LMHeadModel(config)
    scaled = unit_scale(original)
    block = scaled.transformer.h[0]
    # Conv1D stores (in, out): shape[1] would be the output size
    assert tuple(block.mlp.c_fc.weight.shape) == (32, 128)
    fan_ins = {
        "attn.c_attn": 32,  # (32, 96)
        "attn.c_proj": 32,
        "mlp.c_fc": 32,  # (32, 128)
        "mlp.c_proj": 128,  # (128, 32)
    }
    lrs = _lrs(scaled)  # before the first call: the layer says it
    report = scaled.unit_scale_report().tags
    for layer, fan_in in fan_ins.items():
        name = f"transformer.h.0.{layer}.weight"
        assert scaled.get_parameter(name).mup_fan_in == fan_in, name
        assert report[name].source == "layer" and report[name].mup_fan_in == fan_in
        assert lrs[name] == pytest.approx(fan_in**-0.5 * 2**-0.5), name  # depth 2
    assert scaled.transformer.h[0].mlp.c_fc.bias.mup_fan_in is None
    scaled(torch.randint(64, (2, 8)))  # the graph agrees: nothing changes
    assert _lrs(scaled) == lrs
    assert not any(hasattr(p, "mup_fan_in") for p in original.parameters())


def test_a_weight_used_as_x_at_w_takes_its_fan_in_from_the_graph(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Products(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.in_out = nn.Parameter(torch.randn(16, 48))  # x @ W: fan-in 16
            self.out_in = nn.Parameter(torch.randn(16, 48))  # F.linear: 48, its shape
            self.both = nn.Parameter(torch.randn(16, 48))  # 16 and 48: ambiguous

        def forward(self, x: Tensor) -> Tensor:
            h = x @ self.in_out + x @ self.both
            return F.linear(h, self.out_in) + F.linear(h, self.both)

    scaled = unit_scale(Products())
    assert scaled.in_out.mup_fan_in is None  # generic until the graph shows its use
    before = _lrs(scaled)["in_out"]
    with caplog.at_level(logging.WARNING, logger="unit_scaling"):
        scaled(torch.randn(4, 8, 16))
    assert scaled.in_out.mup_fan_in == 16
    assert scaled.out_in.mup_fan_in is None and scaled.both.mup_fan_in is None
    assert "in_out (fan-in 16)" in caplog.text and "build it again" in caplog.text
    assert "out_in" not in caplog.text
    record = scaled.unit_scale_report().tags["in_out"]
    assert record.mup_fan_in == 16 and "fan-in 16" in record.detail
    assert (before, _lrs(scaled)["in_out"]) == (pytest.approx(48**-0.5), 0.25)
