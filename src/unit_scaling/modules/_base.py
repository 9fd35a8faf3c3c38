"""The base class of unit-scaled modules that own u-μP-tagged parameters."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from torch import Tensor, nn

from ..parameter import has_parameter_data, retag

__all__ = ["KeepsTags", "check_sizes", "own_tags_kept"]


@contextmanager
def own_tags_kept(module: nn.Module) -> Iterator[None]:
    """Re-tag ``module``'s own parameters that the body replaced by untagged ones."""
    saved = {
        name: (p.mup_type, p.mup_scaling_depth)
        for name, p in module._parameters.items()
        if has_parameter_data(p)
    }
    yield
    for name, (mup_type, depth) in saved.items():
        param = module._parameters.get(name)
        if param is not None and not has_parameter_data(param):
            retag(param, mup_type, depth)


class KeepsTags(nn.Module):
    """Base of the unit-scaled modules that own tagged parameters.

    ``nn.Module._apply`` installs new, untagged parameter objects on
    ``to("meta")``, ``to_empty``, conversions in swap mode and for DTensor
    parameters, and so does ``load_state_dict(assign=True)``; this puts each
    parameter's tags back afterwards (see :func:`unit_scaling.parameter.retag`).
    """

    def _apply(self, fn: Callable[[Tensor], Tensor], *args: Any, **kwargs: Any) -> Any:
        with own_tags_kept(self):
            return super()._apply(fn, *args, **kwargs)  # type: ignore[no-untyped-call]

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        with own_tags_kept(self):
            super()._load_from_state_dict(*args, **kwargs)


def check_sizes(owner: str, *, positive: bool = True, **sizes: int) -> None:
    """Raise a clear error unless every size is an int, positive (or, with
    ``positive=False``, non-negative): ``uu.<owner>: <name> must be ...``.

    Example::

        >>> check_sizes("Linear", in_features=0, out_features=4)
        Traceback (most recent call last):
        ...
        ValueError: uu.Linear: in_features must be a positive int, got 0
    """
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(
                f"uu.{owner}: {name} must be an int, got {type(value).__name__}"
            )
        if value < 0 or (positive and value == 0):
            kind = "a positive" if positive else "a non-negative"
            raise ValueError(f"uu.{owner}: {name} must be {kind} int, got {value}")
