"""Parameters tagged with their u-μP role.

u-μP chooses each parameter's learning rate from its role (``mup_type``), the
depth of the residual stack it lives in (``mup_scaling_depth``) and, for a weight
stored other than ``(out, in)``, the fan-in it is used with (``mup_fan_in``).
:class:`Parameter` is an :class:`torch.nn.Parameter` that carries its tags
(:class:`MupTags`) through ``deepcopy``,
``pickle``, ``torch.save``/``torch.load``, ``load_state_dict``, ``.to()`` and
``torch.compile``; the unit-scaled modules also re-tag the parameters that
``nn.Module._apply`` (``to("meta")``, ``to_empty``, swap-mode conversions) and
``load_state_dict(assign=True)`` replace.
"""

from __future__ import annotations

import copy
from typing import (
    Any,
    Literal,
    NamedTuple,
    Protocol,
    TypeGuard,
    get_args,
    runtime_checkable,
)

import torch
from torch import Tensor, nn

__all__ = [
    "MupTags",
    "MupType",
    "Parameter",
    "ParameterData",
    "has_parameter_data",
    "is_unit_scaled",
    "tags_of",
]

MupType = Literal["weight", "bias", "norm", "output"]
"""The u-μP role of a parameter: hidden ``weight``, ``bias``, ``norm`` gain, or
``output`` (readout) weight."""

_MUP_TYPES: tuple[str, ...] = get_args(MupType)
TAG_NAMES = ("mup_type", "mup_scaling_depth", "mup_fan_in")
"""The attributes a tagged parameter carries (for code that copies them)."""


class MupTags(NamedTuple):
    """The u-μP tags of one parameter.

    ``mup_fan_in`` is the number of inputs each output of the weight sums, where
    that is not what its shape says (see :func:`unit_scaling.optim.fan_in`): a
    weight stored ``(in, out)`` and used as ``x @ W``, such as Hugging Face's
    ``Conv1D``. ``None`` means "read it from the shape".

    Example::

        >>> MupTags("weight", 4)
        MupTags(mup_type='weight', mup_scaling_depth=4, mup_fan_in=None)
    """

    mup_type: MupType
    mup_scaling_depth: int | None = None
    mup_fan_in: int | None = None


@runtime_checkable
class ParameterData(Protocol):
    """Anything carrying the u-μP tags ``mup_type`` and ``mup_scaling_depth`` (a
    :class:`Parameter`, or a tensor whose tags were set by hand; an optional
    ``mup_fan_in`` is read with :func:`tags_of`)."""

    mup_type: MupType
    mup_scaling_depth: int | None


def has_parameter_data(parameter: Any) -> TypeGuard[ParameterData]:
    """True if ``parameter`` carries a valid ``mup_type`` tag.

    Example::

        >>> has_parameter_data(Parameter(torch.zeros(2), "bias"))
        True
        >>> has_parameter_data(torch.nn.Parameter(torch.zeros(2)))
        False
    """
    return getattr(parameter, "mup_type", None) in _MUP_TYPES


def tags_of(parameter: Any) -> MupTags | None:
    """The u-μP tags of ``parameter``, or None if it carries no valid
    ``mup_type`` (a missing ``mup_fan_in``, on a tensor tagged by hand, is None).

    Example::

        >>> tags_of(Parameter(torch.zeros(8, 4), "weight", mup_fan_in=8))
        MupTags(mup_type='weight', mup_scaling_depth=None, mup_fan_in=8)
        >>> tags_of(torch.zeros(2)) is None
        True
    """
    if not has_parameter_data(parameter):
        return None
    return MupTags(
        parameter.mup_type,
        parameter.mup_scaling_depth,
        getattr(parameter, "mup_fan_in", None),
    )


