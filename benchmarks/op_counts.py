"""Aten operators per training step: u-μP decoder vs the same model in plain torch.

A small model's training step on a GPU is launch-bound: its time follows the
number of kernels, and each aten compute operator is at least one. This counts
them, deterministically and on any device, for one step of ``uu.TransformerDecoder``
with ``uu.optim.AdamW`` and of ``StandardTransformerDecoder`` (the same
architecture in plain torch) with ``torch.optim.AdamW``, both ``foreach=True`` (the
optimizers' default on a GPU): forward (the loss), backward and optimizer step
apart, counted on the second step (the first creates the optimizer state).

What counts (:class:`OpCounter`): every aten operator a ``TorchDispatchMode``
sees, except those that launch no kernel — views and aliases (a schema that
returns an alias of an input: ``view``, ``t``, ``detach``, ...), ``_unsafe_view``,
allocations without a fill (``empty``, ...), and reading a CPU scalar (``.item()``
of the step counts torch's optimizers keep on the CPU; on a device it is a sync,
and counts). Operators inside autograd Functions are seen as they run; a custom
operator (``torch.library``) is counted by the aten operators of its
implementation, run under the counter, or as one kernel if it dispatches none
(a C++ or Triton kernel). Profiler markers are not operators. Given a
``classify`` function, the counter also counts by ``(category, name)``
(``benchmarks/float8_ops.py`` sorts an FP8 layer's operators so).

Targets: the whole step ≤ 1.1× the plain model's, and the optimizer step ≤ 1.5×
torch's foreach AdamW on the same (u-μP) parameters. Run:
``python -m benchmarks.op_counts``.
"""

from __future__ import annotations

import argparse
import collections
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

import unit_scaling as uu
from unit_scaling.app.baseline import StandardTransformerDecoder

from ._measure import table

HIDDEN, VOCAB, LAYERS, HEADS = 256, 256, 4, 4
BATCH, SEQ = 16, 256
PHASES = ("forward", "backward", "optimizer")
STEP_TARGET, OPTIMIZER_TARGET = 1.1, 1.5

# aten operators that launch no kernel although their schema returns a new
# tensor: a reshape that shares storage, and allocations left unfilled.
_NO_KERNEL = frozenset(
    {
        "_unsafe_view",
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
    }
)

Classify = Callable[[Any, tuple[Any, ...], dict[str, Any], Any], str]
"""``classify(func, args, kwargs, out)``: the category of an operator that ran
(``out`` is what it returned)."""


def _is_alias(func: Any) -> bool:
    """Whether ``func`` returns a view or alias of an input (not an in-place
    update, which is written through the alias)."""
    return any(
        r.alias_info is not None and not r.alias_info.is_write
        for r in func._schema.returns
    )


def _launches_a_kernel(func: Any, args: tuple[Any, ...]) -> bool:
    name = func.overloadpacket.__name__
    if name in _NO_KERNEL or _is_alias(func):
        return False
    if name == "_local_scalar_dense":  # `.item()`: a sync unless on the CPU
        return not args[0].is_cpu
    return True


def _device_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    for value in (*args, *kwargs.values()):
        if isinstance(value, Tensor):
            return value.device.type
        if isinstance(value, list | tuple):
            for item in value:
                if isinstance(item, Tensor):
                    return item.device.type
    return "cpu"


