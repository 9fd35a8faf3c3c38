"""Whether the zoo section's two sides agree: where a side runs, what it
computed, and the comparison of the other side with the CPU's reference.

The other side is a :class:`Side`: a CUDA device in ``python -m
benchmarks.gpu``, the CPU itself in ``--cpu-check``; a stand-in for a device
plugs in as another class with the same methods (``zoo.compare(model,
transform, StandIn())``, or ``zoo.run(settings, deadline, StandIn())`` for the
whole section).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from ._common import short


class Side(Protocol):
    """Where one side of the comparison runs: it takes the CPU's model and
    inputs there and gives its results back as CPU tensors. The zoo's worker
    processes receive it pickled: a module-level class with picklable fields."""

    @property
    def name(self) -> str:
        """How the rows and the table call this side (``"cuda"``)."""
        ...

    def put_model(self, model: nn.Module) -> nn.Module:
        """``model`` (a CPU copy, not used again) on this side."""
        ...

    def put(self, tree: Any) -> Any:
        """Inputs on this side: every tensor in ``tree`` (nested tuples, lists
        and dicts) moved, the rest kept."""
        ...

    def back(self, tensor: Tensor) -> Tensor:
        """A result of this side's as a detached CPU tensor."""
        ...


@dataclasses.dataclass(frozen=True)
class DeviceSide:
    """A :class:`Side` on a torch device: ``.to(device)`` there, ``.cpu()``
    back."""

    device: torch.device

    @property
    def name(self) -> str:
        return self.device.type

    def put_model(self, model: nn.Module) -> nn.Module:
        return model.to(self.device)

    def put(self, tree: Any) -> Any:
        from unit_scaling._torch_internals import pytree

        return pytree.tree_map_only(Tensor, lambda t: t.to(self.device), tree)

    def back(self, tensor: Tensor) -> Tensor:
        return tensor.detach().cpu()


CPU = DeviceSide(torch.device("cpu"))  # the reference side


@dataclasses.dataclass(frozen=True)
class Report:
    """A transform's report as plain data: ``entries`` compared exactly (op
    records, parameter roles, tracked tensors' names), ``numbers`` (calibrated
    gradient scales, tracked statistics) with a tolerance, by name."""

    entries: list[Any]
    numbers: dict[str, float]


@dataclasses.dataclass
class SideResult:
    """What one side computed for one model and transform, on the CPU: the
    forward output, each parameter's gradient by name and the report (``None``
    where ``error`` says why), and what it printed to stderr and logged."""

    output: Tensor | None = None
    grads: dict[str, Tensor] = dataclasses.field(default_factory=dict)
    report: Report | None = None
    error: str | None = None
    stderr: str = ""
    messages: list[str] = dataclasses.field(default_factory=list)


# A value this far below its peers' typical size (a gradient that is zero in
# exact arithmetic, as an attention key's bias's: rounding noise on both sides)
# is measured against that floor instead of its own size.
NOISE_FLOOR = 1e-6


def _median(values: list[float]) -> float:
    ordered = sorted(v for v in values if math.isfinite(v))
    return ordered[len(ordered) // 2] if ordered else 0.0


def relative_difference(got: Tensor, expected: Tensor, floor: float = 0.0) -> float:
    """``‖got − expected‖ / max(‖expected‖, floor)`` in float64 (the absolute
    difference where both are zero); ``inf`` for different shapes or a
    non-finite value on one side only."""
    if got.shape != expected.shape:
        return math.inf
    a = got.detach().to("cpu", torch.float64)
    b = expected.detach().to("cpu", torch.float64)
    finite_a, finite_b = torch.isfinite(a), torch.isfinite(b)
    if not torch.equal(finite_a, finite_b) or not torch.equal(
        a[~finite_a], b[~finite_b]
    ):
        return math.inf
    a, b = a[finite_a], b[finite_b]
    norm = max(float(b.norm()), floor)
    diff = float((a - b).norm())
    return diff / norm if norm > 0 else diff


def _numbers_difference(got: dict[str, float], expected: dict[str, float]) -> float:
    """The largest ``|got − expected| / max(|got|, |expected|, floor)`` over
    the names (``floor``: :data:`NOISE_FLOOR` times the median ``|expected|``);
    ``inf`` for a name on one side only or a non-finite mismatch."""
    if got.keys() != expected.keys():
        return math.inf
    floor = NOISE_FLOOR * _median([abs(b) for b in expected.values()])
    worst = 0.0
    for key, b in expected.items():
        a = got[key]
        scale = max(abs(a), abs(b), floor)
        if scale > 0 and math.isfinite(scale):
            worst = max(worst, abs(a - b) / scale)
        elif a != b and not (math.isnan(a) and math.isnan(b)):
            worst = math.inf
    return worst


def compare_sides(
    reference: SideResult, other: SideResult, other_name: str
) -> dict[str, Any]:
    """A zoo row's verdicts: ``other`` against ``reference`` (the CPU's).

    Always: ``error`` (the reference's first) and ``error_side``, each side's
    stderr and its count of messages, the first messages. Where neither side
    failed: ``output``, ``‖other − reference‖ / ‖reference‖`` of the forward
    output; ``grads``, the largest such difference over the parameters (each
    measured against at least :data:`NOISE_FLOOR` times the median gradient
    norm; a gradient on one side only: ``inf``), ``worst_param`` naming it and
    ``params`` counting them; ``report_entries_equal``; ``report_numbers``,
    the largest relative difference of the report's numbers (a number on one
    side only: ``inf``).

    >>> same = SideResult(torch.ones(3), {"w": torch.ones(2)}, Report([], {}))
    >>> compare_sides(same, same, "cuda")["output"]
    0.0
    """
    row: dict[str, Any] = {
        "error": reference.error or other.error,
        "error_side": "cpu" if reference.error else other_name if other.error else None,
        "stderr_cpu": reference.stderr,
        "stderr_device": other.stderr,
        "messages_cpu": len(reference.messages),
        "messages_device": len(other.messages),
        "first_messages": [
            short(m) for m in (other.messages or reference.messages)[:3]
        ],
    }
    if row["error"] is not None:
        return row
    if reference.output is None or reference.report is None:
        raise ValueError("the reference side has neither an error nor its results")
    if other.output is None or other.report is None:
        raise ValueError(f"the {other_name} side has neither an error nor its results")
    floor = NOISE_FLOOR * _median([float(g.norm()) for g in reference.grads.values()])
    differences = {
        name: relative_difference(other.grads[name], g, floor)
        if name in other.grads
        else math.inf
        for name, g in reference.grads.items()
    }
    differences.update({name: math.inf for name in other.grads.keys() - differences})
    worst = max(differences, key=differences.__getitem__, default=None)
    row.update(
        output=relative_difference(other.output, reference.output),
        grads=differences[worst] if worst is not None else 0.0,
        worst_param=worst,
        params=len(differences),
        report_entries_equal=other.report.entries == reference.report.entries,
        report_numbers=_numbers_difference(
            other.report.numbers, reference.report.numbers
        ),
    )
    return row
