"""Tests for the unit-scaled ``Embedding``.

The lookup is torch's; the unit scaling is in the weight gradient, so the module
is compared with ``U.embedding`` in both passes, and the gradient's scale is
checked against the plain one.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

import unit_scaling as uu
import unit_scaling.functional as U
from tests.helpers import unit_backward


def test_init_and_tags() -> None:
    emb = uu.Embedding(512, 64)
    tol = 6 / math.sqrt(2 * emb.weight.numel())
    assert abs(emb.weight.std().item() - 1) <= tol
    assert isinstance(emb.weight, uu.Parameter)
    assert (emb.weight.mup_type, emb.weight.mup_scaling_depth) == ("weight", None)
    assert [n for n, _ in emb.named_parameters()] == ["weight"]


def test_reset_parameters_keeps_tags_and_padding_row() -> None:
    emb = uu.Embedding(64, 16, padding_idx=3)
    weight = emb.weight
    assert torch.count_nonzero(weight[3]) == 0
    with torch.no_grad():
        weight.fill_(5)
    emb.reset_parameters()
    assert emb.weight is weight and weight.mup_type == "weight"
    assert torch.count_nonzero(weight[3]) == 0
    assert abs(weight.std().item() - 1) < 0.3


def test_calls_functional_with_padding_idx() -> None:
    emb = uu.Embedding(20, 8, padding_idx=0)
    ids = torch.tensor([[0, 1, 2, 3], [4, 0, 4, 19]])
    y_mod = emb(ids)
    grad = unit_backward(y_mod, seed=1)
    g_mod = emb.weight.grad.clone()
    emb.weight.grad = None
    y_fn = U.embedding(ids, emb.weight, padding_idx=0)
    y_fn.backward(grad)
    torch.testing.assert_close(y_mod, y_fn, rtol=0, atol=0)
    torch.testing.assert_close(g_mod, emb.weight.grad, rtol=0, atol=0)
    assert torch.count_nonzero(g_mod[0]) == 0  # padding_idx gets no gradient


def test_forward_is_plain_lookup_and_grad_is_scaled() -> None:
    emb = uu.Embedding(16, 4)
    ids = torch.randint(16, (5, 8), generator=torch.Generator().manual_seed(0))
    y = emb(ids)
    torch.testing.assert_close(y, F.embedding(ids, emb.weight), rtol=0, atol=0)
    grad = unit_backward(y, seed=1)
    plain = torch.zeros(16, 4).index_add_(0, ids.flatten(), grad.reshape(-1, 4))
    # (num_embeddings / lookups)^½ = (16 / 40)^½
    torch.testing.assert_close(emb.weight.grad, plain * (16 / 40) ** 0.5)
