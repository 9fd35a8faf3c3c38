"""u-μP optimizers: per-parameter learning rates and weight decays, and real steps."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from unit_scaling.optim import (
    SGD,
    Adam,
    AdamW,
    LRScaleFunc,
    MupTags,
    lr_scale_for_depth,
    lr_scale_func_adam,
    lr_scale_func_sgd,
    mup_tags,
    scaled_parameters,
)
from unit_scaling.parameter import Parameter, has_parameter_data


class _Tagged(nn.Module):
    """One parameter of each kind, with hand-computed u-μP lr factors below."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.w = Parameter(torch.randn(8, 16, generator=gen), "weight")
        self.w3d = Parameter(torch.randn(4, 3, 12, generator=gen), "weight", 4)
        self.w1d = Parameter(torch.randn(25, generator=gen), "weight")
        self.b = Parameter(torch.randn(8, generator=gen), "bias", 9)
        self.n = Parameter(torch.randn(5, generator=gen), "norm")
        self.o = Parameter(torch.randn(10, 8, generator=gen), "output", 4)
        # stored (in, out), as GPT-2's Conv1D: the tag, not shape[1] = 4
        self.t = Parameter(torch.randn(9, 4, generator=gen), "weight", mup_fan_in=9)


# fan-ins: w 16, w3d 3·12 = 36, w1d 25, t 9 (tagged); depths: w3d 4, b 9, o 4.
ADAM = [1 / 4, 1 / 6 / 2, 1 / 5, 1 / 3, 1.0, 1 / 2, 1 / 3]
SGD_TO_OUTPUT_SCALE = [4.0, 6 / 2, 5.0, 8 / 3, 5.0, 1 / 2, 3.0]

RULES: list[tuple[LRScaleFunc, list[float]]] = [
    (lr_scale_func_adam, ADAM),
    (lr_scale_func_sgd(None), ADAM),
    (lr_scale_func_sgd("to_output_scale"), SGD_TO_OUTPUT_SCALE),
]


def _lrs(groups: list[dict[str, object]]) -> list[float]:
    return [float(g["lr"]) for g in groups]  # type: ignore[arg-type]


@pytest.mark.parametrize(("rule", "expected"), RULES)
def test_rule_per_parameter(rule: LRScaleFunc, expected: list[float]) -> None:
    model = _Tagged()
    assert [rule(p) for p in model.parameters()] == pytest.approx(expected)


def test_lr_scale_for_depth() -> None:
    assert lr_scale_for_depth(Parameter(torch.zeros(3), "bias", 4)) == 0.5
    assert lr_scale_for_depth(Parameter(torch.zeros(3), "bias")) == 1.0


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda ps, lr: Adam(ps, lr=lr), ADAM),
        (lambda ps, lr: AdamW(ps, lr=lr), ADAM),
        (lambda ps, lr: SGD(ps, lr=lr), ADAM),
        (
            lambda ps, lr: SGD(ps, lr=lr, readout_constraint="to_output_scale"),
            SGD_TO_OUTPUT_SCALE,
        ),
    ],
    ids=["Adam", "AdamW", "SGD-None", "SGD-to_output_scale"],
)
def test_optimizer_groups_carry_u_mup_lrs(
    make: Callable[[Iterator[nn.Parameter], float], torch.optim.Optimizer],
    expected: list[float],
) -> None:
    model = _Tagged()
    opt = make(model.parameters(), 0.1)
    assert len(opt.param_groups) == len(expected)
    assert [g["params"] for g in opt.param_groups] == [[p] for p in model.parameters()]
    assert _lrs(opt.param_groups) == pytest.approx([0.1 * e for e in expected])
    assert [g["weight_decay"] for g in opt.param_groups] == [0] * len(expected)


def test_default_lrs_follow_torch() -> None:
    model = _Tagged()
    for opt_class in (Adam, AdamW, SGD):
        opt = opt_class(model.parameters())
        assert _lrs(opt.param_groups) == pytest.approx([1e-3 * e for e in ADAM])
    assert AdamW(model.parameters()).defaults["weight_decay"] == 0