def is_unit_scaled(module: nn.Module) -> bool:
    """Whether ``module`` is a unit-scaled model: every parameter it trains
    carries u-μP tags (``uu`` modules and :func:`~unit_scaling.transforms.unit_scale`
    outputs tag all of theirs); ``False`` when none does. Frozen parameters
    (``requires_grad=False``) are left out.

    What a training loop asks before it accumulates or reduces gradients: a
    unit-scaled model's step follows :mod:`unit_scaling.functional.steps`, a
    plain one's the plain mean.

    Raises:
        ValueError: if some trained parameters carry tags and others do not (a
            plain layer added to a unit-scaled model), naming a few of each.

    Example::

        >>> is_unit_scaled(uu.Linear(4, 4)), is_unit_scaled(torch.nn.Linear(4, 4))
        (True, False)
    """
    tagged: list[str] = []
    plain: list[str] = []
    for name, p in module.named_parameters():
        if p.requires_grad:
            (tagged if has_parameter_data(p) else plain).append(name)
    if tagged and plain:

        def some(names: list[str]) -> str:
            return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")

        raise ValueError(
            f"{type(module).__name__} mixes unit-scaled parameters ({some(tagged)}) "
            f"with plain ones ({some(plain)}), whose gradients follow different "
            "rules. Unit-scale the whole model (unit_scaling.transforms.unit_scale), "
            "or freeze the plain parameters"
        )
    return bool(tagged)


def _positive_or_none(value: Any) -> bool:
    return value is None or (
        isinstance(value, int) and not isinstance(value, bool) and value >= 1
    )


def _check_tags(mup_type: Any, mup_scaling_depth: Any, mup_fan_in: Any = None) -> None:
    if mup_type not in _MUP_TYPES:
        raise ValueError(
            f"mup_type={mup_type!r} is not a u-μP parameter type; expected one of "
            f"{', '.join(repr(t) for t in _MUP_TYPES)}"
        )
    if not _positive_or_none(mup_scaling_depth):
        raise ValueError(
            f"mup_scaling_depth={mup_scaling_depth!r} must be None or a positive int "
            "(the number of residual branches the parameter's stack has)"
        )
    if not _positive_or_none(mup_fan_in):
        raise ValueError(
            f"mup_fan_in={mup_fan_in!r} must be None or a positive int (the number "
            "of inputs each output of the weight sums)"
        )


def _rebuild_parameter(
    data: Tensor,
    requires_grad: bool,
    mup_type: MupType,
    mup_scaling_depth: int | None,
    state: dict[str, Any] | None = None,
    mup_fan_in: int | None = None,  # last: pickles from before it still load
) -> Parameter:
    p = Parameter(
        data,
        mup_type,
        mup_scaling_depth,
        requires_grad=requires_grad,
        mup_fan_in=mup_fan_in,
    )
    for key, value in (state or {}).items():
        setattr(p, key, value)
    return p