class OpCounter(TorchDispatchMode):
    """Counts the aten operators that launch kernels, by name (see the module
    docstring for what counts); given ``classify``, also by ``(category,
    name)`` in :attr:`classified`.

    Example::

        >>> with OpCounter() as counter:
        ...     _ = torch.ones(3).t().mul(2).sum()
        >>> dict(counter.counts)  # `ones` fills, `t` is a view
        {'ones': 1, 'mul': 1, 'sum': 1}
        >>> def category(func, args, kwargs, out):
        ...     return "reduce" if func.overloadpacket.__name__ == "sum" else "other"
        >>> with OpCounter(category) as counter:
        ...     _ = torch.ones(3).t().mul(2).sum()
        >>> dict(counter.classified)
        {('other', 'ones'): 1, ('other', 'mul'): 1, ('reduce', 'sum'): 1}
    """

    def __init__(self, classify: Classify | None = None) -> None:
        super().__init__()
        self.classify = classify
        self.counts: collections.Counter[str] = collections.Counter()
        self.classified: collections.Counter[tuple[str, str]] = collections.Counter()

    @property
    def total(self) -> int:
        """All operators counted."""
        return sum(self.counts.values())

    def _count(
        self,
        func: Any,
        name: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        out: Any,
    ) -> None:
        self.counts[name] += 1
        if self.classify is not None:
            self.classified[self.classify(func, args, kwargs, out), name] += 1

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func.namespace == "profiler":
            return func(*args, **kwargs)
        if func.namespace not in ("aten", "prims"):
            return self._custom_op(func, args, kwargs)
        out = func(*args, **kwargs)
        if _launches_a_kernel(func, args):
            self._count(func, func.overloadpacket.__name__, args, kwargs, out)
        return out

    def _custom_op(
        self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Run the custom operator's kernel for its device with this counter
        active, so that the aten operators of a Python implementation count."""
        device = _device_of(args, kwargs)
        key = getattr(torch._C.DispatchKey, torch._C._dispatch_key_for_device(device))
        before = self.total
        with self:
            out = func.redispatch(torch._C.DispatchKeySet(key), *args, **kwargs)
        if self.total == before:  # a compiled kernel: one launch at least
            self._count(func, str(func.overloadpacket), args, kwargs, out)
        return out


@dataclass
class StepCounts:
    """The operators of one training step, by phase and by name."""

    by_phase: dict[str, collections.Counter[str]] = field(default_factory=dict)

    def total(self, phase: str | None = None) -> int:
        """Operators of ``phase``, or of the whole step."""
        phases = PHASES if phase is None else (phase,)
        return sum(sum(self.by_phase[p].values()) for p in phases)


def count_step(
    loss_fn: Callable[[Tensor], Tensor], optimizer: torch.optim.Optimizer, batch: Tensor
) -> StepCounts:
    """The operators of a training step's forward, backward and optimizer step,
    counted on the second step (the first creates the optimizer state)."""
    optimizer.zero_grad(set_to_none=True)
    loss_fn(batch).backward()  # type: ignore[no-untyped-call]
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    counts = StepCounts()
    with OpCounter() as counter:
        loss = loss_fn(batch)
    counts.by_phase["forward"] = counter.counts
    with OpCounter() as counter:
        loss.backward()  # type: ignore[no-untyped-call]
    counts.by_phase["backward"] = counter.counts
    with OpCounter() as counter:
        optimizer.step()
    counts.by_phase["optimizer"] = counter.counts
    return counts


def measure(
    hidden: int = HIDDEN,
    vocab: int = VOCAB,
    layers: int = LAYERS,
    heads: int = HEADS,
    batch_shape: tuple[int, int] = (BATCH, SEQ),
) -> dict[str, StepCounts]:
    """Counts for the plain model with torch's AdamW (``"SP"``), the u-μP model
    with u-μP's AdamW (``"u-μP"``), and the u-μP model's parameters under
    torch's AdamW (``"u-μP, torch AdamW"``), all ``foreach=True``."""
    torch.manual_seed(0)
    batch = torch.randint(vocab, (batch_shape[0], batch_shape[1] + 1))
    plain = StandardTransformerDecoder(hidden, vocab, layers, heads)
    unit = uu.TransformerDecoder(hidden, vocab, layers, heads)
    twin = uu.TransformerDecoder(hidden, vocab, layers, heads)

    def adamw(model: nn.Module, u_mup: bool) -> torch.optim.Optimizer:
        make = uu.optim.AdamW if u_mup else torch.optim.AdamW
        optimizer: torch.optim.Optimizer = make(
            model.parameters(), lr=1e-3, foreach=True
        )
        return optimizer

    return {
        "SP": count_step(plain.loss, adamw(plain, u_mup=False), batch),
        "u-μP": count_step(unit.loss, adamw(unit, u_mup=True), batch),
        "u-μP, torch AdamW": count_step(twin.loss, adamw(twin, u_mup=False), batch),
    }


def ratios(counts: dict[str, StepCounts]) -> dict[str, float]:
    """u-μP's count over the plain model's, per phase and for the whole step,
    and the optimizer's over torch's AdamW on the same parameters."""
    ours, plain = counts["u-μP"], counts["SP"]
    found = {p: ours.total(p) / plain.total(p) for p in PHASES}
    found["step"] = ours.total() / plain.total()
    torch_adamw = counts["u-μP, torch AdamW"].total("optimizer")
    found["optimizer vs torch's AdamW"] = ours.total("optimizer") / torch_adamw
    return found


def _differences(counts: dict[str, StepCounts]) -> str:
    """How u-μP's operators differ from the plain model's, per phase."""
    lines = []
    for phase in PHASES:
        ours, plain = counts["u-μP"].by_phase[phase], counts["SP"].by_phase[phase]
        changes = {name: ours[name] - plain[name] for name in {*ours, *plain}}
        listed = ", ".join(
            f"{name} {n:+d}" for name, n in sorted(changes.items()) if n != 0
        )
        lines.append(f"  {phase}: {listed or 'the same'}")
    return "\n".join(lines)


def run() -> str:
    """The benchmark's table."""
    counts = measure()
    found = ratios(counts)
    rows: list[tuple[str, ...]] = []
    for phase in (*PHASES, "step"):
        key = None if phase == "step" else phase
        target = f"≤ {STEP_TARGET}" if phase == "step" else ""
        met = (
            "" if not target else ("met" if found[phase] <= STEP_TARGET else "NOT met")
        )
        rows.append(
            (
                phase,
                str(counts["SP"].total(key)),
                str(counts["u-μP"].total(key)),
                f"{found[phase]:.3f}",
                target,
                met,
            )
        )
    optimizer = found["optimizer vs torch's AdamW"]
    rows.append(
        (
            "optimizer vs torch's AdamW",
            str(counts["u-μP, torch AdamW"].total("optimizer")),
            str(counts["u-μP"].total("optimizer")),
            f"{optimizer:.3f}",
            f"≤ {OPTIMIZER_TARGET}",
            "met" if optimizer <= OPTIMIZER_TARGET else "NOT met",
        )
    )
    headers = ("per training step", "plain torch", "u-μP", "ratio", "target", "")
    return (
        f"Aten operators that launch kernels: hidden={HIDDEN} vocab={VOCAB} "
        f"layers={LAYERS} heads={HEADS}, batch=({BATCH}, {SEQ}), AdamW "
        "foreach=True (plain: torch's; u-μP: uu.optim's; last row: torch's on the "
        "u-μP parameters)\n"
        + table(rows, headers)
        + "\nu-μP's operators against the plain model's:\n"
        + _differences(counts)
    )


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__).parse_args()
    print(run())