def test_independent_weight_decay() -> None:
    model = _Tagged()
    opt = AdamW(model.parameters(), lr=0.1, weight_decay=0.01)
    for group, scale in zip(opt.param_groups, ADAM, strict=True):
        assert group["weight_decay"] == pytest.approx(0.01 / (0.1 * scale))
        assert group["lr"] * group["weight_decay"] == pytest.approx(0.01)


def test_coupled_weight_decay_is_passed_through() -> None:
    model = _Tagged()
    opt = AdamW(
        model.parameters(), lr=0.1, weight_decay=0.01, independent_weight_decay=False
    )
    assert [g["weight_decay"] for g in opt.param_groups] == [0.01] * len(ADAM)


def test_existing_groups_keep_their_settings() -> None:
    m = _Tagged()
    given: list[dict[str, Any]] = [
        {"params": [m.w, m.b], "lr": 0.5, "weight_decay": 0.2, "betas": (0.8, 0.9)},
        {"params": m.o},
    ]
    groups = scaled_parameters(
        given,
        lr_scale_func_adam,
        lr=0.01,
        weight_decay=0.03,
    )
    assert [g["params"] for g in groups] == [[m.w], [m.b], [m.o]]
    assert _lrs(groups) == pytest.approx([0.5 / 4, 0.5 / 3, 0.01 / 2])
    assert [g["weight_decay"] for g in groups] == pytest.approx(
        [0.2 / (0.5 / 4), 0.2 / (0.5 / 3), 0.03 / (0.01 / 2)]
    )
    assert [g.get("betas") for g in groups] == [(0.8, 0.9), (0.8, 0.9), None]
    given = [{"params": [m.w], "lr": 0.5, "betas": (0.8, 0.9)}, {"params": [m.n]}]
    opt = Adam(given, lr=0.01)
    assert [g["betas"] for g in opt.param_groups] == [(0.8, 0.9), (0.9, 0.999)]
    assert _lrs(opt.param_groups) == pytest.approx([0.5 / 4, 0.01])


def test_tensor_lr_stays_a_tensor_per_group() -> None:
    model = _Tagged()
    lr = torch.tensor(0.1)
    opt = Adam(model.parameters(), lr=lr, weight_decay=0.01)
    lrs = [g["lr"] for g in opt.param_groups]
    assert all(isinstance(x, Tensor) and x is not lr for x in lrs)
    assert len({id(x) for x in lrs}) == len(lrs)  # schedulers fill_ them one by one
    assert _lrs(opt.param_groups) == pytest.approx([0.1 * e for e in ADAM])
    # The decay is a float, so torch's per-step `weight_decay != 0` never syncs.
    decays = [g["weight_decay"] for g in opt.param_groups]
    assert all(isinstance(d, float) for d in decays)
    assert decays == pytest.approx([0.01 / (0.1 * e) for e in ADAM])
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()


def test_named_parameters_keep_their_names() -> None:
    model = _Tagged()
    opt = AdamW(model.named_parameters(), lr=0.1)
    assert [g["param_names"] for g in opt.param_groups] == [
        [n] for n, _ in model.named_parameters()
    ]
    assert _lrs(opt.param_groups) == pytest.approx([0.1 * e for e in ADAM])
    # Groups read back from an optimizer (names under "param_names") work too.
    again = scaled_parameters(opt.param_groups, lr_scale_func_adam)
    assert [g["params"] for g in again] == [
        [(n, p)] for n, p in model.named_parameters()
    ]


