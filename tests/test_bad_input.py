"""The bad-input class across the package: dimensions out of range, zero-size
shapes, non-positive sizes and counts. Each gets an early error naming the op,
the argument and what was expected (``IndexError`` for a dimension, as torch
raises it; ``ValueError``/``TypeError`` otherwise), or, where torch accepts the
input (zero-size tensors), torch's result with finite scales."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import unit_scaling as uu
import unit_scaling.functional as U
from unit_scaling.core.functional import (
    logarithmic_interpolation,
    transformer_residual_scaling_rule,
)

X = torch.randn(2, 3)
INDEX = torch.tensor([0, 1])

DIM_OUT_OF_RANGE: list[tuple[str, Callable[[], Any]]] = [
    ("softmax", lambda: U.softmax(X, dim=5)),
    ("softmax", lambda: U.softmax(X, dim=-3)),
    ("sum", lambda: U.sum(X, dim=2)),
    ("mean", lambda: U.mean(X, dim=(0, 7))),
    ("index_add", lambda: U.index_add(X, 4, INDEX, X)),
    ("scatter_add", lambda: U.scatter_add(X, 2, INDEX[None].expand(2, 2), X)),
    ("gather", lambda: U.gather(X, -5, INDEX[None].expand(2, 2))),
    ("index_select", lambda: U.index_select(X, 3, INDEX)),
]


@pytest.mark.parametrize(("op", "call"), DIM_OUT_OF_RANGE)
def test_dim_out_of_range_is_an_index_error(op: str, call: Callable[[], Any]) -> None:
    with pytest.raises(IndexError, match=rf"U\.{op}: dim=.* out of range .*\[-2, 1\]"):
        call()


def test_dim_must_be_an_int() -> None:
    with pytest.raises(TypeError, match=r"U\.softmax: dim must be an int, got str"):
        U.softmax(X, dim="1")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: uu.Linear(0, 4), r"uu\.Linear: in_features must be a positive int"),
        (lambda: uu.Linear(4, -2), r"uu\.Linear: out_features must be a positive"),
        (lambda: uu.LinearReadout(4, 0), r"uu\.LinearReadout: out_features"),
        (lambda: uu.Embedding(0, 4), r"uu\.Embedding: num_embeddings must be"),
        (lambda: uu.Embedding(8, 0), r"uu\.Embedding: embedding_dim must be"),
        (lambda: uu.MLP(8, 0), r"uu\.MLP: expansion_factor must be a positive"),
        (lambda: uu.MLP(0), r"uu\.MLP: hidden_size must be a positive"),
        (lambda: logarithmic_interpolation(0.5, 0.0, 1.0), "lower and upper must be"),
        (lambda: logarithmic_interpolation(0.5, 1.0, -1.0), "lower and upper must be"),
        (lambda: transformer_residual_scaling_rule()(0, 0), "0 <= index < layers"),
        (lambda: transformer_residual_scaling_rule()(4, 4), "0 <= index < layers"),
        (lambda: transformer_residual_scaling_rule(-1.0), "residual_mult must be"),
        (
            lambda: transformer_residual_scaling_rule(1.0, float("inf")),
            "residual_attn_ratio must be",
        ),
    ],
)
def test_non_positive_sizes_and_counts(make: Callable[[], Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()


def test_sizes_must_be_ints() -> None:
    with pytest.raises(TypeError, match=r"uu\.Linear: in_features must be an int"):
        uu.Linear(4.0, 2)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("op", "args"),
    [
        ("linear", lambda: (torch.randn(2, 0), torch.randn(4, 0))),  # no fan-in
        ("linear", lambda: (torch.randn(0, 4), torch.randn(3, 4))),  # empty batch
        ("linear", lambda: (torch.randn(2, 4), torch.randn(0, 4))),  # no fan-out
        ("softmax", lambda: (torch.randn(2, 0), 1)),
        ("sum", lambda: (torch.randn(0, 3), 0)),
    ],
)
def test_zero_size_tensors_behave_as_in_torch(
    op: str, args: Callable[[], tuple[Any, ...]]
) -> None:
    inputs = [a.requires_grad_() if isinstance(a, torch.Tensor) else a for a in args()]
    out = getattr(U, op)(*inputs)
    reference = getattr(torch.nn.functional, op, None) or getattr(torch, op)
    expected = reference(
        *[a.detach() if isinstance(a, torch.Tensor) else a for a in inputs]
    )
    assert out.shape == expected.shape
    out.sum().backward()
    for a in inputs:
        if isinstance(a, torch.Tensor):
            assert a.grad is not None and torch.isfinite(a.grad).all()
