"""The step of ``uu.optim``'s optimizers: torch's update, made group by group by the
optimizer built the way it was before batching (``scaled_parameters`` handed to
torch's class), bit for bit, in fewer kernels; schedulers, checkpoints (old ones
too) and hooks as before."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from benchmarks.op_counts import OpCounter
from unit_scaling import _torch_internals as internals
from unit_scaling._optim_step import merge_equal_groups
from unit_scaling.optim import (
    SGD,
    Adam,
    AdamW,
    lr_scale_func_adam,
    lr_scale_func_sgd,
    scaled_parameters,
)
from unit_scaling.parameter import Parameter

LR, DECAY = 0.05, 1e-2


class _Model(nn.Module):
    """Parameters of several u-μP learning rates, some shared, two dtypes."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)

        def make(shape: tuple[int, ...], *tags: Any, dtype: Any = None) -> Parameter:
            data = torch.randn(shape, generator=gen, dtype=torch.float64)
            return Parameter(data.to(dtype or torch.float32), *tags)

        self.embedding = make((10, 8), "weight")
        self.hidden0 = make((8, 8), "weight", 2)  # hidden*: one learning rate
        self.hidden1 = make((8, 8), "weight", 2)
        self.bias = make((8,), "bias", 2)
        self.hidden2 = make((8, 8), "weight", 2)
        self.wide = make((8, 32), "weight", 2)
        self.norm = make((8,), "norm")
        self.wide64 = make((4, 8), "weight", 2, dtype=torch.float64)  # hidden's lr
        self.readout = make((10, 8), "output")


def _with_grads(model: nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen, dtype=p.dtype)


def _unbatched(
    kind: str, params: Iterator[nn.Parameter], options: dict[str, Any]
) -> torch.optim.Optimizer:
    """The optimizer as uu.optim built it before batching: u-μP groups, torch's
    class, torch's group-by-group step."""
    rule = lr_scale_func_sgd(None) if kind == "SGD" else lr_scale_func_adam
    decay = options.get("weight_decay", 0)
    groups = scaled_parameters(params, rule, LR, decay)
    torch_class = getattr(torch.optim, kind)
    optimizer: torch.optim.Optimizer = torch_class(groups, lr=LR, **options)
    return optimizer


OURS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "SGD": SGD,
    "Adam": Adam,
    "AdamW": AdamW,
}


def _assert_same(
    model: nn.Module,
    reference: nn.Module,
    opt: torch.optim.Optimizer,
    ref_opt: torch.optim.Optimizer,
) -> None:
    for (name, p), q in zip(
        model.named_parameters(), reference.parameters(), strict=True
    ):
        assert torch.equal(p, q), name
        state, ref_state = opt.state[p], ref_opt.state[q]
        assert state.keys() == ref_state.keys(), name
        for key, value in state.items():
            assert torch.equal(value, ref_state[key]), (name, key)


def _step_both(
    model: nn.Module,
    reference: nn.Module,
    opt: torch.optim.Optimizer,
    ref_opt: torch.optim.Optimizer,
    steps: int,
    schedulers: tuple[Any, ...] = (),
) -> None:
    """Take ``steps`` steps of both optimizers on the same gradients (then of
    ``schedulers``, after each), and check that parameters and state are
    bitwise the same."""
    for step in range(steps):
        _with_grads(model, step)
        _with_grads(reference, step)
        opt.step()
        ref_opt.step()
        for scheduler in schedulers:
            scheduler.step()
    _assert_same(model, reference, opt, ref_opt)


CASES = [
    ("AdamW", {"weight_decay": DECAY}),
    ("AdamW", {"weight_decay": DECAY, "amsgrad": True, "betas": (0.8, 0.9)}),
    ("AdamW", {"weight_decay": DECAY, "maximize": True, "eps": 1e-6}),
    ("Adam", {}),
    ("Adam", {"weight_decay": DECAY}),  # coupled: a decay per learning rate
    ("Adam", {"weight_decay": DECAY, "maximize": True}),
    ("SGD", {}),
    ("SGD", {"momentum": 0.9, "weight_decay": DECAY, "nesterov": True}),
]


