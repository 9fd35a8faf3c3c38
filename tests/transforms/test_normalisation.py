"""``unit_scale`` and a loss normalised by a count the caller passes.

Hugging Face's losses compute ``loss_sum / num_items_in_batch`` when a training
loop passes the step's count (``Trainer`` passes a float tensor; a custom loop
may pass an int). ``unit_scale`` rewrites that into ``U.step_mean``, so that
micro-batches accumulate to the gradient of one call on the whole step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tests.helpers import tiny_gpt2, tiny_llama
from unit_scaling.transforms import unit_scale

transformers = pytest.importorskip("transformers")

VOCAB, BATCH, LENGTH = 256, 8, 32
LABELS = BATCH * (LENGTH - 1)  # causal LM losses shift: one label fewer per row


MODELS = {"gpt2": tiny_gpt2, "llama": tiny_llama}
# In the default run: each claim for one model and count type; every model,
# count type and k under `integration` (tests/conftest.py).
DEFAULT_RUN = {
    "test_a_step_count_from_the_caller_keeps_unit_scale[llama-float-tensor]",
    "test_a_step_count_from_the_caller_keeps_unit_scale[gpt2-int]",
    "test_micro_batches_normalised_by_the_step_count_add_up_to_the_whole_batch"
    "[gpt2-float-tensor-2]",
    "test_micro_batches_normalised_by_the_step_count_add_up_to_the_whole_batch"
    "[llama-int-tensor-4]",
    "test_the_count_is_read_on_every_call[llama]",
    "test_the_loss_value_is_the_plain_one[llama]",
    "test_a_literal_divisor_is_the_models_own_normalisation",
    "test_an_unrecognised_normalisation_by_a_count_is_named_once",
    "test_a_count_also_used_as_data_is_not_a_normaliser",
    "test_a_sum_divided_by_a_count_from_the_caller_is_its_share",
}
COUNTS: dict[str, Callable[[int], Any]] = {
    "float-tensor": lambda n: torch.tensor(float(n)),
    "int-tensor": lambda n: torch.tensor(n),
    "int": lambda n: n,
}


@pytest.fixture(scope="module", params=list(MODELS))
def scaled(request: pytest.FixtureRequest) -> nn.Module:
    torch.manual_seed(0)
    return unit_scale(MODELS[request.param](), residual_scaling="u-μP")


def _batch(seed: int = 0) -> Tensor:
    return torch.randint(
        VOCAB, (BATCH, LENGTH), generator=torch.Generator().manual_seed(seed)
    )


def _grads(model: nn.Module) -> dict[str, Tensor]:
    out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return out


def _median_weight_rms(grads: dict[str, Tensor]) -> float:
    values = sorted(
        g.pow(2).mean().sqrt().item() for g in grads.values() if g.dim() == 2
    )
    return values[len(values) // 2]


@pytest.mark.parametrize("kind", list(COUNTS))
def test_a_step_count_from_the_caller_keeps_unit_scale(
    scaled: nn.Module, kind: str
) -> None:
    ids = _batch()
    scaled(ids, labels=ids, num_items_in_batch=COUNTS[kind](LABELS)).loss.backward()
    assert 0.5 <= _median_weight_rms(_grads(scaled)) <= 2


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("kind", list(COUNTS))
def test_micro_batches_normalised_by_the_step_count_add_up_to_the_whole_batch(
    scaled: nn.Module, kind: str, k: int
) -> None:
    ids = _batch()
    scaled(ids, labels=ids).loss.backward()
    full = _grads(scaled)
    for part in ids.chunk(k):
        loss = scaled(part, labels=part, num_items_in_batch=COUNTS[kind](LABELS)).loss
        loss.backward()
    accumulated = _grads(scaled)
    for name, g in full.items():
        error = (accumulated[name] - g).norm() / g.norm()
        assert error < 1e-5, (name, float(error))


def test_the_count_is_read_on_every_call(scaled: nn.Module) -> None:
    ids = _batch()[:4]
    gradients = []
    for count in (100.0, 400.0):
        scaled(ids, labels=ids, num_items_in_batch=torch.tensor(count)).loss.backward()
        gradients.append(_grads(scaled))
    for name, g in gradients[0].items():
        torch.testing.assert_close(gradients[1][name] * 2, g, rtol=1e-5, atol=1e-8)


def test_the_loss_value_is_the_plain_one(scaled: nn.Module) -> None:
    ids = _batch()
    mean = scaled(ids, labels=ids).loss
    summed = scaled(ids, labels=ids, num_items_in_batch=torch.tensor(2.0 * LABELS)).loss
    torch.testing.assert_close(summed * 2, mean, rtol=1e-6, atol=0)
    ops = [r for r in scaled.unit_scale_report().ops if r.op == "step_mean"]
    assert ops and ops[0].how == "analytic"


class _Divided(nn.Module):
    """A loss summed over targets and divided by ``divisor`` (from the caller
    or a literal), or a mean divided by a count the caller passes."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.proj = nn.Linear(32, 50)

    def forward(self, x: Tensor, targets: Tensor, count: Any = None) -> Tensor:
        logits = self.proj(x)
        if self.mode == "literal":
            return F.cross_entropy(logits, targets, reduction="sum") / 8
        if self.mode == "mean":
            return F.cross_entropy(logits, targets) / count
        if self.mode == "data":  # the count also scales the features
            return (
                F.cross_entropy(self.proj(x * count), targets, reduction="sum") / count
            )
        return F.cross_entropy(logits, targets, reduction="sum") / count


def _inputs() -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(64, 32, generator=g), torch.randint(50, (64,), generator=g)


def test_a_literal_divisor_is_the_models_own_normalisation() -> None:
    model = unit_scale(_Divided("literal"))
    x, t = _inputs()
    model(x, t).backward()
    assert not [r for r in model.unit_scale_report().ops if r.op == "step_mean"]
    assert model.proj.weight.grad is not None
    assert 0.5 <= model.proj.weight.grad.pow(2).mean().sqrt().item() <= 2


def test_an_unrecognised_normalisation_by_a_count_is_named_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = unit_scale(_Divided("mean"))
    x, t = _inputs()
    with caplog.at_level(logging.WARNING, logger="unit_scaling"):
        model(x, t, torch.tensor(4.0))
        model(x[:32], t[:32], torch.tensor(4.0))
    warnings = [r for r in caplog.records if "does not recognise" in r.getMessage()]
    assert len(warnings) == 1
    assert "count" in warnings[0].getMessage()


def test_a_count_also_used_as_data_is_not_a_normaliser() -> None:
    model = unit_scale(_Divided("data"))
    x, t = _inputs()
    model(x, t, torch.tensor(2.0)).backward()
    assert not [r for r in model.unit_scale_report().ops if r.op == "step_mean"]


def test_a_sum_divided_by_a_count_from_the_caller_is_its_share() -> None:
    model = unit_scale(_Divided("count"))
    x, t = _inputs()
    model(x, t, torch.tensor(64.0)).backward()
    whole = model.proj.weight.grad.clone()  # type: ignore[union-attr]
    model.zero_grad()
    model(x, t, torch.tensor(256.0)).backward()
    quarter = model.proj.weight.grad  # type: ignore[union-attr]
    torch.testing.assert_close(quarter * 2, whole, rtol=1e-5, atol=1e-8)
    assert [r for r in model.unit_scale_report().ops if r.op == "step_mean"]
