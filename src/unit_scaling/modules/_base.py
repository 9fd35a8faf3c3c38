"""What the unit-scaled modules share: keeping parameter tags, calling one ``U``
function with the module's own arguments, and the ``N(0, 1)`` weight."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from torch import Tensor, nn

from ..constraints import validate_constraint
from ..parameter import MupType, Parameter, has_parameter_data, retag, tags_of

__all__ = [
    "CallsFunction",
    "KeepsTags",
    "WeightAndBias",
    "check_sizes",
    "own_tags_kept",
]


@contextmanager
def own_tags_kept(module: nn.Module) -> Iterator[None]:
    """Re-tag ``module``'s own parameters that the body replaced by untagged ones."""
    saved = {
        name: tags
        for name, p in module._parameters.items()
        if (tags := tags_of(p)) is not None
    }
    yield
    for name, tags in saved.items():
        param = module._parameters.get(name)
        if param is not None and not has_parameter_data(param):
            retag(param, *tags)


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


class WeightAndBias(KeepsTags):
    """Base of the layers whose weight is initialised ``N(0, 1)`` (the scale lives
    in the op, not the weight) and whose optional bias is zero, tagged ``"bias"``."""

    weight: Tensor
    bias: Any  # Tensor | None, which nn.Linear and the convolutions type apart

    def _tag_weight_and_bias(self, weight_mup_type: MupType = "weight") -> None:
        self.weight = Parameter(self.weight.data, mup_type=weight_mup_type)
        if self.bias is not None:
            self.bias = Parameter(self.bias.data, mup_type="bias")

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)


class CallsFunction(nn.Module):
    """Base of the modules whose ``forward`` is one ``U`` function with a
    ``constraint``.

    A subclass names the function (``_function``) and the attributes it passes,
    positionally after the input (``_arguments``) and by keyword (``_keywords``):
    torch's modules store their arguments under the names their functional
    counterparts take. ``_shown`` are the attributes the repr adds to torch's.
    """

    _function: staticmethod[..., Any]
    _arguments: tuple[str, ...]
    _keywords: tuple[str, ...] = ("constraint",)
    _shown: tuple[str, ...] = ("constraint",)

    def __init__(self, constraint: str | None, *torch_args: Any) -> None:
        """Check ``constraint``, then build the torch module from ``torch_args``."""
        validate_constraint(constraint)
        super().__init__(*torch_args)
        self.constraint = constraint

    def _call(self, input: Tensor, *more_arguments: Any) -> Any:
        arguments = [getattr(self, name) for name in self._arguments]
        keywords = {name: getattr(self, name) for name in self._keywords}
        return self._function(input, *arguments, *more_arguments, **keywords)

    def forward(self, input: Tensor) -> Any:
        return self._call(input)

    def extra_repr(self) -> str:
        torch_repr = super().extra_repr()
        ours = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._shown)
        return f"{torch_repr}, {ours}" if torch_repr else ours


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