@pytest.mark.parametrize("foreach", [True, False, None], ids=lambda f: f"foreach={f}")
@pytest.mark.parametrize(("kind", "options"), CASES, ids=lambda c: str(c))
def test_steps_equal_the_unbatched_optimizer_bit_for_bit(
    kind: str, options: dict[str, Any], foreach: bool | None
) -> None:
    model, reference = _Model(), _Model()
    options = {**options, "foreach": foreach}
    opt = OURS[kind](model.parameters(), lr=LR, **options)
    ref_opt = _unbatched(kind, reference.parameters(), options)
    _step_both(model, reference, opt, ref_opt, steps=4)
    assert not torch.equal(model.hidden0, _Model().hidden0)


@pytest.mark.parametrize("kind", ["Adam", "AdamW", "SGD"])
def test_fused_steps_equal_the_unbatched_optimizer(kind: str) -> None:
    model, reference = _Model(), _Model()
    options = {"fused": True, "weight_decay": DECAY}
    opt = OURS[kind](model.parameters(), lr=LR, **options)
    ref_opt = _unbatched(kind, reference.parameters(), options)
    _step_both(model, reference, opt, ref_opt, steps=3)


def test_user_groups_with_their_own_settings() -> None:
    def groups(m: _Model) -> list[dict[str, Any]]:
        return [
            {"params": [m.hidden0, m.hidden1], "lr": 0.2, "betas": (0.8, 0.9)},
            {"params": [m.hidden2, m.bias], "weight_decay": 0.1},
            {"params": [m.embedding, m.wide, m.norm, m.wide64, m.readout]},
        ]

    model, reference = _Model(), _Model()
    opt = AdamW(groups(model), lr=LR, weight_decay=DECAY, foreach=True)
    scaled = scaled_parameters(groups(reference), lr_scale_func_adam, LR, DECAY)
    ref_opt = torch.optim.AdamW(scaled, lr=LR, foreach=True)
    _step_both(model, reference, opt, ref_opt, steps=3)


def _calls_of_second_step(opt: torch.optim.Optimizer, model: nn.Module) -> OpCounter:
    _with_grads(model, 0)
    opt.step()  # creates the state
    _with_grads(model, 1)
    with OpCounter() as calls:
        opt.step()
    return calls


def test_adam_foreach_runs_each_kernel_once_whatever_the_learning_rates() -> None:
    model = _Model()
    lrs = {g["lr"] for g in AdamW(model.parameters(), lr=LR).param_groups}
    assert len(lrs) == 5
    opt = AdamW(model.parameters(), lr=LR, weight_decay=DECAY, foreach=True)
    calls = _calls_of_second_step(opt, model).counts
    # Two dtypes: each foreach kernel once per (device, dtype), as torch's own.
    assert calls["_foreach_addcdiv_"] == calls["_foreach_lerp_"] == 2
    assert calls["_foreach_mul_"] == 4  # the decay, and the second moment
    # torch's AdamW, one group per parameter, launched every kernel per parameter.
    ref_calls = _calls_of_second_step(
        _unbatched("AdamW", model.parameters(), {"foreach": True}), model
    ).counts
    assert ref_calls["_foreach_addcdiv_"] == len(list(model.parameters()))


def test_fused_and_sgd_run_once_per_distinct_setting() -> None:
    model = _Model()
    fused = AdamW(model.parameters(), lr=LR, fused=True)
    # Torch's fused and foreach kernels take one lr per call, and one dtype.
    calls = len({(g["lr"], g["params"][0].dtype) for g in fused.param_groups})
    assert calls == 6 and len(fused.param_groups) == 9
    assert _calls_of_second_step(fused, model).counts["_fused_adamw_"] == calls
    sgd = SGD(model.parameters(), lr=LR, momentum=0.9, foreach=True)
    # Per call: the momentum's `add_` and the update's.
    assert _calls_of_second_step(sgd, model).counts["_foreach_add_"] == 2 * calls


