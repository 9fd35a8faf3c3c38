"""Tests for the unit-scaled activation layers: ``GELU``, ``SiLU``, ``Softmax``,
``Dropout``.

Each module must equal its ``U.*`` function with the module's settings, in the
forward pass and in the input gradient (where the constraint shows). Settings are
chosen away from the defaults so that a module ignoring one fails.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn

import unit_scaling as uu
import unit_scaling.functional as U
from tests.helpers import assert_unit_scale, randn, unit_backward


def _run(fn: Callable[[Tensor], Tensor], x: Tensor) -> tuple[Tensor, Tensor]:
    x.grad = None
    out = fn(x)
    unit_backward(out, seed=1)
    return out.detach(), x.grad.clone()


def _assert_same(a: tuple[Tensor, Tensor], b: tuple[Tensor, Tensor]) -> None:
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=0)
    torch.testing.assert_close(a[1], b[1], rtol=0, atol=0)


@pytest.mark.parametrize(
    ("kwargs", "fn"),
    [
        ({}, lambda x: U.gelu(x)),
        (
            {"approximate": "tanh", "mult": 3.0, "constraint": None},
            lambda x: U.gelu(x, "tanh", 3.0, None),
        ),
        (
            {"mult": 0.5, "constraint": "gmean"},
            lambda x: U.gelu(x, mult=0.5, constraint="gmean"),
        ),
    ],
)
def test_gelu_calls_functional(kwargs: dict, fn: Callable[[Tensor], Tensor]) -> None:
    x = randn(16, 32, seed=0)
    _assert_same(_run(uu.GELU(**kwargs), x), _run(fn, x))


@pytest.mark.parametrize(
    ("kwargs", "fn"),
    [
        ({}, lambda x: U.silu(x)),
        ({"mult": 2.0, "constraint": None}, lambda x: U.silu(x, False, 2.0, None)),
    ],
)
def test_silu_calls_functional(kwargs: dict, fn: Callable[[Tensor], Tensor]) -> None:
    x = randn(16, 32, seed=0)
    _assert_same(_run(uu.SiLU(**kwargs), x), _run(fn, x))


@pytest.mark.parametrize(
    ("kwargs", "fn"),
    [
        ({"dim": -1}, lambda x: U.softmax(x, -1)),
        (
            {"dim": 1, "mult": 4.0, "constraint": None},
            lambda x: U.softmax(x, 1, constraint=None, mult=4.0),
        ),
    ],
)
def test_softmax_calls_functional(kwargs: dict, fn: Callable[[Tensor], Tensor]) -> None:
    x = randn(4, 16, 32, seed=0)
    _assert_same(_run(uu.Softmax(**kwargs), x), _run(fn, x))


@pytest.mark.parametrize(
    "make",
    [
        lambda: uu.GELU(constraint="bogus"),
        lambda: uu.SiLU(constraint="bogus"),
        lambda: uu.Softmax(-1, constraint="bogus"),
    ],
)
def test_unknown_constraint_raises_at_construction(make: Callable[[], object]) -> None:
    with pytest.raises(ValueError, match="bogus"):
        make()


def test_activation_modules_have_no_parameters() -> None:
    for module in (uu.GELU(), uu.SiLU(), uu.Softmax(-1), uu.Dropout()):
        assert list(module.parameters()) == []


def test_repr_shows_settings() -> None:
    assert "mult=2.0" in repr(uu.GELU(mult=2.0))
    assert "constraint=None" in repr(uu.SiLU(constraint=None))
    assert "dim=1" in repr(uu.Softmax(1))


# --- Dropout -----------------------------------------------------------------------


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_train_matches_functional(p: float) -> None:
    x = randn(64, 64, seed=0)
    dropout = uu.Dropout(p)
    torch.manual_seed(7)
    y_mod, g_mod = _run(dropout, x)
    torch.manual_seed(7)
    y_fn, g_fn = _run(lambda x: U.dropout(x, p, training=True), x)
    _assert_same((y_mod, g_mod), (y_fn, g_fn))
    # Kept values are divided by sqrt(1 - p) (torch divides by 1 - p), so the
    # output stays unit-scaled; 4096 samples give a 6σ tolerance ≈ 0.07 (plus the
    # binomial noise of the mask), 0.1 is safe.
    kept = y_mod != 0
    torch.testing.assert_close(y_mod[kept], x.detach()[kept] / math.sqrt(1 - p))
    assert_unit_scale(y_mod, rtol=0.1, name="dropout output")
    assert_unit_scale(g_mod, rtol=0.1, name="dropout grad")


def test_dropout_eval_is_identity() -> None:
    dropout = uu.Dropout(0.5).eval()
    x = randn(32, 32, seed=0)
    y = dropout(x)
    assert torch.equal(y, x)
    grad = unit_backward(y, seed=1)
    assert torch.equal(x.grad, grad)


@pytest.mark.parametrize(
    ("module", "fn"),
    [
        (uu.Dropout(0.3, inplace=True), lambda x: U.dropout(x, 0.3)),
        (uu.SiLU(inplace=True, mult=2.0), lambda x: U.silu(x, mult=2.0)),
    ],
    ids=["dropout", "silu"],
)
def test_inplace_modules_overwrite_their_input(
    module: nn.Module, fn: Callable[[Tensor], Tensor]
) -> None:
    x = randn(16, 32, seed=0)
    h, h_ref = x * 1.0, x.detach() * 1.0  # non-leaf, so it may be overwritten
    torch.manual_seed(7)
    y = module(h)
    torch.manual_seed(7)
    y_ref = fn(h_ref)
    assert y is h and torch.equal(h, y_ref)
    assert "inplace=True" in repr(module)
