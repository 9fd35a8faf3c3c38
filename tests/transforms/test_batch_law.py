"""The batch law on ``unit_scale``d models: gradient accumulation is exact.

A unit-scaled parameter gradient is the sum of per-example contributions times a
factor proportional to ``batch^-1/2``, so ``k`` equal micro-batches, each
backpropagated with its output gradient scaled by ``k^-1/2``, give exactly the
gradient of one call on their concatenation (``unit_scaling.functional.steps``).
That holds only if every factor that depends on the batch is read from each
call's shapes: a graph that TorchDynamo recompiles with a dynamic batch size is
reused for every batch, and a constant baked at the captured batch (a
broadcast's count, a calibrated scale standing in for one) is wrong for all
others. Each check calibrates on batch ``A``, then compares, per parameter, one
call on ``[A; B]`` (output gradient ``[s_A; s_B]``) with the calls on ``A`` and on
``B`` backpropagated with ``2^-1/2 s``.

Left out of the comparison: gradients that are zero by construction (a key
bias, to which softmax is invariant; a bias just before a batch norm), whose
RMS is below ``NEGLIGIBLE`` times the model's median parameter-gradient RMS:
what they hold is rounding noise, and no scale is wrong there.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from unit_scaling import zoo
from unit_scaling._torch_internals import pytree
from unit_scaling.transforms import unit_scale

TOLERANCE = 1e-5
NEGLIGIBLE = 1e-3

# Models for which the law cannot hold, whatever the scales: name -> why.
COUPLED = {
    name: "batch norm in training mode normalises every example by statistics "
    "of its whole batch: the examples are coupled, so one call on [A; B] is not "
    "the sum of the calls on A and on B"
    for name in ("resnet", "mobilenet-v2", "sequential")
}
# In the default run, beside SharedTensors (every mechanism in one small
# module): a position table broadcast over the batch (gpt2) and a class token
# expanded to it (vit). Every other fast zoo model (experts, T5's relative bias
# put into a mask, DeBERTa's repeated relative positions, DiT's adaLN, ...)
# runs under `integration` (tests/conftest.py; about a minute and a half on two
# cores), which CI runs after the default suite.
DEFAULT = {"gpt2", "vit"}
DEFAULT_RUN = {
    "test_shared_tensors_follow_the_batch",
    "test_a_region_that_reads_the_batch_size_keeps_its_calibration",
    "test_default_models_are_fast_and_not_coupled",
    *(f"test_zoo_gradients_accumulate_exactly[{name}]" for name in DEFAULT),
}

Call = tuple[tuple[Any, ...], dict[str, Any]]


def _accumulation_errors(
    model: nn.Module, calls: tuple[Call, Call], output: Any = lambda out: out
) -> dict[str, float]:
    """Per parameter whose gradient is not negligible, the relative difference
    between the gradient of one call on both batches of ``calls`` and the sum
    of the calls on each, backpropagated with ``2^-1/2`` of the same output
    gradients."""
    (a_args, a_kwargs), (b_args, b_kwargs) = calls
    first = output(model(*a_args, **a_kwargs))  # measured at A's batch
    batch = first.shape[0]
    generator = torch.Generator().manual_seed(3)
    grads = [torch.randn(first.shape, generator=generator) for _ in calls]

    def joined(a: Any, b: Any) -> Any:
        batched = isinstance(a, Tensor) and a.dim() and a.shape[0] == batch
        return torch.cat([a, b]) if batched else a

    args, kwargs = pytree.tree_map(joined, (a_args, a_kwargs), (b_args, b_kwargs))
    model.zero_grad()
    output(model(*args, **kwargs)).backward(torch.cat(grads))
    whole = {
        n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
    }
    model.zero_grad()
    for (call_args, call_kwargs), grad in zip(calls, grads, strict=True):
        output(model(*call_args, **call_kwargs)).backward(grad * 2**-0.5)
    parts = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    rms = {n: float(g.double().square().mean().sqrt()) for n, g in whole.items()}
    typical = float(torch.tensor(list(rms.values())).median())
    return {
        n: float((parts[n] - g).norm() / g.norm())
        for n, g in whole.items()
        if rms[n] > NEGLIGIBLE * typical
    }


class SharedTensors(nn.Module):
    """Tensors every example shares, meeting the batch through each op that
    repeats them: a mask token put in place of dropped inputs by
    ``torch.where``, a class token expanded, a position table indexed at every
    example's positions, a relative bias (computed from a table) put into a
    padding mask by ``torch.where``, a learned attention mask, and a
    projection of a table repeated along the leading dimension."""

    def __init__(self, width: int = 32, length: int = 8, heads: int = 4) -> None:
        super().__init__()
        self.heads, self.tokens = heads, length + 1
        self.blank = nn.Parameter(torch.randn(width))
        self.token = nn.Parameter(torch.randn(1, 1, width))
        self.positions = nn.Parameter(torch.randn(64, width))
        self.relative = nn.Parameter(torch.randn(self.tokens, self.tokens, 8))
        self.bias = nn.Linear(8, heads)
        self.mask = nn.Parameter(torch.randn(heads, self.tokens, self.tokens))
        self.rows = nn.Parameter(torch.randn(self.tokens, width))
        self.project = nn.Linear(width, width)
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.out = nn.Linear(width, width)

    def forward(self, x: Tensor, keep: Tensor) -> Tensor:
        batch, tokens, heads = x.shape[0], self.tokens, self.heads
        x = torch.where(keep[:, 1:, None], x, self.blank)
        x = torch.cat([self.token.expand(batch, -1, -1), x], dim=1)
        x = x + self.positions[torch.arange(tokens).expand(batch, -1)]
        q, k, v = self.qkv(x).view(batch, tokens, 3 * heads, -1).chunk(3, 2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        bias = self.bias(self.relative).permute(2, 0, 1)
        scores = torch.where(keep[:, None, None, :], bias, -1e9)
        mixed = F.scaled_dot_product_attention(q, k, v, attn_mask=scores)
        mixed = mixed + F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)
        rows = self.project(self.rows).view(tokens, heads, -1).transpose(0, 1)
        mixed = mixed + rows.repeat(batch, 1, 1).view(batch, heads, tokens, -1)
        out: Tensor = self.out(mixed.transpose(1, 2).reshape(batch, tokens, -1))
        return out


def test_shared_tensors_follow_the_batch() -> None:
    torch.manual_seed(0)
    model = unit_scale(SharedTensors())

    def call(seed: int) -> Call:
        generator = torch.Generator().manual_seed(seed)
        keep = torch.rand(2, 9, generator=generator) > 0.2
        return (torch.randn(2, 8, 32, generator=generator), keep), {}

    errors = _accumulation_errors(model, (call(1), call(2)))
    shared = {"blank", "token", "positions", "relative", "mask", "rows"}
    assert shared <= set(errors)
    assert max(errors.values()) < TOLERANCE, errors


class RepeatedKeys(nn.Module):
    """Attention whose keys go through ops no rule covers (a rotation, as
    rotary embeddings do) and are then repeated to the query heads with the
    batch size written out, as transformers' ``repeat_kv`` does where torch's
    attention lacks ``enable_gqa``: a calibrated region (its scale far from
    one) that a capture with a dynamic batch size reads that size into."""

    def __init__(self, width: int = 32, heads: int = 4, groups: int = 2) -> None:
        super().__init__()
        self.heads, self.groups = heads, groups
        self.q = nn.Linear(width, width)
        self.kv = nn.Linear(width, 2 * width // (heads // groups))
        self.out = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        batch, tokens, _ = x.shape
        q = self.q(x).view(batch, tokens, self.heads, -1).transpose(1, 2)
        k, v = self.kv(x).view(batch, tokens, 2 * self.groups, -1).chunk(2, 2)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        k = k * 3.0 + torch.cat([-k[..., 1:], k[..., :1]], dim=-1)
        repeat = self.heads // self.groups
        k, v = (
            t[:, :, None].expand(batch, self.groups, repeat, tokens, -1) for t in (k, v)
        )
        k = k.reshape(batch, self.heads, tokens, -1)
        v = v.reshape(batch, self.heads, tokens, -1)
        mixed = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out: Tensor = self.out(mixed.transpose(1, 2).reshape(batch, tokens, -1))
        return out


def test_a_region_that_reads_the_batch_size_keeps_its_calibration() -> None:
    # Another batch size recaptures the model with a dynamic batch, which the
    # region reads as an input: it must find its calibration from the first
    # capture all the same, so that the first batch gives what it gave.
    torch.manual_seed(0)
    model = unit_scale(RepeatedKeys())
    x = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(1))

    def output_and_grads() -> list[Tensor]:
        model.zero_grad()
        out = model(x)
        out.backward(torch.ones_like(out))
        return [
            out.detach(),
            *(p.grad for p in model.parameters() if p.grad is not None),
        ]

    first = output_and_grads()
    model(torch.randn(4, 8, 32))
    for before, after in zip(first, output_and_grads(), strict=True):
        torch.testing.assert_close(after, before, rtol=0, atol=0)


def _zoo_params() -> list[Any]:
    params = []
    for name in zoo.names(include_slow=False):
        marks: list[Any] = []
        if not zoo.get(name).available():
            marks.append(pytest.mark.skip(reason=f"needs {zoo.get(name).requires}"))
        params.append(pytest.param(name, marks=marks, id=name))
    return params


@pytest.mark.parametrize("name", _zoo_params())
def test_zoo_gradients_accumulate_exactly(name: str) -> None:
    entry = zoo.get(name)
    model = entry.make(0)
    if name in COUPLED:
        assert any(
            isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training
            for m in model.modules()
        ), f"{name} is listed as coupled by batch norm but has none in training"
        pytest.skip(COUPLED[name])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        errors = _accumulation_errors(
            unit_scale(model), (entry.example(0, 0), entry.example(1, 0)), entry.output
        )
    off = {n: e for n, e in errors.items() if not e < TOLERANCE}
    assert not off, f"{name}: {off}"


def test_default_models_are_fast_and_not_coupled() -> None:
    assert set(zoo.names(include_slow=False)) >= DEFAULT
    assert not DEFAULT & set(COUPLED)
