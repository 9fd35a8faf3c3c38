"""Residual adds found in general (``transforms._unit.residuals``), and adds that are
not residuals left to the other rules."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import unit_scaling.functional as U
from unit_scaling.transforms import unit_scale

LOGGER = "unit_scaling.transforms.unit_scale"
WIDTH = 32


def _residual_logs(model: nn.Module, *inputs: Tensor) -> list[str]:
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logger, handler = logging.getLogger(LOGGER), Collect()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        model(*inputs)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return [m for m in records if "residual-add" in m]


class Parallel(nn.Module):
    """GPT-J / NeoX: ``x + attn(ln(x)) + mlp(ln(x))``, in the given order."""

    def __init__(self, order: str) -> None:
        super().__init__()
        self.order = order
        self.ln = nn.LayerNorm(WIDTH)
        self.attn = nn.Linear(WIDTH, WIDTH)
        self.up = nn.Linear(WIDTH, 4 * WIDTH)
        self.down = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: Tensor) -> Tensor:
        h = self.ln(x)
        a = F.scaled_dot_product_attention(*(self.attn(h)[None],) * 3)[0]
        m = self.down(F.gelu(self.up(h)))
        if self.order == "skip first":
            return x + a + m
        return m + a + x


@pytest.mark.parametrize("order", ["skip first", "skip last"])
def test_parallel_branches_are_one_residual_add(order: str) -> None:
    model = unit_scale(Parallel(order))
    x = torch.randn(8, WIDTH)
    logs = _residual_logs(model, x)
    assert len(logs) == 1, logs
    assert "tau=0.01" in logs[0] and "2 parallel branches" in logs[0]
    residual, skip = U.residual_split(x, 0.01)
    h = U.layer_norm(residual, (WIDTH,), model.ln.weight, model.ln.bias)
    q = U.linear(h, model.attn.weight, model.attn.bias, constraint=None)[None]
    a = U.scaled_dot_product_attention(q, q, q, scale=WIDTH**-0.5)[0]
    m = U.linear(
        U.gelu(U.linear(h, model.up.weight, model.up.bias, constraint=None)),
        model.down.weight,
        model.down.bias,
        constraint=None,
    )
    expected = U.residual_add((a + m) * 2**-0.5, skip, 0.01)
    torch.testing.assert_close(model(x), expected)


class Shortcut(nn.Module):
    """A ResNet block: ``shortcut(x) + f(x)`` with a projection shortcut."""

    def __init__(self) -> None:
        super().__init__()
        self.shortcut = nn.Conv2d(8, 16, 1)
        self.conv1 = nn.Conv2d(8, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return self.shortcut(x) + self.conv2(F.relu(self.conv1(x)))


def test_projection_shortcut_is_a_residual_add() -> None:
    model = unit_scale(Shortcut())
    logs = _residual_logs(model, torch.randn(2, 8, 6, 6))
    assert len(logs) == 1 and "tau=0.5" in logs[0]


class NotResiduals(nn.Module):
    """Adds that are not residuals: a position table, a timestep embedding of
    another input, a mask, and rotary embeddings' correlated terms."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)
        self.time = nn.Linear(1, WIDTH)
        self.positions = nn.Parameter(torch.randn(8, WIDTH))

    def forward(self, x: Tensor, t: Tensor, mask: Tensor) -> Tensor:
        h = self.fc(x) + self.positions  # a parameter: not a residual
        h = h + self.time(t)  # an independent input: U.add
        h = h + mask  # a constant
        cos, sin = torch.cos(mask), torch.sin(mask)
        half = torch.cat([-h[..., WIDTH // 2 :], h[..., : WIDTH // 2]], dim=-1)
        return h * cos + half * sin  # correlated terms of one activation


def test_adds_that_are_not_residuals() -> None:
    model = unit_scale(NotResiduals())
    x, t, mask = torch.randn(8, WIDTH), torch.randn(8, 1), torch.zeros(8, WIDTH)
    assert _residual_logs(model, x, t, mask) == []
    ops = model.unit_scale_report().ops
    assert sum(r.op == "add" and r.how == "analytic" for r in ops) == 1  # U.add


class CrossAttention(nn.Module):
    """A decoder layer: ``y + xattn(ln(y), enc)``; the skip is ``y``, not the
    encoder output the branch also reads."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(WIDTH, WIDTH)
        self.ln = nn.LayerNorm(WIDTH)
        self.q = nn.Linear(WIDTH, WIDTH)
        self.kv = nn.Linear(WIDTH, WIDTH)

    def forward(self, y: Tensor, source: Tensor) -> Tensor:
        enc = self.enc(source)
        q, kv = self.q(self.ln(y))[None], self.kv(enc)[None]
        return y + F.scaled_dot_product_attention(q, kv, kv)[0]


def test_cross_attention_residual_skips_the_decoder_stream() -> None:
    model = unit_scale(CrossAttention())
    logs = _residual_logs(model, torch.randn(6, WIDTH), torch.randn(10, WIDTH))
    assert len(logs) == 1 and "tau=0.01" in logs[0]


def test_hand_written_formula_of_a_linear_output_is_not_a_residual() -> None:
    """``h + 0.04 h**3`` (GELU's inner sum) has no weighted op between its
    terms, even when ``h`` itself comes from a linear layer."""
    model = unit_scale(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU("tanh")))

    class Formula(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(WIDTH, WIDTH)

        def forward(self, x: Tensor) -> Tensor:
            h = self.fc(x)
            return torch.tanh(h + 0.044715 * h**3)

    model = unit_scale(Formula())
    assert _residual_logs(model, torch.randn(8, WIDTH)) == []


class Conditioned(nn.Module):
    """U-Net-style blocks: a timestep embedding, broadcast over pixels, added
    in every block; after the first block the stream depends on it."""

    def __init__(self, blocks: int = 3) -> None:
        super().__init__()
        self.time = nn.Linear(1, 8)
        self.emb = nn.ModuleList(nn.Linear(8, 8) for _ in range(blocks))
        self.convs = nn.ModuleList(nn.Conv2d(8, 8, 3, padding=1) for _ in range(blocks))

    def forward(self, x: Tensor, t: Tensor) -> Tensor:
        temb = self.time(t)
        for emb, conv in zip(self.emb, self.convs, strict=True):
            x = x + conv(x + emb(temb)[:, :, None, None])
        return x


def test_broadcast_embedding_is_not_a_residual_skip() -> None:
    model = unit_scale(Conditioned())
    logs = _residual_logs(model, torch.randn(2, 8, 6, 6), torch.randn(2, 1))
    # One residual per block (x + conv(...)); the embedding adds are not.
    assert len(logs) == 3, logs
    assert all("x" in m.split(":")[1] for m in logs)
