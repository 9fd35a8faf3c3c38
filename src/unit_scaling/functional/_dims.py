"""One public function per number of spatial dimensions, from one rule.

torch names its spatial ops per dimension (``conv1d``, ``conv2d``, ``conv3d``)
with one signature. Here each family's rule is written once, for ``n`` dimensions,
with that signature after ``n``; :func:`for_dims` makes ``<rule>{n}d``: the rule
with ``n`` fixed, named as torch names it, documented from one template, and
living in the rule's own module (for ``help``, ``inspect``, doctest and pickle).
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from string import Template
from typing import Concatenate, ParamSpec, TypeVar, cast

P = ParamSpec("P")
R = TypeVar("R")

_AXES = {1: ("L",), 2: ("H", "W"), 3: ("D", "H", "W")}


def axis_names(n: int) -> dict[str, str]:
    """What a docstring template may say of ``n`` spatial dims, e.g. for 2:
    ``$axes`` "H, W", ``$kernel`` "kH, kW", ``$kernel_numel`` "kH·kW",
    ``$stride_numel`` "sH·sW", ``$axes_in_numel`` "H_in·W_in" and
    ``$axes_out_numel`` "H_out·W_out"."""
    axes = _AXES[n]
    return {
        "n": str(n),
        "axes": ", ".join(axes),
        "kernel": ", ".join(f"k{a}" for a in axes),
        "kernel_numel": "·".join(f"k{a}" for a in axes),
        "stride_numel": "·".join(f"s{a}" for a in axes),
        "axes_in_numel": "·".join(f"{a}_in" for a in axes),
        "axes_out_numel": "·".join(f"{a}_out" for a in axes),
    }


def for_dims(
    rule: Callable[Concatenate[int, P], R], n: int, doc: Template, **text: str
) -> Callable[P, R]:
    """``rule`` with its first argument (the number of spatial dims) set to ``n``.

    The function is named ``rule.__name__`` without its underscore plus ``{n}d``,
    has ``rule``'s signature without ``n``, and the docstring ``doc`` filled with
    :func:`axis_names` of ``n``, ``$name`` and ``text``.
    """
    template = cast(types.FunctionType, rule)
    name = f"{template.__name__.lstrip('_')}{n}d"
    signature = inspect.signature(template)
    first, *parameters = signature.parameters.values()
    signature = signature.replace(parameters=parameters)

    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return rule(n, *args, **kwargs)
        except TypeError as error:
            # Raised by the call itself (no frame of the rule's), it would name
            # the rule and count ``n``: say it of this function's arguments.
            if error.__traceback__ is None or error.__traceback__.tb_next is not None:
                raise
            try:
                signature.bind(*args, **kwargs)
            except TypeError as wrong:
                raise TypeError(f"{name}(): {wrong}") from None
            raise

    # Made again with the rule's globals: doctest takes a module's functions to be
    # those whose globals are the module's.
    code = call.__code__.replace(co_name=name, co_qualname=name)
    function = types.FunctionType(
        code, template.__globals__, name, None, call.__closure__
    )
    function.__qualname__ = name
    function.__module__ = template.__module__
    function.__doc__ = doc.substitute(axis_names(n), name=name, **text)
    function.__signature__ = signature  # type: ignore[attr-defined]
    function.__annotations__ = {
        key: value
        for key, value in template.__annotations__.items()
        if key != first.name
    }
    return cast(Callable[P, R], function)
