"""How much of a model ``unit_scale`` puts at unit scale: :func:`unit_scale_coverage`.

The definition of unit scaling, measured: with the model's inputs (unit-normal
where they are floating point) and a unit-normal gradient on its output, the
fraction of parameter gradients, and of every tensor ``track_scales`` records
(activations, their gradients, parameter gradients), whose RMS lies in
``[low, high]``.

Not counted, because they carry no scale to judge: tensors that are all zero (a
zero-initialised table), tensors that receive no gradient (masks, rotary
sin/cos tables, position indices: constants that do not depend on the input),
and gradients that are zero by construction (a key bias, to which softmax is
invariant). Views and copies of a tensor count once.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from torch import Tensor, nn
from torch.fx import Graph

from .._standins import normal_like, seeded
from ..transforms import prune_same_scale_tensors, track_scales, unit_scale

__all__ = ["CoverageReport", "unit_scale_coverage"]

# A gradient this small in a unit-scaled model is zero by construction, up to
# rounding (a key bias: softmax is invariant to adding a constant per query).
ZERO_GRADIENT_RMS = 1e-4

Inputs = tuple[tuple[Any, ...], dict[str, Any]]


def _rms(data: Any) -> float:
    """RMS of a tensor from its ``Metrics.Data``: ``sqrt(std² + abs_mean²)``."""
    return math.sqrt(data.std**2 + data.abs_mean**2)


@dataclasses.dataclass
class CoverageReport:
    """The scales of a unit-scaled model's tensors (see the module docstring).

    ``parameters`` holds ``(name, gradient RMS)``; ``tensors`` holds
    ``(direction, name, RMS)`` with direction ``"fwd"`` (a value) or ``"bwd"``
    (a gradient); ``excluded`` maps a reason (``"all zero"``, ``"no gradient"``,
    ``"zero gradient"``) to the names left out for it.
    """

    parameters: list[tuple[str, float]]
    tensors: list[tuple[str, str, float]]
    excluded: dict[str, list[str]]
    low: float = 0.5
    high: float = 2.0
    graph: Graph | None = None

    def _inside(self, rms: float) -> bool:
        return self.low <= rms <= self.high

    @property
    def failing_parameters(self) -> list[tuple[str, float]]:
        return [p for p in self.parameters if not self._inside(p[1])]

    @property
    def failing_tensors(self) -> list[tuple[str, str, float]]:
        return [t for t in self.tensors if not self._inside(t[2])]

    @property
    def parameter_fraction(self) -> float:
        """Fraction of parameter gradients at unit scale (1 if there are none)."""
        if not self.parameters:
            return 1.0
        return 1 - len(self.failing_parameters) / len(self.parameters)

    @property
    def tensor_fraction(self) -> float:
        """Fraction of tracked tensors at unit scale (1 if there are none)."""
        if not self.tensors:
            return 1.0
        return 1 - len(self.failing_tensors) / len(self.tensors)

    def describe(self, limit: int = 12) -> str:
        """A one-paragraph summary naming the first ``limit`` failures."""
        params = ", ".join(f"{n}={v:.3g}" for n, v in self.failing_parameters[:limit])
        tensors = ", ".join(
            f"{d}:{n}={v:.3g}" for d, n, v in self.failing_tensors[:limit]
        )
        excluded = {k: len(v) for k, v in self.excluded.items()}
        return (
            f"parameter gradients {self.parameter_fraction:.1%} of "
            f"{len(self.parameters)} in [{self.low}, {self.high}] (failing: "
            f"{params or 'none'}); tensors {self.tensor_fraction:.1%} of "
            f"{len(self.tensors)} (failing: {tensors or 'none'}); excluded {excluded}"
        )


def _tensor_scales(
    graph: Graph,
) -> tuple[list[tuple[str, str, float]], dict[str, list[str]]]:
    graph = prune_same_scale_tensors(graph)
    scales: list[tuple[str, str, float]] = []
    excluded: dict[str, list[str]] = {
        "all zero": [],
        "no gradient": [],
        "zero gradient": [],
    }
    for node in graph.nodes:
        metrics = node.meta.get("metrics")
        if metrics is None:
            continue
        name = node.meta["clean_name"]
        is_parameter = node.meta.get("requires_grad", False)
        if metrics.bwd is None:
            excluded["no gradient"].append(name)
            continue
        if not is_parameter:
            if metrics.fwd.abs_max == 0:
                excluded["all zero"].append(name)
            else:
                scales.append(("fwd", name, _rms(metrics.fwd)))
        if _rms(metrics.bwd) < ZERO_GRADIENT_RMS:
            excluded["zero gradient"].append(name)
        else:
            scales.append(("bwd", name, _rms(metrics.bwd)))
    return scales, excluded


def _measure(
    tracked: nn.Module,
    inputs: Inputs,
    output: Callable[[Any], Tensor],
    seed: int,
    low: float,
    high: float,
) -> CoverageReport:
    for param in tracked.parameters():
        param.grad = None
    args, kwargs = inputs
    result = output(tracked(*args, **kwargs))
    if not isinstance(result, Tensor) or not result.is_floating_point():
        raise TypeError(
            "output must pick a floating-point tensor from the model's output, got "
            f"{type(result).__name__}"
        )
    grad = normal_like(result, seeded(seed + 2000))
    result.backward(grad)  # type: ignore[no-untyped-call]
    parameters = []
    zero: list[str] = []
    for name, param in tracked.named_parameters():
        if param.grad is None:
            continue
        rms = float(param.grad.float().square().mean().sqrt())
        if rms < ZERO_GRADIENT_RMS:
            zero.append(name)
        else:
            parameters.append((name, rms))
    graph = tracked.scales_graph()  # type: ignore[operator]
    tensors, excluded = _tensor_scales(graph)
    excluded["zero gradient"] = sorted({*excluded["zero gradient"], *zero})
    return CoverageReport(parameters, tensors, excluded, low, high, graph)


def unit_scale_coverage(
    model: nn.Module,
    *inputs: Inputs,
    output: Callable[[Any], Tensor] = lambda out: out,
    seed: int = 0,
    low: float = 0.5,
    high: float = 2.0,
) -> list[CoverageReport]:
    """Unit-scale ``model`` and report which tensors are at unit scale (see the
    module docstring) for each set of ``inputs`` in turn.

    The model is transformed once, then called with each input set (the first
    is the one its scales are calibrated on; later ones, at other shapes, show
    whether those scales hold), each followed by a backward pass from a
    unit-normal gradient on its output.

    Args:
        model: the model, as the user has it (it is not modified).
        inputs: one or more ``(args, kwargs)`` for its forward.
        output: picks the tensor to backpropagate from, from what forward returns
            (e.g. ``lambda out: out.logits``).
        seed: seeds the output gradients.
        low, high: the range that counts as unit scale.

    Example::

        >>> model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
        >>> [report] = unit_scale_coverage(model, ((torch.randn(32, 64),), {}))
        >>> report.parameter_fraction
        1.0
    """
    if not inputs:
        raise ValueError("unit_scale_coverage needs at least one (args, kwargs) input")
    if not 0 < low < high:
        raise ValueError(f"expected 0 < low < high, got low={low!r}, high={high!r}")
    tracked = track_scales(unit_scale(model))
    return [_measure(tracked, i, output, seed, low, high) for i in inputs]