class Parameter(nn.Parameter):
    """An :class:`torch.nn.Parameter` tagged with its u-μP role.

    Args:
        data: the initial value.
        mup_type: one of ``"weight"``, ``"bias"``, ``"norm"``, ``"output"``.
        mup_scaling_depth: the number of residual branches of the stack the
            parameter belongs to (set by :class:`unit_scaling.DepthModuleList`).
        requires_grad: as for :class:`torch.nn.Parameter`.
        mup_fan_in: the fan-in the weight is used with, for a weight whose shape
            does not say it (stored ``(in, out)`` and used as ``x @ W``); None
            (the default) reads it from the shape (:func:`unit_scaling.optim.fan_in`).

    Raises:
        TypeError: ``data`` is not a tensor.
        ValueError: a tag outside its range.

    Example::

        >>> w = Parameter(torch.randn(4, 8), mup_type="weight")
        >>> w.mup_type, w.mup_scaling_depth, w.mup_fan_in
        ('weight', None, None)
        >>> Parameter(torch.randn(16, 4), "weight", mup_fan_in=16).mup_fan_in
        16
    """

    mup_type: MupType
    mup_scaling_depth: int | None
    mup_fan_in: int | None = None  # (the class default: parameters pickled before it)

    def __new__(
        cls,
        data: Tensor,
        mup_type: MupType,
        mup_scaling_depth: int | None = None,
        requires_grad: bool = True,
        *,
        mup_fan_in: int | None = None,
    ) -> Parameter:
        if not isinstance(data, Tensor):
            raise TypeError(f"data must be a torch.Tensor, got {type(data).__name__}")
        _check_tags(mup_type, mup_scaling_depth, mup_fan_in)
        p = super().__new__(cls, data, requires_grad)
        p.mup_type = mup_type
        p.mup_scaling_depth = mup_scaling_depth
        p.mup_fan_in = mup_fan_in
        return p

    def __deepcopy__(self, memo: dict[int, Any]) -> Parameter:
        if id(self) in memo:
            return memo[id(self)]  # type: ignore[no-any-return]
        result = Parameter(
            self.data.clone(memory_format=torch.preserve_format),
            self.mup_type,
            self.mup_scaling_depth,
            requires_grad=self.requires_grad,
            mup_fan_in=self.mup_fan_in,
        )
        memo[id(self)] = result
        for key, value in self.__dict__.items():
            if key not in TAG_NAMES:
                setattr(result, key, copy.deepcopy(value, memo))
        return result

    def __reduce_ex__(self, protocol: Any) -> Any:
        # Other attributes travel too, as they do for nn.Parameter (hooks do not).
        state = {k: v for k, v in self.__dict__.items() if k not in TAG_NAMES}
        return (
            _rebuild_parameter,
            (
                self.data,
                self.requires_grad,
                self.mup_type,
                self.mup_scaling_depth,
                state,
                self.mup_fan_in,
            ),
        )

    def module_load(self, other: Tensor, assign: bool = False) -> Parameter:
        """The value ``load_state_dict`` swaps in, tagged like ``self``.

        Torch calls this only in swap mode
        (``torch.__future__.set_swap_module_params_on_conversion(True)``), where it
        would otherwise swap an untagged ``nn.Parameter`` into the module.
        """
        loaded: Tensor = super().module_load(other, assign=assign)  # type: ignore[no-untyped-call]
        return Parameter(
            loaded,
            self.mup_type,
            self.mup_scaling_depth,
            self.requires_grad,
            mup_fan_in=self.mup_fan_in,
        )

    def __repr__(self) -> str:  # type: ignore[override]
        tags = f"mup_type={self.mup_type!r}"
        if self.mup_scaling_depth is not None:
            tags += f", mup_scaling_depth={self.mup_scaling_depth}"
        if self.mup_fan_in is not None:
            tags += f", mup_fan_in={self.mup_fan_in}"
        return f"Parameter({tags}) containing:\n{self.data!r}"


def retag(
    param: Tensor,
    mup_type: MupType,
    mup_scaling_depth: int | None,
    mup_fan_in: int | None = None,
) -> None:
    """Put u-μP tags back on ``param``, in place, after torch replaced a parameter.

    A plain ``nn.Parameter`` becomes a :class:`Parameter` again by changing its
    class in place (as ``torch.utils.swap_tensors`` does), so the object that
    optimizers and FSDP hold stays the same. Any other parameter (a DTensor under
    FSDP2) keeps its class and gets the tags as attributes, which is all
    :func:`has_parameter_data` and the optimizers read.

    Example::

        >>> p = nn.Parameter(torch.zeros(2))
        >>> retag(p, "bias", None)
        >>> type(p).__name__, p.mup_type
        ('Parameter', 'bias')
    """
    _check_tags(mup_type, mup_scaling_depth, mup_fan_in)
    if type(param) is nn.Parameter:
        param.__class__ = Parameter
    param.mup_type = mup_type  # type: ignore[attr-defined]
    param.mup_scaling_depth = mup_scaling_depth  # type: ignore[attr-defined]
    param.mup_fan_in = mup_fan_in  # type: ignore[attr-defined]


# Let `torch.load(..., weights_only=True)` (the default) rebuild tagged parameters.
torch.serialization.add_safe_globals([_rebuild_parameter, Parameter])
