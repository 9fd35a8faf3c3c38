"""Tests for the unit-scaled grouped matrix product ``U.grouped_mm``.

Scales restated from the rule: ``alpha = k^-1/2``, ``beta_a = n^-1/2``,
``beta_b = m^-1/2`` with ``b`` of shape ``(groups, k, n)`` and ``m`` rows of ``a``
per group (on average); a constraint ties ``alpha`` and ``beta_a`` only (``beta_b``
follows the batch, as a linear layer's weight gradient scale does). The
reference is a plain per-group loop of ``torch.mm``.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

import unit_scaling.functional as U
from tests.helpers import assert_unit_scale, gradcheck_scaled, randn, unit_backward
from unit_scaling.constraints import apply_constraint


def _reference(a: Tensor, b: Tensor, offs: Tensor | None) -> Tensor:
    if offs is None:
        return torch.bmm(a, b)
    rows, start = [], 0
    for group, end in enumerate(offs.tolist()):
        rows.append(a[start:end] @ b[group])
        start = end
    rows.append(a.new_zeros(a.shape[0] - start, b.shape[2]))  # past offs[-1]
    return torch.cat(rows)


@pytest.mark.parametrize("constraint", [None, "to_output_scale", "gmean"])
@pytest.mark.parametrize("layout", ["offs", "batched"])
def test_grouped_mm_matches_torch_times_scales(
    layout: str, constraint: str | None
) -> None:
    if layout == "offs":
        # 40 rows in 4 groups (one empty, 5 rows past the last end): m = 10
        a, b = randn(40, 12, seed=0), randn(4, 12, 20, seed=1)
        offs = torch.tensor([10, 10, 22, 35])
        m = 10
    else:
        a, b, offs, m = randn(4, 6, 12, seed=0), randn(4, 12, 20, seed=1), None, 6
    alpha, beta_a = apply_constraint(constraint, 12**-0.5, 20**-0.5)
    beta_b = m**-0.5
    y = U.grouped_mm(a, b, offs=offs, constraint=constraint)
    grad = unit_backward(y, seed=2)
    refs = [t.detach().requires_grad_() for t in (a, b)]
    y_ref = _reference(*refs, offs)
    y_ref.backward(grad)
    torch.testing.assert_close(y, alpha * y_ref)
    torch.testing.assert_close(a.grad, beta_a * refs[0].grad)
    torch.testing.assert_close(b.grad, beta_b * refs[1].grad)


def test_grouped_mm_is_unit_scaled() -> None:
    # 8 experts, 4096 tokens evenly split, k = 256, n = 128
    a, b = randn(4096, 256, seed=0), randn(8, 256, 128, seed=1)
    offs = torch.arange(1, 9) * 512
    y = U.grouped_mm(a, b, offs, constraint=None)
    unit_backward(y, seed=2)
    assert_unit_scale(y, name="output")
    assert a.grad is not None and b.grad is not None
    assert_unit_scale(a.grad, name="grad a")
    assert_unit_scale(b.grad, name="grad b")


@pytest.mark.parametrize("layout", ["offs", "batched"])
def test_grouped_mm_gradcheck(layout: str) -> None:
    if layout == "offs":
        a = randn(9, 4, dtype=torch.float64, seed=0)
        b = randn(3, 4, 5, dtype=torch.float64, seed=1)
        offs: Tensor | None = torch.tensor([2, 2, 8])
        m = 3.0
    else:
        a = randn(3, 2, 4, dtype=torch.float64, seed=0)
        b = randn(3, 4, 5, dtype=torch.float64, seed=1)
        offs, m = None, 2.0
    assert gradcheck_scaled(
        lambda x, w: U.grouped_mm(x, w, offs=offs, constraint=None),
        [a, b],
        4**-0.5,
        [5**-0.5, m**-0.5],
    )


def test_grouped_mm_accepts_torch_signatures() -> None:
    """Positional ``offs`` (``torch._grouped_mm``, Hugging Face's fallback op)
    and the keyword (``F.grouped_mm``) give the same result; ``out_dtype``
    casts."""
    a, b, offs = torch.randn(8, 4), torch.randn(2, 4, 4), torch.tensor([3, 8])
    torch.testing.assert_close(U.grouped_mm(a, b, offs), U.grouped_mm(a, b, offs=offs))
    assert U.grouped_mm(a, b, offs, out_dtype=torch.float64).dtype == torch.float64


def test_grouped_mm_compiles() -> None:
    """The per-group loop is an opaque operator: ``torch.compile`` with
    ``fullgraph=True`` takes it, forward and backward."""
    a, b, offs = randn(8, 4, seed=0), randn(2, 4, 4, seed=1), torch.tensor([3, 8])
    compiled = torch.compile(
        lambda x, w: U.grouped_mm(x, w, offs=offs), backend="aot_eager", fullgraph=True
    )
    y = compiled(a, b)
    y.sum().backward()
    refs = [t.detach().requires_grad_() for t in (a, b)]
    expected = U.grouped_mm(*refs, offs=offs)
    expected.sum().backward()
    torch.testing.assert_close(y, expected)
    torch.testing.assert_close(a.grad, refs[0].grad)
    torch.testing.assert_close(b.grad, refs[1].grad)


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "offs", "match"),
    [
        ((8, 4), (2, 4), torch.tensor([3, 8]), "supports mat_a"),
        ((8, 4), (2, 5, 4), torch.tensor([3, 8]), "last dimension"),
        ((8, 4), (2, 4, 4), None, "needs offs"),
        ((8, 4), (2, 4, 4), torch.tensor([3, 5, 8]), "group ends"),
        ((8, 4), (2, 4, 4), torch.tensor([3.0, 8.0]), "integer"),
        ((2, 3, 4), (2, 4, 4), torch.tensor([1, 2]), "only for a 2-D"),
        ((3, 3, 4), (2, 4, 4), None, "3 groups"),
    ],
)
def test_grouped_mm_bad_arguments(
    a_shape: tuple[int, ...],
    b_shape: tuple[int, ...],
    offs: Tensor | None,
    match: str,
) -> None:
    with pytest.raises(ValueError, match=match):
        U.grouped_mm(torch.randn(a_shape), torch.randn(b_shape), offs=offs)


def test_grouped_mm_rejects_bias_and_bad_constraint() -> None:
    a, b, offs = torch.randn(8, 4), torch.randn(2, 4, 4), torch.tensor([3, 8])
    with pytest.raises(ValueError, match="bias"):
        U.grouped_mm(a, b, offs, bias=torch.zeros(2, 4))
    with pytest.raises(ValueError, match="constraint"):
        U.grouped_mm(a, b, offs, constraint="nope")
    with pytest.raises(TypeError, match="tensors"):
        U.grouped_mm(a.tolist(), b, offs)  # type: ignore[arg-type]
