"""Graph rules of ``unit_scale`` that architectures outside the zoo rely on, each
shown on the smallest model that needs it: which output a loss uses (a model
that also returns its key/value cache), normalisations recognised between other
uncovered ops (query/key norms over the head dimension, next to a rotary
embedding), opaque library operators with a named rule (Hugging Face's grouped
expert product), and gradients that are zero by construction left alone."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import unit_scaling.functional as U
from tests.helpers import rms, unit_backward
from unit_scaling.transforms import unit_scale, unit_scale_report

WIDTH, HEADS, VOCAB = 32, 4, 64


def _rms_norm(x: Tensor, weight: Tensor) -> Tensor:
    """RMSNorm as models write it by hand, in float32 and back."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    return (h * (1.0 + weight.float())).type_as(x)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class CachingAttentionLM(nn.Module):
    """One attention block that returns its key/value cache before its logits
    (as Dynamo returns a cache object's tensors), with query/key norms over the
    head dimension applied between the reshape into heads and a rotary
    embedding, which no rule covers."""

    def __init__(self, vocab: int = VOCAB) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, WIDTH)
        self.q, self.k, self.v, self.o = (
            nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(4)
        )
        head = WIDTH // HEADS
        self.q_norm = nn.Parameter(torch.zeros(head))
        self.k_norm = nn.Parameter(torch.zeros(head))
        self.head = nn.Linear(WIDTH, vocab, bias=False)
        angles = torch.arange(64)[:, None] * 0.1 ** torch.arange(head)[None, :]
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        batch, seq = ids.shape
        h = self.embed(ids)

        def heads(t: Tensor) -> Tensor:
            return t.view(batch, seq, HEADS, -1).transpose(1, 2)

        cos, sin = self.cos[:seq], self.sin[:seq]
        q = _rotate(_rms_norm(heads(self.q(h)), self.q_norm), cos, sin)
        k = _rotate(_rms_norm(heads(self.k(h)), self.k_norm), cos, sin)
        v = heads(self.v(h))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + self.o(a.transpose(1, 2).reshape(batch, seq, WIDTH))
        return k, v, self.head(h)


@pytest.mark.parametrize("vocab", [VOCAB, WIDTH])
def test_gradients_calibrated_for_the_logits_not_a_cache_returned_first(
    vocab: int,
) -> None:
    """A loss uses the logits: calibrating from the first output (the cache)
    would scale the key and value projections for gradients that never come.
    With ``vocab == WIDTH`` the cache is as large as the logits, and it is
    told apart by being read by attention (also once the rewrite has put a
    gradient rescaling between it and the output)."""
    torch.manual_seed(0)
    scaled = unit_scale(CachingAttentionLM(vocab))
    ids = torch.randint(vocab, (16, 32), generator=torch.Generator().manual_seed(1))
    *_, logits = scaled(ids)
    unit_backward(logits, seed=2)
    grads = {n: rms(p.grad) for n, p in scaled.named_parameters() if p.grad is not None}
    off = {n: round(g, 3) for n, g in grads.items() if not 0.5 <= g <= 2}
    assert not off, off
    assert {"q.weight", "k.weight", "v.weight", "q_norm", "k_norm"} <= set(grads)


def test_head_norms_inside_an_uncovered_region_are_recognised() -> None:
    scaled = unit_scale(CachingAttentionLM())
    scaled(torch.randint(VOCAB, (2, 8)))
    norms = [
        r
        for r in unit_scale_report(scaled).ops
        if r.op == "rms_norm" and r.how == "analytic"
    ]
    assert len(norms) == 2, unit_scale_report(scaled).ops


def test_activation_inside_a_region_is_not_recognised_on_a_scaled_input() -> None:
    """``tanh(h / 50)`` computes ``tanh`` of its input ``h / 50``, but a unit-scaled
    ``tanh`` assumes a unit input: only normalisations, which do not depend on
    their input's scale, are recognised in the middle of a region."""

    class SoftIdentity(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x: Tensor) -> Tensor:
            h = self.fc(x)
            return torch.tanh(h / 50.0 + 0.0) * 50.0 + h * 0.0

    scaled = unit_scale(SoftIdentity())
    x = torch.randn(128, 16)
    out = scaled(x)
    assert not [r for r in unit_scale_report(scaled).ops if r.op == "tanh"]
    expected = U.linear(x, scaled.fc.weight, scaled.fc.bias, constraint=None)
    torch.testing.assert_close(out, expected, rtol=0.02, atol=0.02)


def test_bias_before_a_batch_norm_keeps_its_zero_gradient() -> None:
    """A bias followed by a training-mode batch norm has zero gradient (the norm
    removes means). Over a batch of two, the norms pass back gradients far from
    unit, which the cut vertices correct by up to 300x; the biases' rounding
    noise must not be calibrated up to unit scale with them."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(16, 32),
        nn.BatchNorm1d(32),
        nn.ReLU(),
        nn.Linear(32, 32),
        nn.BatchNorm1d(32),
        nn.Linear(32, 8),
    )
    scaled = unit_scale(model)
    out = scaled(torch.randn(2, 16))
    unit_backward(out, seed=1)
    assert scaled[0].bias.grad is not None and scaled[3].bias.grad is not None
    assert rms(scaled[0].bias.grad) < 1e-2  # (calibrated, they would be ~1)
    assert rms(scaled[3].bias.grad) < 1e-2
    assert 0.5 <= rms(scaled[5].bias.grad) <= 2


def test_named_operator_rule_for_hugging_face_grouped_experts() -> None:
    pytest.importorskip("transformers")
    from transformers.integrations import moe  # noqa: F401  (registers the op)

    class Experts(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(4, WIDTH, 2 * WIDTH) * 0.02)

        def forward(self, x: Tensor, offs: Tensor) -> Tensor:
            op = torch.ops.transformers.grouped_mm_fallback
            return op(x, self.weight, offs=offs)  # type: ignore[no-any-return]

    scaled = unit_scale(Experts())
    x, offs = torch.randn(64, WIDTH), torch.tensor([16, 30, 50, 64])
    out = scaled(x, offs)
    records = unit_scale_report(scaled).ops
    assert [(r.op, r.how) for r in records] == [("grouped_mm_fallback", "analytic")]
    assert 0.9 <= rms(scaled.weight) <= 1.1  # a weight: unit initialised
    torch.testing.assert_close(out, U.grouped_mm(x, scaled.weight, offs=offs))


class DropPath(nn.Module):
    """Stochastic depth as vision models write it: a whole sample is kept with
    probability ``keep`` and rescaled by ``1 / keep``."""

    def __init__(self, keep: float) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.keep = keep

    def forward(self, x: Tensor) -> Tensor:
        h = self.fc(x)
        mask = (self.keep + torch.rand(h.shape[0], 1, dtype=h.dtype)).floor()
        return h.div(self.keep) * mask


def test_region_drawing_random_numbers_is_calibrated_over_draws() -> None:
    """A drop-path's output RMS is ``keep^-1/2`` in expectation; over a batch of one
    sample, one draw gives 0 or ``1 / keep`` (a factor of 0.5 or none). The mask
    is recomputed on every calibration run (not taken as the constant the trace
    saw) and the runs averaged, so most models get a factor near 0.707."""
    factors = []
    for seed in range(10):
        torch.manual_seed(seed)
        scaled = unit_scale(DropPath(keep=0.5))
        scaled(torch.randn(1, 16))
        records = unit_scale_report(scaled).ops
        factors += [float(r.detail[1:]) for r in records if r.how == "calibrated"]
    near = [f for f in factors if 0.55 <= f <= 0.9]
    assert len(near) >= 6, factors
