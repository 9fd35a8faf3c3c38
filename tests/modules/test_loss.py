"""Tests for the unit-scaled ``CrossEntropyLoss``.

The loss value is torch's cross-entropy of ``mult``-scaled logits; the module must
equal ``U.cross_entropy`` with its settings in both passes, and reject the torch
arguments it cannot honour when it is built, not when it is first called.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import unit_scaling as uu
import unit_scaling.functional as U
from tests.helpers import randn


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"mult": 2.5},
        {"reduction": "sum", "ignore_index": 3},
        {"reduction": "none", "mult": 0.5},
    ],
)
def test_calls_functional(kwargs: dict) -> None:
    logits = randn(12, 7, seed=0)
    target = torch.randint(7, (12,), generator=torch.Generator().manual_seed(1))
    target[0] = 3
    loss = uu.CrossEntropyLoss(**kwargs)(logits, target)
    loss.sum().backward()
    grad = logits.grad.clone()
    logits.grad = None
    expected = U.cross_entropy(logits, target, **kwargs)
    expected.sum().backward()
    torch.testing.assert_close(loss, expected, rtol=0, atol=0)
    torch.testing.assert_close(grad, logits.grad, rtol=0, atol=0)
    # The value is torch's loss of mult-scaled logits.
    mult = kwargs.pop("mult", 1.0)
    plain = F.cross_entropy(logits.detach() * mult, target, **kwargs)
    torch.testing.assert_close(loss.detach(), plain)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"label_smoothing": 0.1}, "label_smoothing"),
        ({"weight": torch.ones(4)}, "weight"),
        ({"size_average": True}, "size_average"),
        ({"reduce": False}, "reduce"),
        ({"reduction": "max"}, "reduction"),
    ],
)
def test_unsupported_arguments_raise_at_construction(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        uu.CrossEntropyLoss(**kwargs)


def test_has_no_parameters_and_repr() -> None:
    loss = uu.CrossEntropyLoss(mult=2.0)
    assert list(loss.parameters()) == []
    assert "mult=2.0" in repr(loss)