def test_tags_mapping_survives_parameter_replacement() -> None:
    model = _Tagged()
    tags = mup_tags(model)
    assert tags["w3d"] == MupTags("weight", 4)
    assert tags["t"] == MupTags("weight", None, 9)
    model.to("meta").to_empty(device="cpu")  # replaces every nn.Parameter
    assert not any(has_parameter_data(p) for p in model.parameters())
    with pytest.raises(ValueError, match=re.escape("'w' (shape (8, 16)) has no u-μP")):
        AdamW(model.named_parameters(), lr=0.1)
    opt = AdamW(model.named_parameters(), lr=0.1, tags=tags)
    assert _lrs(opt.param_groups) == pytest.approx([0.1 * e for e in ADAM])


def test_tags_mapping_tags_a_plain_model_and_wins() -> None:
    lin = nn.Linear(16, 8)
    tags = {"weight": MupTags("weight"), "bias": MupTags("bias", 4)}
    groups = scaled_parameters(
        lin.named_parameters(), lr_scale_func_adam, 1.0, tags=tags
    )
    assert _lrs(groups) == pytest.approx([1 / 4, 1 / 2])
    tagged = Parameter(torch.zeros(8, 16), "weight")
    override = {"w": MupTags("output")}
    groups = scaled_parameters([("w", tagged)], lr_scale_func_adam, 1.0, tags=override)
    assert _lrs(groups) == [1.0]
    with pytest.raises(ValueError, match="tags= maps parameter names"):
        scaled_parameters([tagged], lr_scale_func_adam, 1.0, tags=override)
    bad: dict[str, Any] = {"w": ("hidden", None)}
    with pytest.raises(ValueError, match="mup_type='hidden'"):
        scaled_parameters([("w", tagged)], lr_scale_func_adam, 1.0, tags=bad)
    # a plain tuple may carry the fan-in; a malformed entry is named
    as_tuple = {"w": ("weight", None, 64)}
    groups = scaled_parameters([("w", tagged)], lr_scale_func_adam, 1.0, tags=as_tuple)
    assert _lrs(groups) == [1 / 8]
    for entry in ("weight", ("weight", None, 4, 1), ()):
        with pytest.raises(ValueError, match=r"tags\['w'\] must be a MupTags"):
            scaled_parameters(
                [("w", tagged)], lr_scale_func_adam, 1.0, tags={"w": entry}
            )


def test_untagged_parameter_is_an_error_naming_it() -> None:
    m = _Tagged()
    plain = nn.Parameter(torch.zeros(3, 4))
    with pytest.raises(
        ValueError, match=re.escape("parameter 1 of param group 0 (shape (3, 4))")
    ):
        scaled_parameters([m.w, plain], lr_scale_func_adam, lr=0.1)
    with pytest.raises(
        ValueError, match=re.escape("parameter 'weight' (shape (2, 3))")
    ):
        Adam(nn.Linear(3, 2).named_parameters())
    with pytest.raises(ValueError, match=re.escape("untagged tensor of shape (3, 4)")):
        lr_scale_func_adam(plain)


def test_allow_non_unit_scaling_params_keeps_base_lr_with_a_warning() -> None:
    m = _Tagged()
    plain = nn.Parameter(torch.zeros(3, 4))
    with pytest.warns(UserWarning, match="parameter 1 of param group 0"):
        groups = scaled_parameters(
            [m.w, plain],
            lr_scale_func_adam,
            lr=0.1,
            weight_decay=0.01,
            allow_non_unit_scaling_params=True,
        )
    assert _lrs(groups) == pytest.approx([0.1 / 4, 0.1])
    assert groups[1]["weight_decay"] == pytest.approx(0.1)


def test_missing_lr_is_an_error() -> None:
    m = _Tagged()
    with pytest.raises(ValueError, match="param group 1 has no learning rate"):
        given: list[dict[str, Any]] = [{"params": [m.w], "lr": 0.1}, {"params": [m.b]}]
        scaled_parameters(given, lr_scale_func_adam)