def test_foreach_default_counts_a_tagged_parameter_as_a_parameter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Subclass(nn.Parameter):
        pass

    tagged = Parameter(torch.zeros(2), "weight")
    plain = nn.Parameter(torch.zeros(2))
    other = Subclass(torch.zeros(2))
    monkeypatch.setattr(internals, "foreach_kernel_devices", lambda: ["cpu"])
    for params, expected in (([tagged, plain], True), ([tagged, other], None)):
        (group,) = merge_equal_groups([{"params": params, "lr": 0.1, "foreach": None}])
        assert group["foreach"] is expected
    tensor_lr = {"params": [tagged], "lr": torch.tensor(0.1), "foreach": None}
    assert merge_equal_groups([tensor_lr])[0]["foreach"] is None
    monkeypatch.undo()
    (group,) = merge_equal_groups([{"params": [tagged], "lr": 0.1, "foreach": None}])
    assert group["foreach"] is None  # no foreach kernels for CPU tensors


def test_merge_keeps_order_and_compares_settings_strictly() -> None:
    a, b, c, d, e = (torch.zeros(i + 1) for i in range(5))
    lr = torch.tensor(0.1)
    groups: list[dict[str, Any]] = [
        {"params": [a], "lr": 0.1, "betas": (0.9, 0.99), "initial_lr": 1.0},
        {"params": [b], "lr": 0.1, "betas": (0.9, 0.98)},
        {"params": [c], "lr": 0.1, "betas": (0.9, 0.99), "initial_lr": 2.0},
        {"params": [d], "lr": lr},
        {"params": [e], "lr": torch.tensor(0.1)},  # equal value, other tensor
    ]
    merged = merge_equal_groups(groups)
    assert [g["params"] for g in merged] == [[a, c], [b], [d], [e]]
    assert groups[0]["params"] == [a]  # the groups given are left alone
    assert merged[2]["lr"] is lr
    flags = merge_equal_groups([{"params": [a], "x": True}, {"params": [b], "x": 1}])
    assert len(flags) == 2
    named = merge_equal_groups(
        [
            {"params": [a], "param_names": ["a"], "lr": 0.1},
            {"params": [b], "lr": 0.1},
            {"params": [c], "param_names": ["c"], "lr": 0.1},
        ]
    )
    assert [g.get("param_names") for g in named] == [["a", "c"], None]


SCHEDULERS: dict[str, Callable[[torch.optim.Optimizer], Any]] = {
    "LambdaLR": lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: 0.7**s),
    "CosineAnnealingLR": lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(
        o, T_max=4
    ),
    "OneCycleLR": lambda o: torch.optim.lr_scheduler.OneCycleLR(
        o, max_lr=[10 * g["lr"] for g in o.param_groups], total_steps=6
    ),
}


@pytest.mark.parametrize("schedule", SCHEDULERS)
@pytest.mark.parametrize("kind", ["AdamW", "SGD"])
def test_schedules_scale_each_parameters_lr_as_before(kind: str, schedule: str) -> None:
    model, reference = _Model(), _Model()
    options = {"foreach": True, "weight_decay": DECAY}
    if kind == "SGD":
        options["momentum"] = 0.9
    opt = OURS[kind](model.parameters(), lr=LR, **options)
    ref_opt = _unbatched(kind, reference.parameters(), options)
    scheduler, ref_scheduler = SCHEDULERS[schedule](opt), SCHEDULERS[schedule](ref_opt)
    for step in range(5):
        _with_grads(model, step)
        _with_grads(reference, step)
        opt.step()
        ref_opt.step()
        scheduler.step()
        ref_scheduler.step()
        lrs = [g["lr"] for g in opt.param_groups]
        assert lrs == [g["lr"] for g in ref_opt.param_groups]
    _assert_same(model, reference, opt, ref_opt)
    # The u-μP ratios between the parameters' learning rates survive the schedule.
    first = opt.param_groups[0]["lr"] / (LR * opt.param_groups[0]["mup_lr_scale"])
    for group in opt.param_groups:
        assert group["lr"] == pytest.approx(first * LR * group["mup_lr_scale"])


