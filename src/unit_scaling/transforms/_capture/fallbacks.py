"""Where a transform fell back, and why.

Some steps of a transform are allowed to fail: recognising a hand-written norm,
measuring a region on stand-ins, checking a library rewrite on a probe. Each has
a fallback that keeps the transform correct (the op is calibrated instead, the
layer is traced as it is). What such a failure must never be is silent: it can
hide a real fault (a stand-in on the wrong device made every recognition fail on
a GPU). So every caught error is recorded here, with the step and what it was
working on, and ends up in the transform's report (``unit_scale_report()
.fallbacks``). Outside a transform that collects them, it is logged as a warning.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
from collections.abc import Iterator

__all__ = ["Fallback", "collecting", "fell_back"]

logger = logging.getLogger("unit_scaling.transforms")


@dataclasses.dataclass(frozen=True)
class Fallback:
    """One caught error: the ``step`` that failed (e.g. ``"recognise"``),
    ``where`` (the op, region or module it was working on) and ``error`` (its
    type and first line)."""

    step: str
    where: str
    error: str

    def __str__(self) -> str:
        return f"{self.step} fell back at {self.where}: {self.error}"


_collected: contextvars.ContextVar[list[Fallback] | None] = contextvars.ContextVar(
    "unit_scaling_fallbacks", default=None
)


@contextlib.contextmanager
def collecting() -> Iterator[list[Fallback]]:
    """Collect the fallbacks recorded inside the ``with`` block into the list
    it yields."""
    found: list[Fallback] = []
    token = _collected.set(found)
    try:
        yield found
    finally:
        _collected.reset(token)


def describe(error: BaseException | str) -> str:
    """An error as one line: its type and the first line of its message."""
    if isinstance(error, str):
        return error
    first = str(error).strip().splitlines()
    return f"{type(error).__name__}: {first[0]}" if first else type(error).__name__


def fell_back(step: str, where: str, error: BaseException | str) -> Fallback:
    """Record that ``step`` fell back at ``where`` because of ``error``."""
    entry = Fallback(step, where, describe(error))
    found = _collected.get()
    if found is not None:
        found.append(entry)
        logger.debug("%s", entry, exc_info=isinstance(error, BaseException))
    else:
        logger.warning("%s", entry)
    return entry
