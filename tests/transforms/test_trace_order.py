"""A ``unit_scale``d model computes one function at an input, whatever shapes it
was called with before.

``unit_scale`` sets what the graph shows at a capture: a parameter's role (its
value is initialised for it at its first capture), calibrated gradient scales.
A model whose code branches on shapes (Hugging Face's ViT adds its position
table as it is at the image size of its config, and interpolates it at any
other) shows another graph at another shape, and a recapture with dynamic
shapes (at the second shape) measures at other sizes: a model called first at
one shape, then at another, must compute there, forward and backward, what a
model called at the second shape alone computes.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from unit_scaling import zoo
from unit_scaling.transforms import unit_scale

TOLERANCE = 1e-5

# Every kind of cause: a position table interpolated at the second shapes only
# (vit, dinov2, beit's relative bias), token ids of another length (gpt2, t5).
# The default run checks InterpolatedPositions (both causes in a small module);
# the zoo models run under `integration` (tests/conftest.py).
MODELS = ("vit", "dinov2", "clip-vision", "beit", "gpt2", "llama", "bert", "t5")
DEFAULT_RUN = {"test_a_table_interpolated_at_other_sizes_keeps_one_function"}


class InterpolatedPositions(nn.Module):
    """Image patches, a class token and a position table for a ``grid`` x
    ``grid`` image, interpolated to any other (as Hugging Face's ViT does),
    then one attention block."""

    def __init__(
        self, width: int = 32, grid: int = 4, patch: int = 4, heads: int = 4
    ) -> None:
        super().__init__()
        self.grid, self.patch, self.heads = grid, patch, heads
        self.project = nn.Conv2d(3, width, patch, stride=patch)
        self.token = nn.Parameter(0.02 * torch.randn(1, 1, width))
        self.positions = nn.Parameter(0.02 * torch.randn(1, grid * grid + 1, width))
        self.norm = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def _positions(self, rows: int, columns: int) -> Tensor:
        if rows == columns == self.grid:
            return self.positions
        width = self.positions.shape[-1]
        table = self.positions[:, 1:].reshape(1, self.grid, self.grid, width)
        table = F.interpolate(
            table.permute(0, 3, 1, 2), size=(rows, columns), mode="bicubic"
        )
        table = table.permute(0, 2, 3, 1).reshape(1, -1, width)
        return torch.cat([self.positions[:, :1], table], dim=1)

    def forward(self, images: Tensor) -> Tensor:
        rows, columns = images.shape[-2] // self.patch, images.shape[-1] // self.patch
        x = self.project(images).flatten(2).transpose(1, 2)
        batch, tokens = x.shape[0], x.shape[1] + 1
        x = torch.cat([self.token.expand(batch, -1, -1), x], dim=1)
        x = x + self._positions(rows, columns)
        qkv = self.qkv(self.norm(x)).view(batch, tokens, 3 * self.heads, -1)
        q, k, v = qkv.transpose(1, 2).chunk(3, dim=1)
        mixed = F.scaled_dot_product_attention(q, k, v).transpose(1, 2)
        out: Tensor = x + self.out(mixed.reshape(batch, tokens, -1))
        return out


Call = tuple[tuple[Any, ...], dict[str, Any]]


def _function_at(model: nn.Module, call: Call, output: Any) -> list[Tensor]:
    """The output at ``call`` and every parameter's gradient for a fixed
    output gradient."""
    model.zero_grad()
    args, kwargs = call
    out = output(model(*args, **kwargs))
    generator = torch.Generator().manual_seed(7)
    out.backward(torch.randn(out.shape, generator=generator))
    grads = [p.grad for _, p in sorted(model.named_parameters()) if p.grad is not None]
    return [out.detach(), *grads]


def _check_trace_order(
    model: nn.Module, calls: tuple[Call, Call], output: Any = lambda out: out
) -> None:
    for first, then in (calls, calls[::-1]):
        seen_first = unit_scale(model)
        args, kwargs = first
        seen_first(*args, **kwargs)
        after = _function_at(seen_first, then, output)
        alone = _function_at(unit_scale(model), then, output)
        assert len(after) == len(alone)
        for i, (x, y) in enumerate(zip(after, alone, strict=True)):
            error = float((x - y).norm() / y.norm())
            assert error < TOLERANCE, (
                f"{'output' if i == 0 else f'gradient {i}'}: {error:.3g}"
            )


def test_a_table_interpolated_at_other_sizes_keeps_one_function() -> None:
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    small = torch.randn(2, 3, 16, 16, generator=generator)
    large = torch.randn(3, 3, 24, 24, generator=generator)
    _check_trace_order(InterpolatedPositions(), (((small,), {}), ((large,), {})))


@pytest.mark.parametrize("name", MODELS)
def test_zoo_models_keep_one_function(name: str) -> None:
    entry = zoo.get(name)
    if not entry.available():
        pytest.skip(f"needs {entry.requires}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        _check_trace_order(
            entry.make(5), (entry.example(5, 0), entry.example(5, 1)), entry.output
        )
