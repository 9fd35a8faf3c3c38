"""Tests for ``torch_map``, the table the ``unit_scale`` transform replaces by.

The transform only sees what TorchDynamo records, so the first test traces one
call of every mapped function and checks that each recorded target is exactly
the key we map from. It fails loudly if a torch upgrade changes what Dynamo
records (as it already does for ``F.rms_norm``, recorded as ``torch.rms_norm``).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import unit_scaling.functional as U
from unit_scaling.functional import torch_map


def _model(
    x: Tensor, w: Tensor, x3: Tensor, idx: Tensor, target: Tensor
) -> list[Tensor]:
    """One call per mapped function, in the order of ``RECORDED``."""
    img, vol = x3.unsqueeze(0), x3.reshape(1, 2, 2, 4, 8)
    return [
        F.linear(x, w),
        torch.matmul(x, w),
        x @ w,
        torch.bmm(x3, x3.transpose(1, 2)),
        torch.einsum("ij,jk->ik", x, w),
        F.grouped_mm(x.bfloat16(), x3.bfloat16(), offs=idx[:2].int().sort().values),
        F.conv1d(x3, w[:8, :8].unsqueeze(-1)),
        F.conv2d(x3.unsqueeze(0), w[:, :2, None, None]),
        F.conv3d(vol, w[:, :2, None, None, None]),
        F.conv_transpose1d(x3, w[:, :, None]),
        F.conv_transpose2d(img, w[:2, :, None, None]),
        F.conv_transpose3d(vol, w[:2, :, None, None, None]),
        F.gelu(x),
        F.silu(x),
        F.relu(x),
        torch.relu(x),
        F.tanh(x),
        torch.tanh(x),
        F.sigmoid(x),
        torch.sigmoid(x),
        F.softmax(x, -1),
        torch.softmax(x, -1),
        F.dropout(x, 0.1),
        F.scaled_dot_product_attention(x3, x3, x3),
        F.layer_norm(x, (8,)),
        F.rms_norm(x, (8,)),
        F.group_norm(x3, 2),
        F.batch_norm(x3, None, None, training=True),
        F.instance_norm(x3),
        F.embedding(idx, w),
        F.avg_pool1d(x3, 2),
        F.avg_pool2d(img, 2),
        F.avg_pool3d(vol, 2),
        F.max_pool1d(x3, 2),
        F.max_pool2d(img, 2),
        F.max_pool3d(vol, 2),
        F.adaptive_avg_pool1d(x3, 2),
        F.adaptive_avg_pool2d(img, 2),
        F.adaptive_avg_pool3d(vol, 2),
        F.adaptive_max_pool1d(x3, 2),
        F.adaptive_max_pool2d(img, 2),
        F.adaptive_max_pool3d(vol, 2),
        F.interpolate(img, scale_factor=2.0, mode="bilinear"),
        torch.index_add(w, 0, idx, w[:4]),
        torch.scatter_add(w, 0, idx[:, None].expand(4, 8), w[:4]),
        torch.gather(w, 0, idx[:, None].expand(4, 8)),
        torch.index_select(w, 0, idx),
        F.cross_entropy(x, target),
        F.mse_loss(x, w),
        torch.add(x, w),
    ]


RECORDED: list[Callable[..., Any]] = [
    F.linear,
    torch.matmul,
    operator.matmul,
    torch.bmm,
    torch.einsum,
    torch._grouped_mm,  # F.grouped_mm is inlined to the builtin
    F.conv1d,
    F.conv2d,
    F.conv3d,
    F.conv_transpose1d,
    F.conv_transpose2d,
    F.conv_transpose3d,
    F.gelu,
    F.silu,
    F.relu,
    torch.relu,
    F.tanh,
    torch.tanh,
    F.sigmoid,
    torch.sigmoid,
    F.softmax,
    torch.softmax,
    F.dropout,
    F.scaled_dot_product_attention,
    F.layer_norm,
    torch.rms_norm,  # F.rms_norm is recorded as the torch builtin
    F.group_norm,
    F.batch_norm,
    F.instance_norm,
    F.embedding,
    F.avg_pool1d,
    F.avg_pool2d,
    F.avg_pool3d,
    F.max_pool1d,  # torch's return_indices dispatchers, recorded as they are
    F.max_pool2d,
    F.max_pool3d,
    F.adaptive_avg_pool1d,
    F.adaptive_avg_pool2d,
    F.adaptive_avg_pool3d,
    F.adaptive_max_pool1d,
    F.adaptive_max_pool2d,
    F.adaptive_max_pool3d,
    F.interpolate,
    torch.index_add,
    torch.scatter_add,
    torch.gather,
    torch.index_select,
    F.cross_entropy,
    F.mse_loss,
    torch.add,
]


def test_dynamo_records_exactly_the_mapped_functions() -> None:
    recorded: list[Any] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Tensor]) -> Any:
        recorded.extend(n.target for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    gen = torch.Generator().manual_seed(0)
    x, w, x3 = torch.randn(8, 8), torch.randn(8, 8), torch.randn(2, 8, 8)
    idx = torch.randint(0, 8, (4,), generator=gen)
    target = torch.randint(0, 8, (8,), generator=gen)
    torch.compile(_model, backend=backend, fullgraph=True)(x, w, x3, idx, target)

    mapped = [t for t in recorded if t in torch_map]
    assert mapped == RECORDED, "Dynamo now records different targets; update torch_map"
    # Every key is recorded by some call, except aliases kept for direct use.
    assert set(torch_map) - set(RECORDED) == {F.rms_norm, F.grouped_mm}


def test_values_are_the_unit_scaled_functions_of_the_same_name() -> None:
    for torch_fn, unit_fn in torch_map.items():
        # (torch._grouped_mm is the builtin behind F.grouped_mm)
        assert unit_fn.__name__ == torch_fn.__name__.lstrip("_"), torch_fn
        assert getattr(U, unit_fn.__name__) is unit_fn


def test_reductions_are_deliberately_not_mapped() -> None:
    for fn in (torch.sum, torch.mean, U.sum, U.mean):
        assert fn not in torch_map


def _tensors() -> dict[str, Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "x": torch.randn(4, 16, generator=gen),
        "w": torch.randn(16, 16, generator=gen),
        "b": torch.randn(16, generator=gen),
        "x3": torch.randn(2, 16, 16, generator=gen),
        "img": torch.randn(2, 16, 8, 8, generator=gen),
        "idx": torch.randint(0, 16, (3, 5), generator=gen),
    }


# Calls exactly as user code makes them (positional arguments where torch allows):
# the mapped function must accept each and return the same shape.
CALLS: list[
    tuple[Callable[..., Any], Callable[[dict[str, Tensor]], tuple[Any, ...]]]
] = [
    (F.linear, lambda t: (t["x"], t["w"], t["b"])),
    (torch.matmul, lambda t: (t["x3"], t["w"])),
    (operator.matmul, lambda t: (t["x"], t["w"])),
    (torch.bmm, lambda t: (t["x3"], t["x3"])),
    (torch.einsum, lambda t: ("bij,jk->bik", t["x3"], t["w"])),
    (torch.einsum, lambda t: ("ij,jk", [t["x"], t["w"]])),
    (F.conv1d, lambda t: (t["x3"], t["w"][:, :, None], t["b"], 1, 0, 1, 1)),
    (F.conv2d, lambda t: (t["img"], t["w"][:, :4, None, None], None, 2, "valid", 1, 4)),
    (F.layer_norm, lambda t: (t["x"], (16,), t["b"], t["b"], 1e-6)),
    (F.rms_norm, lambda t: (t["x"], [16], t["b"], 1e-6)),
    (torch.rms_norm, lambda t: (t["x"], (16,), None, None)),
    (F.group_norm, lambda t: (t["x3"], 4, t["b"], t["b"], 1e-5)),
    (F.embedding, lambda t: (t["idx"], t["w"], 0)),
    (F.conv3d, lambda t: (t["img"][None], t["w"][:, :2, None, None, None], None, 1)),
    (
        F.conv_transpose2d,
        lambda t: (t["img"], t["w"][:, :4, None, None], None, 2, 0, 1, 4, 1),
    ),
    (F.batch_norm, lambda t: (t["x3"], None, None, t["b"], t["b"], True, 0.1, 1e-5)),
    (F.instance_norm, lambda t: (t["x3"], None, None, t["b"], t["b"], True)),
    (F.avg_pool2d, lambda t: (t["img"], 3, 2, 1, True, False, None)),
    (F.max_pool2d, lambda t: (t["img"], 3, 2, 1, 1, True)),
    (F.max_pool1d, lambda t: (t["x3"], 2, None, 0, 1, False, True)),
    (F.adaptive_max_pool2d, lambda t: (t["img"], (3, None), True)),
    (F.interpolate, lambda t: (t["img"], None, 1.5, "bicubic", True, True, False)),
    (torch.index_add, lambda t: (t["w"], 0, t["idx"][0], t["w"][:5])),
    (torch.gather, lambda t: (t["w"], 1, t["idx"])),
    (torch.index_select, lambda t: (t["w"], 1, t["idx"][0])),
    (torch.softmax, lambda t: (t["x"], -1, torch.float64)),
    (torch.add, lambda t: (t["x"], t["b"])),
]


@pytest.mark.parametrize(
    ("torch_fn", "make_args"), CALLS, ids=lambda f: getattr(f, "__name__", "")
)
def test_mapped_functions_accept_torch_call_signatures(
    torch_fn: Callable[..., Any],
    make_args: Callable[[dict[str, Tensor]], tuple[Any, ...]],
) -> None:
    args = make_args(_tensors())
    out, expected = torch_map[torch_fn](*args), torch_fn(*args)
    if isinstance(expected, tuple):  # (output, indices)
        assert torch.equal(out[1], expected[1])
        out, expected = out[0], expected[0]
    assert out.shape == expected.shape and out.dtype == expected.dtype


def test_add_keyword_alpha_as_torch_records_it() -> None:
    t = _tensors()
    y = torch_map[torch.add](t["x"], t["b"], alpha=2)
    torch.testing.assert_close(y, 2**-0.5 * torch.add(t["x"], t["b"], alpha=2))
