"""What ``unit_scale`` did to each op and parameter: :class:`UnitScaleReport`."""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from typing import Any, Literal

from .._capture.fallbacks import Fallback
from .tags import TagRecord

__all__ = [
    "ADDED_AFTER_SETUP",
    "OpRecord",
    "ParameterRecord",
    "UnitScaleReport",
    "name_pattern",
]

# A parameter's ``init`` when it joined the module after ``unit_scale`` set it
# up (an adapter's weights, resized embeddings): its values are kept.
ADDED_AFTER_SETUP = "kept: added after unit_scale"

How = Literal["analytic", "residual", "calibrated", "unit already", "left as is"]


@dataclasses.dataclass(frozen=True)
class OpRecord:
    """One traced op (or calibrated region of ops) and what unit scaling did.

    ``how`` is ``"analytic"`` (replaced by a unit-scaled function with a
    documented rule), ``"residual"`` (a residual add, see ``U.residual_add``),
    ``"calibrated"`` (no rule: a static scale measured on unit-normal stand-ins),
    ``"unit already"`` (calibrated, and found within 10% of unit scale, so left
    unchanged) or ``"left as is"`` (neither a rule nor calibration applies;
    ``detail`` says why).
    """

    op: str
    how: How
    module: str
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class ParameterRecord:
    """A parameter's role as ``unit_scale`` read it from the graph, what was done
    to its value (``"unit std"``, ``"zero"``, ``"ones"``, ``"kept"``,
    ``"initialised before"`` by the layer it belongs to or an earlier capture, or
    ``"kept: added after unit_scale"`` for a parameter that was not part of the
    module when ``unit_scale`` was called: an adapter's, a resized embedding),
    and the calibrated scale applied to its gradient (1 if none)."""

    name: str
    role: str
    init: str
    grad_scale: float = 1.0


def name_pattern(module: str) -> str:
    """``model.layers.3.mlp`` -> ``model.layers.*.mlp``: one row for every layer."""
    return re.sub(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.|$)", "*", module)


@dataclasses.dataclass
class UnitScaleReport:
    """Every op ``unit_scale`` met in the graphs it captured, and what it did.

    Filled as graphs are captured (at the first call, and again for each new
    input signature or graph break). ``str(report)`` prints a summary table with
    one row per (op, treatment, module pattern); :meth:`summary` returns those
    rows, :meth:`to_dataframe` a pandas DataFrame of them.

    Example::

        >>> from unit_scaling.transforms import unit_scale
        >>> model = unit_scale(nn.Sequential(nn.Linear(8, 8), nn.Softplus()))
        >>> _ = model(torch.randn(4, 8))
        >>> report = model.unit_scale_report()
        >>> sorted({r.how for r in report.ops})
        ['analytic', 'calibrated', 'unit already']
    """

    ops: list[OpRecord] = dataclasses.field(default_factory=list)
    parameters: list[ParameterRecord] = dataclasses.field(default_factory=list)
    # The u-μP tags of every parameter, by name (each name of a tied parameter).
    tags: dict[str, TagRecord] = dataclasses.field(default_factory=dict)
    # Steps that failed and fell back (a recognition, a measurement), and why.
    fallbacks: list[Fallback] = dataclasses.field(default_factory=list)

    @property
    def generic_tags(self) -> list[TagRecord]:
        """Parameters tagged by rank alone: neither a layer nor the graph showed
        their u-μP type."""
        return [
            t
            for name, t in self.tags.items()
            if t.source == "generic" and t.name == name
        ]

    @property
    def left_as_is(self) -> list[OpRecord]:
        """The ops that were neither unit-scaled by a rule nor calibrated."""
        return [r for r in self.ops if r.how == "left as is"]

    def gradient_scales(self) -> dict[str, float]:
        """The calibrated gradient scale of each parameter, by name (the last
        capture that used it)."""
        return {p.name: p.grad_scale for p in self.parameters}

    def counts(self) -> dict[str, int]:
        """How many ops were treated each way."""
        return dict(Counter(r.how for r in self.ops))

    def summary(self) -> list[tuple[str, str, str, int, str]]:
        """Rows ``(op, how, module pattern, count, detail)``, in first-seen order."""
        rows: dict[tuple[str, str, str, str], int] = {}
        for r in self.ops:
            key = (r.op, r.how, name_pattern(r.module), r.detail)
            rows[key] = rows.get(key, 0) + 1
        return [(op, how, mod, n, detail) for (op, how, mod, detail), n in rows.items()]

    def to_dataframe(self) -> Any:
        """:meth:`summary` as a pandas DataFrame (needs ``pandas``)."""
        try:
            import pandas  # type: ignore[import-untyped,unused-ignore]
        except ImportError as error:
            raise ImportError(
                "UnitScaleReport.to_dataframe needs pandas: "
                'pip install "torch-unit-scaling[plot]"'
            ) from error
        return pandas.DataFrame(
            self.summary(), columns=["op", "how", "module", "count", "detail"]
        )

    def __str__(self) -> str:
        if not self.ops:
            return "UnitScaleReport: nothing captured yet (call the module first)"
        counts = ", ".join(f"{n} {how}" for how, n in self.counts().items())
        lines = [f"unit_scale: {len(self.ops)} ops ({counts})"]
        rows = self.summary()
        widths = [
            max(len(h), *(len(str(r[i])) for r in rows))
            for i, h in enumerate(("op", "how", "module", "count"))
        ]
        header = ("op", "how", "module", "count", "detail")
        for row in (header, *rows):
            cells = [str(c).ljust(w) for c, w in zip(row[:4], widths, strict=True)]
            lines.append("  ".join([*cells, str(row[4])]).rstrip())
        lines.extend(f"fallback: {entry}" for entry in self.fallbacks)
        return "\n".join(lines)

    def warning_text(self, records: list[OpRecord]) -> str:
        """One paragraph naming ops left as is, grouped (for the WARNING log)."""
        grouped: dict[tuple[str, str], list[str]] = {}
        for r in records:
            grouped.setdefault((r.op, r.detail), []).append(name_pattern(r.module))
        parts = []
        for (op, detail), modules in grouped.items():
            where = ", ".join(dict.fromkeys(m or "<root>" for m in modules))
            parts.append(f"{op} x{len(modules)} in {where}: {detail}")
        return "; ".join(parts)
