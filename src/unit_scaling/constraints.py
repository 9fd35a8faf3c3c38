"""Constraints: how an op's independent scales are tied together.

A unit-scaled op has one output scale and one scale per differentiable input's
gradient. Choosing each independently makes both passes unit-scaled, but then the
backward pass no longer computes the gradient of the forward function. A
*constraint* picks a single shared scale so that it does (up to one global factor
per op, which the optimiser absorbs).

Each constraint is a function of the scales ``(output_scale, *grad_input_scales)``
returning the shared scale. :func:`apply_constraint` applies one by name.
"""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = [
    "VALID_CONSTRAINTS",
    "amean",
    "apply_constraint",
    "gmean",
    "hmean",
    "to_grad_input_scale",
    "to_left_grad_scale",
    "to_output_scale",
    "to_right_grad_scale",
]


def gmean(*scales: float) -> float:
    """Geometric mean of all scales: ``(prod s_i)^(1/n)``."""
    return math.exp(sum(math.log(s) for s in scales) / len(scales))


def hmean(*scales: float) -> float:
    """Harmonic mean of all scales: ``n / sum(1/s_i)``."""
    return len(scales) / sum(1 / s for s in scales)


def amean(*scales: float) -> float:
    """Arithmetic mean of all scales."""
    return sum(scales) / len(scales)


def to_output_scale(output_scale: float, *grad_input_scales: float) -> float:
    """Use the output scale for every scale (the default for most ops)."""
    return output_scale


def to_grad_input_scale(output_scale: float, grad_input_scale: float) -> float:
    """Use the input-gradient scale of a binary op (output, one input) for both."""
    return grad_input_scale


def to_left_grad_scale(
    output_scale: float, left_grad_scale: float, right_grad_scale: float
) -> float:
    """Use the left operand's gradient scale of a ternary op (e.g. ``matmul``)."""
    return left_grad_scale


def to_right_grad_scale(
    output_scale: float, left_grad_scale: float, right_grad_scale: float
) -> float:
    """Use the right operand's gradient scale of a ternary op (e.g. ``matmul``)."""
    return right_grad_scale


_CONSTRAINTS: dict[str, tuple[Callable[..., float], int | None]] = {
    # name: (function, number of scales it accepts, None for any)
    "gmean": (gmean, None),
    "hmean": (hmean, None),
    "amean": (amean, None),
    "to_output_scale": (to_output_scale, None),
    "to_grad_input_scale": (to_grad_input_scale, 2),
    "to_left_grad_scale": (to_left_grad_scale, 3),
    "to_right_grad_scale": (to_right_grad_scale, 3),
}

VALID_CONSTRAINTS: tuple[str, ...] = tuple(_CONSTRAINTS)
"""Names accepted by :func:`apply_constraint` (besides ``None`` and ``""``)."""


def validate_constraint(constraint: str | None) -> None:
    """Raise ``ValueError`` unless ``constraint`` is None, "" or a known name."""
    if constraint not in (None, "") and constraint not in _CONSTRAINTS:
        raise ValueError(
            f"constraint={constraint!r} is not a known constraint; expected None or "
            f"one of {', '.join(repr(c) for c in VALID_CONSTRAINTS)}"
        )


def apply_constraint(constraint: str | None, *scales: float) -> tuple[float, ...]:
    """Return ``scales`` after the named constraint (each equal to the shared value).

    ``None`` or ``""`` means unconstrained: the scales are returned unchanged.

    Args:
        constraint: a name from :data:`VALID_CONSTRAINTS`, ``None`` or ``""``.
        scales: ``(output_scale, *grad_input_scales)``.

    Example::

        >>> apply_constraint("gmean", 4.0, 1.0)
        (2.0, 2.0)
        >>> apply_constraint(None, 4.0, 1.0)
        (4.0, 1.0)
    """
    validate_constraint(constraint)
    if not scales:
        raise ValueError("apply_constraint needs at least one scale")
    if not constraint:
        return scales
    fn, arity = _CONSTRAINTS[constraint]
    if arity is not None and len(scales) != arity:
        raise ValueError(
            f"constraint={constraint!r} applies to ops with exactly {arity} scales "
            f"(output and {arity - 1} input gradient(s)), but {len(scales)} were "
            "given; choose a constraint such as 'to_output_scale' or 'gmean'"
        )
    shared = fn(*scales)
    return (shared,) * len(scales)
