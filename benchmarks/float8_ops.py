"""What one FP8 linear layer costs besides its GEMMs, counted: casts,
transposes and copies per converted linear per training step, and proof that
conversion keeps no extra copy of any weight.

Counts, not timings, so they are the same on every machine (and asserted in
``tests/test_benchmarks.py``). The counter is ``benchmarks/op_counts.py``'s
:class:`~benchmarks.op_counts.OpCounter` (a ``TorchDispatchMode``), which sees
every aten op that runs: inside ``autograd.Function``\\ s and, for custom ops
such as the CPU stand-in for ``torch._scaled_mm``, the aten ops inside them;
views (``t``, ``view``, slices) and unfilled allocations cost no kernel and are
left out. One training step of a :class:`unit_scaling.float8.Float8Linear`
(forward and backward under bf16 autocast, as ``benchmarks/float8_gpu.py``
trains) is counted by the category :func:`category` gives:

* ``FP8 GEMM``: ``_scaled_mm``, three per step;
* ``saturating clamp``: the first half of a saturating cast to FP8;
* ``cast to FP8``: a conversion whose output is FP8 (``_to_copy``, ``copy_``);
* ``layout copy``: a copy that changes only the layout (``clone``, a same-dtype
  ``copy_``): the transposes ``_scaled_mm`` needs (cuBLAS's FP8 GEMMs take
  their second operand column-major);
* ``cast and transpose``: a conversion to FP8 that writes the transposed
  layout in the same pass;
* ``other cast``: a conversion between wider dtypes (the bias to bf16);
* the rest by name.

Memory: the storages of a model's parameters, buffers and tensor attributes
before conversion, after it and after a training step (the same: conversion
keeps each parameter object, and no FP8 copy of a weight is cached), and what
the layer's forward saves for its backward (the input and the weight parameter
itself, no copy)::

    python -m benchmarks.float8_ops
    python -m benchmarks float8_ops
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
from typing import Any

import torch
from torch import Tensor, nn

import unit_scaling as uu
from unit_scaling._torch_internals import pytree
from unit_scaling.float8 import Float8Config, convert_to_float8_training

from ._measure import table
from .op_counts import OpCounter

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
CATEGORIES = (
    "FP8 GEMM",
    "saturating clamp",
    "cast to FP8",
    "cast and transpose",
    "layout copy",
    "other cast",
    "other",
)
# The layer counted: sizes that are multiples of 16 (so it runs in FP8), a
# batch of tokens as in training.
IN_FEATURES, OUT_FEATURES, TOKENS = 256, 512, 64


def _tensors(tree: Any) -> list[Tensor]:
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, Tensor)]


def category(func: Any, args: Any, kwargs: Any, out: Any) -> str:
    """Which of :data:`CATEGORIES` an aten op that ran belongs to: the
    ``classify`` of an :class:`~benchmarks.op_counts.OpCounter`.

    Example::

        >>> with OpCounter(category) as counter:
        ...     _ = torch.randn(4, 4).t().contiguous()
        >>> by_category(counter)["layout copy"]
        1
    """
    name = func.overloadpacket.__name__
    if name in ("_scaled_mm", "mm", "addmm", "bmm", "matmul"):
        return "FP8 GEMM" if name == "_scaled_mm" else "other"
    if name == "clamp":
        return "saturating clamp"
    if name in ("_to_copy", "copy_", "clone", "contiguous"):
        source = args[1] if name == "copy_" else args[0]
        result = _tensors(out)[0]
        if result.dtype == source.dtype:
            return "layout copy"
        if result.dtype in FP8:
            same_layout = result.stride() == source.stride() or result.dim() < 2
            return "cast to FP8" if same_layout else "cast and transpose"
        return "other cast"
    return "other"


def by_category(counter: OpCounter) -> dict[str, int]:
    """The ops ``counter`` counted (with :func:`category`) per category of
    :data:`CATEGORIES`, zeros included."""
    totals = dict.fromkeys(CATEGORIES, 0)
    for (found, _), n in counter.classified.items():
        totals[found] += n
    return totals


@dataclasses.dataclass
class StepCounts:
    """The ops of one training step of one converted linear layer."""

    forward: OpCounter
    backward: OpCounter


def count_step(
    bias: bool = True,
    config: Float8Config | None = None,
    autocast: bool = True,
    device: str = "cpu",
) -> StepCounts:
    """Counts the forward and the backward of one converted
    :class:`unit_scaling.Linear` on ``TOKENS`` tokens (float32 weights and
    input; under bf16 autocast if ``autocast``, as in training), in the second
    of two steps (the first makes the layer's cached scale tensors)."""
    torch.manual_seed(0)
    layer = convert_to_float8_training(
        nn.Sequential(uu.Linear(IN_FEATURES, OUT_FEATURES, bias=bias)), config=config
    ).to(device)
    x = torch.randn(TOKENS, IN_FEATURES, device=device, requires_grad=True)
    grad = torch.randn(TOKENS, OUT_FEATURES, device=device)
    dtype = torch.bfloat16 if autocast else torch.float32
    for counted in (False, True):
        layer.zero_grad(set_to_none=True)
        x.grad = None
        forward, backward = OpCounter(category), OpCounter(category)
        with (
            torch.autocast(device, dtype=torch.bfloat16, enabled=autocast),
            forward if counted else contextlib.nullcontext(),
        ):
            y = layer(x)
        g = grad.to(dtype)
        with backward if counted else contextlib.nullcontext():
            y.backward(g)
    return StepCounts(forward, backward)


def _storages(module: nn.Module) -> dict[int, tuple[str, int]]:
    """``data_ptr -> (name, bytes)`` of the storage of every parameter, buffer
    and tensor attribute of ``module`` and its submodules."""
    found: dict[int, tuple[str, int]] = {}
    for prefix, sub in module.named_modules():
        tensors = {**sub._parameters, **sub._buffers}
        tensors.update({k: v for k, v in vars(sub).items() if isinstance(v, Tensor)})
        for name, t in tensors.items():
            if t is None:
                continue
            storage = t.untyped_storage()
            key = f"{prefix}.{name}" if prefix else name
            found.setdefault(storage.data_ptr(), (key, storage.nbytes()))
    return found


@dataclasses.dataclass
class MemoryCheck:
    """What a converted model keeps: its storages before conversion, after it
    and after one training step; and what one layer's forward saves."""

    before: dict[int, tuple[str, int]]
    converted: dict[int, tuple[str, int]]
    trained: dict[int, tuple[str, int]]
    same_parameter_objects: bool
    saved: list[tuple[str, str, int]]  # (what, dtype, bytes) saved for backward


def check_memory(width: int = 64, vocab: int = 256, layers: int = 2) -> MemoryCheck:
    """Converts a small ``uu.TransformerDecoder`` and trains it one step."""
    torch.manual_seed(0)
    model = uu.TransformerDecoder(width, vocab, layers, heads=4)
    parameters = [id(p) for p in model.parameters()]
    before = _storages(model)
    convert_to_float8_training(model)
    converted = _storages(model)
    same = [id(p) for p in model.parameters()] == parameters
    optimizer = uu.optim.AdamW(model.parameters(), lr=1e-3)
    batch = torch.randint(vocab, (2, 33), generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model.loss(batch)
    loss.backward()  # type: ignore[no-untyped-call]
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    trained = _storages(model)

    layer = model.layers[0].mlp.linear_1
    owners = {
        p.untyped_storage().data_ptr(): f"{n} parameter"
        for n, p in layer.named_parameters()
    }
    saved: list[tuple[str, str, int]] = []

    def pack(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        what = owners.get(storage.data_ptr(), "a new tensor")
        saved.append((what, str(t.dtype).removeprefix("torch."), storage.nbytes()))
        return t

    x = torch.randn(2, 32, width, requires_grad=True)
    owners[x.untyped_storage().data_ptr()] = "input"
    with (
        torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
        torch.autocast("cpu", dtype=torch.bfloat16),
    ):
        layer(x)
    return MemoryCheck(before, converted, trained, same, saved)


def run() -> str:
    """The tables: ops per step by category and by name, and the memory check."""
    out = []
    headers = ("category", "forward", "backward", "step")
    for bias, save in ((False, False), (True, False), (False, True)):
        config = Float8Config(save_fp8_inputs=save)
        counts = count_step(bias=bias, config=config)
        f, b = by_category(counts.forward), by_category(counts.backward)
        rows: list[tuple[str, ...]] = [
            (c, str(f[c]), str(b[c]), str(f[c] + b[c])) for c in CATEGORIES
        ]
        names = counts.forward.counts + counts.backward.counts
        listing = ", ".join(f"{name} {n}" for name, n in sorted(names.items()))
        out.append(
            f"Ops of one training step of one FP8 linear ({IN_FEATURES} -> "
            f"{OUT_FEATURES}, {'with' if bias else 'no'} bias, {TOKENS} tokens, "
            f"bf16 autocast{', save_fp8_inputs=True' if save else ''}; aten ops, "
            "views left out)\n" + table(rows, headers) + f"\nby name: {listing}"
        )
    memory = check_memory()
    total = sum(n for _, n in memory.before.values())
    memory_rows: list[tuple[str, ...]] = [
        (stage, str(len(found)), f"{sum(n for _, n in found.values()):,}")
        for stage, found in (
            ("before conversion", memory.before),
            ("after conversion", memory.converted),
            ("after a training step", memory.trained),
        )
    ]
    same = memory.before == memory.converted == memory.trained
    saved = ", ".join(f"{what} ({dtype}, {n:,} B)" for what, dtype, n in memory.saved)
    out.append(
        "Storages of a converted uu.TransformerDecoder's parameters, buffers and "
        "tensor attributes (width 64, 2 layers)\n"
        + table(memory_rows, ("stage", "storages", "bytes"))
        + f"\nsame storages at every stage: {same}; the same parameter objects: "
        f"{memory.same_parameter_objects}; {total:,} bytes in all"
        + f"\nsaved for backward by one converted linear: {saved}"
    )
    return "\n\n".join(out)


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__).parse_args()
    print(run())
