"""Unit-scaled soft-capping, ``cap * tanh(x / cap)`` (Gemma 2, Grok logit caps)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._checks import validate_constraint
from ._scaling import memoise, normal_expectation, scaled_unary

__all__ = ["softcap"]


@memoise
def _softcap_scales(cap: float) -> tuple[float, float]:
    """``(1 / std[cap·tanh(x/cap)], 1 / RMS[sech²(x/cap)])`` for unit-normal ``x``.

    Small caps make both integrands vary on the length scale ``cap`` and vanish
    (``sech``) or saturate (``tanh``) beyond ``40·cap``: integrate ``sech``
    there and finely, and use ``tanh² = 1 - sech²``.
    """

    def sech_sq(x: float) -> float:
        return 1 / math.cosh(x / cap) ** 2

    if cap >= 1:
        tanh_sq = normal_expectation(lambda x: math.tanh(x / cap) ** 2)
        sech_4 = normal_expectation(lambda x: sech_sq(x) ** 2)
    else:
        tanh_sq = 1 - normal_expectation(sech_sq, width=cap, support=40 * cap)
        sech_4 = normal_expectation(
            lambda x: sech_sq(x) ** 2, width=cap, support=40 * cap
        )
    return 1 / (cap * math.sqrt(tanh_sq)), 1 / math.sqrt(sech_4)


def softcap(
    input: Tensor, cap: float, constraint: str | None = "to_output_scale"
) -> Tensor:
    """Unit-scaled soft-capping: ``cap * tanh(input / cap)``.

    .. math::
        y = \\alpha\\, c \\tanh(x / c), \\quad
        \\alpha = \\frac{1}{c \\sqrt{E[\\tanh^2(x/c)]}}, \\qquad
        \\partial_x = \\beta\\, \\mathrm{sech}^2(x / c)\\, \\partial_y, \\quad
        \\beta = \\frac{1}{\\sqrt{E[\\mathrm{sech}^4(x/c)]}}

    with expectations over a unit-normal ``x``, computed by quadrature (cached per
    cap). A large cap leaves unit data almost untouched (both scales tend to 1,
    e.g. 1.010 at ``c = 10``, 1.001 at ``c = 30``); ``c = 1`` is
    :func:`~unit_scaling.functional.tanh` (1.5925, 1.4674); a small cap
    saturates to ``c·sign(x)`` (:math:`\\alpha \\to 1/c`) with a gradient that
    reaches only ``|x| ≲ c`` (:math:`\\beta \\to (3 \\sqrt{2\\pi} / (4 c))^{1/2}`).
    The constraint ties ``(alpha, beta)``.

    Args:
        input: any shape.
        cap: the cap ``c > 0``: outputs lie in ``(-c, c)`` before scaling.
        constraint: see :mod:`unit_scaling.constraints`.

    Example::

        >>> y = U.softcap(torch.randn(2**16), 2.0)
        >>> round(y.std().item(), 1)
        1.0
    """
    validate_constraint(constraint)
    if isinstance(cap, bool) or not isinstance(cap, int | float) or not cap > 0:
        raise ValueError(
            f"U.softcap: cap must be a positive number (outputs lie in (-cap, cap)), "
            f"got cap={cap!r}"
        )
    cap = float(cap)
    return scaled_unary(
        torch.tanh,
        input,
        *_softcap_scales(cap),
        constraint,
        input_mult=1 / cap,
        output_mult=cap,
    )
