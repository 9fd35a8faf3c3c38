"""Tests for the unit-scaled ``embedding``.

The weight-gradient scale ``(num_embeddings / lookups)^½`` is restated here.
Tolerance: with uniformly random indices a weight-gradient row sums a Poisson
number of unit terms with mean ``lookups / num_embeddings``, so its mean square is
1 after scaling; over 64k weight elements the RMS is within a few percent, and
``rtol=0.1`` leaves a wide margin.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import unit_scaling.functional as U
from tests.helpers import assert_unit_scale, gradcheck_scaled, randn, unit_backward


def _indices(*shape: int, high: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, shape, generator=gen)


@pytest.mark.parametrize("index_shape", [(32, 128), (8192,), (4, 4, 64)], ids=str)
@pytest.mark.parametrize("padding_idx", [None, 3])
def test_embedding_matches_torch_with_scaled_weight_grad(
    index_shape: tuple[int, ...], padding_idx: int | None
) -> None:
    vocab = 1024
    idx = _indices(*index_shape, high=vocab)
    weight = randn(vocab, 64, seed=1)
    y = U.embedding(idx, weight, padding_idx)
    grad = unit_backward(y)
    w_ref = weight.detach().requires_grad_()
    F.embedding(idx, w_ref, padding_idx).backward(grad)
    scale = (vocab / idx.numel()) ** 0.5
    torch.testing.assert_close(y, F.embedding(idx, weight.detach()))
    torch.testing.assert_close(weight.grad, scale * w_ref.grad)
    assert_unit_scale(y, name="output")
    if padding_idx is not None:
        assert not weight.grad[padding_idx].any()
    else:
        assert_unit_scale(weight.grad, name="weight grad")


def test_embedding_accepts_int32_indices() -> None:
    idx = _indices(16, high=10).int()
    weight = randn(10, 4)
    torch.testing.assert_close(U.embedding(idx, weight), F.embedding(idx, weight))


def test_embedding_gradcheck() -> None:
    idx = _indices(3, 5, high=7)
    weight = torch.randn(7, 4, dtype=torch.float64, requires_grad=True)
    assert gradcheck_scaled(
        lambda w: U.embedding(idx, w), [weight], 1.0, [(7 / 15) ** 0.5]
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool])
def test_embedding_rejects_non_integer_input(dtype: torch.dtype) -> None:
    with pytest.raises(TypeError, match="input must hold integer indices"):
        U.embedding(torch.zeros(4, dtype=dtype), randn(8, 4))


@pytest.mark.parametrize(
    "kwargs",
    [{"max_norm": 1.0}, {"scale_grad_by_freq": True}, {"sparse": True}],
    ids=lambda kw: next(iter(kw)),
)
def test_embedding_rejects_unsupported_arguments(kwargs: dict[str, object]) -> None:
    (name,) = kwargs
    with pytest.raises(ValueError, match=f"'{name}' argument has not been implemented"):
        U.embedding(_indices(4, high=8), randn(8, 4), **kwargs)  # type: ignore[arg-type]


def test_embedding_rejects_non_matrix_weight() -> None:
    with pytest.raises(ValueError, match=r"weight of shape \(num_embeddings"):
        U.embedding(_indices(4, high=8), randn(8))
