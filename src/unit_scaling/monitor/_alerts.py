"""Warnings when a tensor's scale leaves where low precision can hold it:
:class:`AlertPolicy` and the :class:`Alerts` it drives."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping

from ._statistics import FORMATS

__all__ = ["AlertPolicy", "Alerts", "ScaleAlertError"]

logger = logging.getLogger("unit_scaling.monitor")

# The kinds whose scale a cast sees; an update is a difference of weights.
_CAST_KINDS = ("activation", "activation_grad", "weight", "weight_grad")


class ScaleAlertError(RuntimeError):
    """Raised instead of a warning when :attr:`AlertPolicy.raise_on_alert` is set."""


@dataclasses.dataclass(frozen=True)
class AlertPolicy:
    """When the monitor warns (once per tensor and condition).

    Args:
        saturated: the fraction of a tensor that would saturate in one of
            ``formats`` above which it warns.
        flushed: the fraction that would flush to zero above which it warns (a
            few percent is usual in the query and key gradients of unit-scaled
            attention, whose RMS is below 1).
        formats: the formats checked (names in :data:`FORMATS`).
        rms_band: for a unit-scaled model, the RMS must stay within
            ``[1 / rms_band, rms_band]``.
        drift: for any other model, the RMS must stay within a factor
            ``drift`` of its value at the tensor's first record.
        raise_on_alert: raise :class:`ScaleAlertError` instead of warning.

    Example::

        >>> AlertPolicy(flushed=0.1).flushed
        0.1
    """

    saturated: float = 1e-4
    flushed: float = 0.05
    formats: tuple[str, ...] = ("e4m3", "e5m2")
    rms_band: float = 8.0
    drift: float = 8.0
    raise_on_alert: bool = False

    def __post_init__(self) -> None:
        for name in ("saturated", "flushed"):
            value = getattr(self, name)
            if not 0 <= value < 1:
                raise ValueError(
                    f"AlertPolicy: {name} is a fraction in [0, 1), got {value!r}"
                )
        for name in ("rms_band", "drift"):
            value = getattr(self, name)
            if not value > 1:
                raise ValueError(
                    f"AlertPolicy: {name} is a factor above 1, got {value!r}"
                )
        unknown = set(self.formats) - set(FORMATS)
        if unknown:
            raise ValueError(
                f"AlertPolicy: unknown formats {sorted(unknown)}; expected names "
                f"in {sorted(FORMATS)}"
            )


class Alerts:
    """Checks each record against an :class:`AlertPolicy`, warning once per
    tensor and condition through the ``unit_scaling.monitor`` logger."""

    def __init__(self, policy: AlertPolicy, unit_scaled: bool) -> None:
        self.policy = policy
        self.unit_scaled = unit_scaled
        self.fired: list[str] = []
        self._seen: set[tuple[str, str, str]] = set()
        self._first_rms: dict[tuple[str, str], float] = {}

    def check(
        self, step: int, values: Mapping[tuple[str, str], Mapping[str, float]]
    ) -> None:
        """Warn about every tensor of one record that crosses a threshold."""
        policy = self.policy
        for (tensor, kind), stats in values.items():
            if kind not in _CAST_KINDS:
                continue
            for fmt in policy.formats:
                for what, limit in (
                    ("saturated", policy.saturated),
                    ("flushed", policy.flushed),
                ):
                    statistic = f"{fmt}_{what}"
                    if stats[statistic] > limit:
                        self._fire(
                            step,
                            tensor,
                            kind,
                            statistic,
                            stats[statistic],
                            f"above {limit:g}: {stats[statistic]:.2%} of it would "
                            f"{'saturate' if what == 'saturated' else 'flush to zero'}"
                            f" in {fmt.upper()}",
                        )
            self._check_rms(step, tensor, kind, stats["rms"])

    def _check_rms(self, step: int, tensor: str, kind: str, rms: float) -> None:
        if not math.isfinite(rms) or rms == 0:
            return
        if self.unit_scaled:
            band = self.policy.rms_band
            if not 1 / band <= rms <= band:
                self._fire(
                    step,
                    tensor,
                    kind,
                    "rms",
                    rms,
                    f"outside the unit-scale band [1/{band:g}, {band:g}]",
                )
            return
        first = self._first_rms.setdefault((tensor, kind), rms)
        ratio = rms / first
        drift = self.policy.drift
        if not 1 / drift <= ratio <= drift:
            self._fire(
                step,
                tensor,
                kind,
                "rms",
                rms,
                f"{ratio:.3g}x its value at its first record ({first:.3g}), "
                f"beyond the drift factor {drift:g}",
            )

    def _fire(
        self,
        step: int,
        tensor: str,
        kind: str,
        statistic: str,
        value: float,
        why: str,
    ) -> None:
        key = (tensor, kind, statistic)
        if key in self._seen:
            return
        self._seen.add(key)
        message = f"step {step}: {tensor} ({kind}) {statistic} = {value:.4g}, {why}"
        self.fired.append(message)
        if self.policy.raise_on_alert:
            raise ScaleAlertError(message)
        logger.warning("unit_scaling.monitor: %s", message)