@pytest.mark.parametrize(
    ("shape", "fan_in"),
    [((8, 3, 5), 15), ((16, 4, 3, 3), 36), ((16, 4, 3, 3, 2), 72), ((4,), 4)],
)
def test_fan_in_of_conv_weights_is_all_but_the_first_dim(
    shape: tuple[int, ...], fan_in: int
) -> None:
    p = Parameter(torch.zeros(shape), "weight")
    assert lr_scale_func_adam(p) == pytest.approx(fan_in**-0.5)
    assert lr_scale_func_sgd("to_output_scale")(p) == pytest.approx(fan_in**0.5)


@pytest.mark.parametrize("shape", [(2, 2, 2, 2, 2, 2), ()])
def test_fan_in_of_unsupported_rank_is_an_error(shape: tuple[int, ...]) -> None:
    p = Parameter(torch.zeros(shape), "weight")
    with pytest.raises(ValueError, match=re.escape(f"shape {shape}")):
        lr_scale_func_adam(p)
    with pytest.raises(ValueError, match=re.escape(f"shape {shape}")):
        lr_scale_func_sgd("to_output_scale")(p)


def test_rank_four_norm_needs_no_fan_in() -> None:
    assert lr_scale_func_adam(Parameter(torch.zeros(2, 2, 2, 2), "norm")) == 1.0


def test_unknown_readout_constraint_is_an_error() -> None:
    with pytest.raises(ValueError, match="readout_constraint='gmean'"):
        lr_scale_func_sgd("gmean")
    with pytest.raises(ValueError, match="readout_constraint='to_input'"):
        SGD(_Tagged().parameters(), lr=0.1, readout_constraint="to_input")


def test_bad_params_and_zero_lr_are_errors() -> None:
    p = Parameter(torch.zeros(3), "bias")
    with pytest.raises(TypeError, match=re.escape("single tensor of shape (3,)")):
        scaled_parameters(p, lr_scale_func_adam, lr=0.1)
    with pytest.raises(TypeError, match="not a set"):
        scaled_parameters([{"params": {p}}], lr_scale_func_adam, lr=0.1)
    with pytest.raises(ValueError, match="learning rate, which is 0"):
        scaled_parameters([p], lr_scale_func_adam, lr=0.0, weight_decay=0.1)


def _with_grads(model: nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen)


def test_adamw_steps_like_torch_adamw_with_those_groups() -> None:
    ours, ref = _Tagged(), _Tagged()
    opt = AdamW(ours.parameters(), lr=0.1, weight_decay=1e-3)
    ref_opt = torch.optim.AdamW(
        [
            {"params": [p], "lr": 0.1 * s, "weight_decay": 1e-3 / (0.1 * s)}
            for p, s in zip(ref.parameters(), ADAM, strict=True)
        ]
    )
    for step in range(3):
        _with_grads(ours, step)
        _with_grads(ref, step)
        opt.step()
        ref_opt.step()
    for p, q in zip(ours.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    assert not torch.equal(ours.w, _Tagged().w)


def test_sgd_step_matches_the_u_mup_rule() -> None:
    model, before = _Tagged(), _Tagged()
    opt = SGD(
        model.parameters(),
        lr=0.01,
        weight_decay=0.1,
        readout_constraint="to_output_scale",
    )
    _with_grads(model, 0)
    grads = [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]
    opt.step()
    for p, p0, g, s in zip(
        model.parameters(), before.parameters(), grads, SGD_TO_OUTPUT_SCALE, strict=True
    ):
        # p ← p − η_p (g + λ_p p) with η_p λ_p = λ: the decay ignores the lr.
        expected = p0 - 0.01 * s * g - 0.1 * p0
        torch.testing.assert_close(p.detach(), expected.detach())


def test_optimizer_state_dict_round_trip() -> None:
    model = _Tagged()
    opt = Adam(model.parameters(), lr=0.1)
    _with_grads(model, 0)
    opt.step()
    fresh = Adam(model.parameters(), lr=0.1)
    fresh.load_state_dict(opt.state_dict())
    assert _lrs(fresh.param_groups) == pytest.approx([0.1 * e for e in ADAM])
    assert math.isclose(
        float(fresh.state[model.w]["step"]), float(opt.state[model.w]["step"])
    )
