"""The functions every transform keeps whole while tracing.

Our own unit-scaled functions (``unit_scaling.functional``) must each appear as
one node of a captured graph: traced into, the ``F.*`` calls inside them would
be rewritten a second time by ``unit_scale``, and quantised or observed op by op
by the other transforms. Each transform passes them to the engine as its
``non_recurse`` functions (``dynamo.capturing`` keeps them opaque).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ... import functional as U

__all__ = ["UNIT_SCALED_FUNCTIONS"]

# (residual_apply takes a function, which cannot be a graph argument; Dynamo
# traces it into its opaque parts.)
UNIT_SCALED_FUNCTIONS: tuple[Callable[..., Any], ...] = tuple(
    getattr(U, name)
    for name in U.__all__
    if callable(getattr(U, name)) and name != "residual_apply"
)