def test_tensor_learning_rate_follows_a_schedule() -> None:
    model, reference = _Model(), _Model()
    opt = AdamW(model.parameters(), lr=torch.tensor(LR))
    ref_opt = torch.optim.AdamW(
        scaled_parameters(reference.parameters(), lr_scale_func_adam, torch.tensor(LR))
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5**s)
    ref_scheduler = torch.optim.lr_scheduler.LambdaLR(ref_opt, lambda s: 0.5**s)
    _step_both(model, reference, opt, ref_opt, 3, (scheduler, ref_scheduler))


def _through_a_file(saved: dict[str, Any]) -> dict[str, Any]:
    buffer = io.BytesIO()
    torch.save(saved, buffer)
    buffer.seek(0)
    loaded: dict[str, Any] = torch.load(buffer)
    return loaded


def test_resumes_from_a_checkpoint_saved_before_batching() -> None:
    """A state dict of the optimizer as built before (one torch group per
    parameter) loads, and training goes on as it would have."""
    old_model, model = _Model(), _Model()
    old = _unbatched("AdamW", old_model.parameters(), {"weight_decay": DECAY})
    scheduler = torch.optim.lr_scheduler.LambdaLR(old, lambda s: 0.8**s)
    for step in range(2):
        _with_grads(old_model, step)
        old.step()
        scheduler.step()
    model.load_state_dict(old_model.state_dict())
    opt = AdamW(model.parameters(), lr=LR, weight_decay=DECAY, foreach=True)
    resumed = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.8**s)
    opt.load_state_dict(_through_a_file(old.state_dict()))
    resumed.load_state_dict(_through_a_file(scheduler.state_dict()))
    assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in old.param_groups]
    for step in range(2, 5):
        _with_grads(old_model, step)
        _with_grads(model, step)
        old.step()
        opt.step()
        scheduler.step()
        resumed.step()
    _assert_same(model, old_model, opt, old)


def test_state_dict_round_trip_mid_training() -> None:
    model, again = _Model(), _Model()
    opt = AdamW(model.parameters(), lr=LR, weight_decay=DECAY, foreach=True)
    for step in range(2):
        _with_grads(model, step)
        opt.step()
    again.load_state_dict(model.state_dict())
    resumed = AdamW(again.parameters(), lr=LR, weight_decay=DECAY, foreach=True)
    resumed.load_state_dict(_through_a_file(opt.state_dict()))
    assert resumed.state_dict()["param_groups"] == opt.state_dict()["param_groups"]
    for step in range(2, 4):
        _with_grads(model, step)
        _with_grads(again, step)
        opt.step()
        resumed.step()
    _assert_same(again, model, resumed, opt)


@pytest.mark.parametrize("foreach", [True, False])
def test_step_hooks_run_once(foreach: bool) -> None:
    """Even once torch's own class has had an instance (and its ``step`` the
    wrapper that runs hooks)."""
    model = _Model()
    torch.optim.AdamW(nn.Linear(2, 2).parameters())
    opt = AdamW(model.parameters(), lr=LR, foreach=foreach)
    seen: list[str] = []
    opt.register_step_pre_hook(lambda *_: seen.append("pre"))
    opt.register_step_post_hook(lambda *_: seen.append("post"))
    _with_grads(model, 0)
    opt.step()
    assert seen == ["pre", "post"]


def test_closure_is_evaluated_once_and_its_loss_returned() -> None:
    model = _Model()
    opt = Adam(model.parameters(), lr=LR, foreach=True)
    calls = []

    def closure() -> Tensor:
        calls.append(torch.is_grad_enabled())
        opt.zero_grad()
        loss = (model.hidden0**2).sum()
        loss.backward()  # type: ignore[no-untyped-call]
        return loss

    with torch.no_grad():
        loss = opt.step(closure)
    assert calls == [True]
    assert isinstance(loss, Tensor) and loss > 0


def test_parameters_without_gradients_are_left_alone() -> None:
    model = _Model()
    opt = AdamW(model.parameters(), lr=LR, weight_decay=DECAY, foreach=True)
    before = model.wide.detach().clone()
    _with_grads(model, 0)
    model.wide.grad = None
    opt.step()
    assert torch.equal(model.wide, before)
    assert len(opt.state[model.wide]) == 0
    assert not torch.equal(model.hidden0.grad, torch.zeros_like(model.hidden0))
    assert len(opt.state[model.hidden0]) == 3
