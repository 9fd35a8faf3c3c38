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

# The usual FP8 recipe: values forward in E4M3, gradients in E5M2. (An update
# is a difference of weights: no cast sees it.)
RECIPE_CASTS: dict[str, tuple[str, ...]] = {
    "activation": ("e4m3",),
    "weight": ("e4m3",),
    "activation_grad": ("e5m2",),
    "weight_grad": ("e5m2",),
}


class ScaleAlertError(RuntimeError):
    """Raised instead of a warning when :attr:`AlertPolicy.raise_on_alert` is set."""


@dataclasses.dataclass(frozen=True)
class AlertPolicy:
    """When the monitor warns (once per tensor and condition).

    Args:
        saturated: the fraction of a tensor that would saturate, in a format
            it is cast to (see ``casts``), above which it warns.
        flushed: the fraction that would flush to zero above which it warns (a
            few percent is usual in the query and key gradients of unit-scaled
            attention, whose RMS is below 1).
        casts: the formats each kind of tensor is checked against (names in
            :data:`FORMATS`), by kind; default: the usual FP8 recipe's, E4M3
            for activations and weights, E5M2 for their gradients. A kind not
            listed is checked for its RMS only.
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
    casts: Mapping[str, tuple[str, ...]] = dataclasses.field(
        default_factory=lambda: dict(RECIPE_CASTS)
    )
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
        kinds = {"activation", "activation_grad", "weight", "weight_grad", "update"}
        if not set(self.casts) <= kinds:
            raise ValueError(
                "AlertPolicy: casts has unknown kinds "
                f"{sorted(set(self.casts) - kinds)}; expected some of {sorted(kinds)}"
            )
        unknown = {f for formats in self.casts.values() for f in formats} - set(FORMATS)
        if unknown:
            raise ValueError(
                f"AlertPolicy: unknown formats {sorted(unknown)} in casts; expected "
                f"names in {sorted(FORMATS)}"
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
            if kind == "update":
                continue  # (its RMS is the learning rate's business)
            for fmt in policy.casts.get(kind, ()):
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
