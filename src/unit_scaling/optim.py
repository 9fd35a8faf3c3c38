"""u-μP optimizers: one learning rate per parameter, chosen from its u-μP tags.

u-μP makes the best learning rate independent of width and depth by scaling each
parameter's lr by a rule of its role (``mup_type``), fan-in (from its shape, or
its ``mup_fan_in`` tag) and residual depth (``mup_scaling_depth``).
:func:`scaled_parameters` turns parameters into one param group per parameter
carrying that lr; :class:`Adam`, :class:`AdamW` and :class:`SGD`
are the torch optimizers built from those groups, with a ``step`` that updates
the groups together: torch's foreach and fused implementations launch their
kernels once per distinct setting rather than once per parameter, and Adam's
foreach path once for all learning rates, with the same arithmetic as torch's
group-by-group step (bit for bit).

The tags normally ride on :class:`unit_scaling.Parameter`. Transformations that
replace parameters by plain ``nn.Parameter`` (``module.to("meta")``, ``to_empty``,
``load_state_dict(assign=True)``, FSDP2's ``fully_shard``) drop them; for those,
capture the tags by name beforehand with :func:`mup_tags` and pass
``module.named_parameters()`` together with ``tags=``.

Where to start: :data:`unit_scaling.RECOMMENDED` holds the recommended learning
rate (``RECOMMENDED.lr`` for a :class:`~unit_scaling.TransformerDecoder` built
with ``**RECOMMENDED.multipliers``; ``RECOMMENDED.unit_scale_lr`` for a model made
u-μP by :func:`~unit_scaling.transforms.unit_scale`). The optimizers' own
default ``lr`` stays torch's.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim.optimizer import ParamsT

from ._optim_step import BatchedAdam, BatchedStep
from .parameter import (
    MupTags,
    Parameter,
    ParameterData,
    has_parameter_data,
    tags_of,
)

__all__ = [
    "SGD",
    "Adam",
    "AdamW",
    "LRScaleFunc",
    "MupTags",
    "fan_in",
    "lr_scale_for_depth",
    "lr_scale_func_adam",
    "lr_scale_func_sgd",
    "mup_tags",
    "scaled_parameters",
]

LRScaleFunc = Callable[[Tensor], float]
"""A u-μP rule: the factor a tagged parameter's learning rate is multiplied by."""

_TagMapping = Mapping[str, tuple[Any, ...]]
"""``name -> MupTags`` (or a plain ``(mup_type, depth[, fan_in])`` tuple)."""


def mup_tags(module: nn.Module) -> dict[str, MupTags]:
    """The u-μP tags of ``module``'s parameters, by ``named_parameters()`` name.

    Capture them before a transformation that replaces parameters (``to("meta")``,
    ``to_empty``, FSDP2's ``fully_shard``), then give them to
    :func:`scaled_parameters` or an optimizer as ``tags=``. Untagged parameters
    are left out.

    Example::

        >>> model = uu.TransformerDecoder(64, 256, layers=2, heads=4,
        ...                               **uu.RECOMMENDED.multipliers)
        >>> tags = mup_tags(model)
        >>> tags["embedding.weight"]
        MupTags(mup_type='weight', mup_scaling_depth=None, mup_fan_in=None)
        >>> # ... fully_shard(model) or model.to_empty(...) replaces the parameters
        >>> opt = AdamW(model.named_parameters(), lr=uu.RECOMMENDED.lr, tags=tags)
    """
    return {
        name: tags
        for name, p in module.named_parameters()
        if (tags := tags_of(p)) is not None
    }


def _require_tags(param: Tensor) -> ParameterData:
    if not has_parameter_data(param):
        raise ValueError(
            f"a u-μP learning-rate rule needs a tagged parameter, got an untagged "
            f"tensor of shape {tuple(param.shape)}; create it as "
            "unit_scaling.Parameter(data, mup_type)"
        )
    return param


def fan_in(shape: torch.Size | tuple[int, ...]) -> int:
    """The fan-in u-μP's learning-rate rules read from a parameter's ``shape``.

    ``shape[0]`` for a 1-D parameter (a bias or norm weight), ``shape[1]`` for a
    2-D ``(out, in)`` weight and ``prod(shape[1:])`` for a 3-D to 5-D convolution
    weight ``(out, in, *kernel)``; any other rank raises ``ValueError``. A
    parameter whose ``mup_fan_in`` tag is set (a weight stored ``(in, out)``, such
    as Hugging Face's ``Conv1D``, which :func:`~unit_scaling.transforms.unit_scale`
    tags) uses the tag instead.

    Example::

        >>> fan_in(torch.Size([32, 16, 3, 3]))
        144
    """
    if len(shape) == 1:
        return shape[0]
    if 2 <= len(shape) <= 5:  # (out, in) and conv weights (out, in, *kernel)
        return math.prod(shape[1:])
    raise ValueError(
        f"cannot infer the fan-in of a parameter of shape {tuple(shape)}: u-μP "
        "rules support 1-D, 2-D (out, in) and 3-D to 5-D (out, in, *kernel) "
        "parameters"
    )


def _fan_in_of(param: Tensor) -> int:
    """The tag ``mup_fan_in`` where set, else :func:`fan_in` of the shape."""
    tagged = getattr(param, "mup_fan_in", None)
    return tagged if tagged is not None else fan_in(param.shape)


def _width(shape: torch.Size) -> int:
    if len(shape) == 0:
        raise ValueError(
            "cannot infer the width of a 0-D parameter (shape ()): u-μP bias and "
            "norm rules use shape[0]"
        )
    return shape[0]


def lr_scale_for_depth(param: Tensor) -> float:
    """The depth factor of every u-μP rule: ``L^{-1/2}`` for ``L = mup_scaling_depth``.

    ``1`` when the parameter has no depth (it is not inside a residual stack).

    Args:
        param: a tagged parameter.

    Example::

        >>> lr_scale_for_depth(Parameter(torch.zeros(4, 4), "weight", 4))
        0.5
    """
    depth = _require_tags(param).mup_scaling_depth
    return 1.0 if depth is None else 1 / math.sqrt(depth)


def lr_scale_func_adam(param: Tensor) -> float:
    r"""The u-μP Adam/AdamW learning-rate factor of ``param``.

    .. math::
        \eta_{\text{weight}} = \text{fan\_in}^{-1/2} L^{-1/2}, \quad
        \eta_{\text{bias}} = \eta_{\text{norm}} = \eta_{\text{output}} = L^{-1/2}

    with ``fan_in`` = the ``mup_fan_in`` tag if set, else ``shape[0]`` (1-D),
    ``shape[1]`` (2-D) or ``prod(shape[1:])`` (3-D to 5-D convolution weights),
    and ``L`` = ``mup_scaling_depth`` (1 if unset).

    Args:
        param: a tagged parameter.

    Example::

        >>> lr_scale_func_adam(Parameter(torch.zeros(8, 16), "weight"))
        0.25
        >>> lr_scale_func_adam(Parameter(torch.zeros(16, 8), "weight", mup_fan_in=16))
        0.25
    """
    tags = _require_tags(param)
    scale = 1 / math.sqrt(_fan_in_of(param)) if tags.mup_type == "weight" else 1.0
    return scale * lr_scale_for_depth(param)


def _lr_scale_func_sgd_to_output_scale(param: Tensor) -> float:
    mup_type = _require_tags(param).mup_type
    if mup_type == "weight":
        scale = math.sqrt(_fan_in_of(param))
    elif mup_type == "output":
        scale = 1.0
    else:
        scale = float(_width(param.shape))
    return scale * lr_scale_for_depth(param)


def lr_scale_func_sgd(readout_constraint: str | None) -> LRScaleFunc:
    r"""The u-μP SGD learning-rate rule, for a readout with ``readout_constraint``.

    With ``readout_constraint=None`` the rule is :func:`lr_scale_func_adam`'s. With
    ``"to_output_scale"`` (the readout's gradient scaled like its output):

    .. math::
        \eta_{\text{weight}} = \text{fan\_in}^{1/2} L^{-1/2}, \quad
        \eta_{\text{bias}} = \eta_{\text{norm}} = \text{shape}[0]\, L^{-1/2},
        \quad \eta_{\text{output}} = L^{-1/2}

    Args:
        readout_constraint: ``None`` or ``"to_output_scale"``.

    Example::

        >>> rule = lr_scale_func_sgd("to_output_scale")
        >>> rule(Parameter(torch.zeros(8, 16), "weight"))
        4.0
    """
    if readout_constraint is None:
        return lr_scale_func_adam
    if readout_constraint == "to_output_scale":
        return _lr_scale_func_sgd_to_output_scale
    raise ValueError(
        f"readout_constraint={readout_constraint!r} has no u-μP SGD rule; "
        "use None or 'to_output_scale'"
    )


def _group_members(group: dict[str, Any]) -> list[tuple[str | None, Tensor]]:
    """``(name or None, tensor)`` for each parameter of a param group."""
    params = group["params"]
    if isinstance(params, Tensor):
        params = [params]
    elif isinstance(params, set):
        raise TypeError(
            "param group 'params' must be an ordered collection (a list), not a "
            "set: the order of a set changes between runs"
        )
    members = [p if isinstance(p, tuple) else (None, p) for p in params]
    names = group.get("param_names")
    if names is not None:
        members = [(name, p) for name, (_, p) in zip(names, members, strict=True)]
    return members


def _tagged(param: Tensor, name: str | None, tags: _TagMapping | None) -> Tensor | None:
    """``param`` as something carrying its u-μP tags, or None if it has none.

    A ``tags`` entry wins over the parameter's own tags: it is the explicit one.
    The stand-in lives on the meta device, so it costs no memory, and keeps
    ``param``'s global shape (that of a DTensor too), which is all a rule reads.
    """
    if tags is not None and name is not None and name in tags:
        entry = tags[name]
        if not isinstance(entry, tuple) or not 1 <= len(entry) <= 3:
            raise ValueError(
                f"tags[{name!r}] must be a MupTags or a (mup_type, "
                f"mup_scaling_depth[, mup_fan_in]) tuple, got {entry!r}"
            )
        given = MupTags(*entry)
        stand_in = torch.empty(param.shape, device="meta")
        return Parameter(
            stand_in,
            given.mup_type,
            given.mup_scaling_depth,
            requires_grad=False,
            mup_fan_in=given.mup_fan_in,
        )
    tagged: Tensor = param  # keeps the Tensor type that has_parameter_data narrows
    return tagged if has_parameter_data(param) else None


def _independent_decay(
    weight_decay: float | Tensor, lr: float | Tensor
) -> float | Tensor:
    """``weight_decay / lr``: the decay whose per-step effect ``lr · wd`` ignores lr."""
    if not isinstance(weight_decay, Tensor) and weight_decay == 0:
        return weight_decay
    if isinstance(lr, Tensor) and not isinstance(weight_decay, Tensor):
        # torch's optimizers test `weight_decay != 0` on every step (and fused
        # kernels take a float), so reading the lr once here beats a tensor decay
        # that would sync the host on each step.
        lr = float(lr)
    if not isinstance(lr, Tensor) and lr == 0:
        raise ValueError(
            "independent weight decay divides weight_decay by the learning rate, "
            "which is 0 here; use a positive lr or independent_weight_decay=False"
        )
    return weight_decay / lr


def _describe(name: str | None, group: int, index: int, param: Tensor) -> str:
    where = repr(name) if name is not None else f"{index} of param group {group}"
    return f"parameter {where} (shape {tuple(param.shape)})"


# The param-group keys scaled_parameters writes itself (a group passed in again
# gets fresh values, not stale ones).
_GROUP_KEYS_SET_HERE = ("params", "param_names", "lr", "weight_decay", "mup_lr_scale")


def scaled_parameters(
    params: ParamsT,
    lr_scale_func: LRScaleFunc,
    lr: float | Tensor | None = None,
    weight_decay: float | Tensor = 0,
    independent_weight_decay: bool = True,
    allow_non_unit_scaling_params: bool = False,
    *,
    tags: _TagMapping | None = None,
) -> list[dict[str, Any]]:
    r"""Param groups, one per parameter, each with the parameter's u-μP learning rate.

    .. math::
        \eta_p = \eta \cdot \text{lr\_scale\_func}(p), \qquad
        \lambda_p = \lambda / \eta_p \ \text{(independent weight decay)}

    so the per-step decay :math:`\eta_p \lambda_p = \lambda` does not depend on the
    learning rate (an lr schedule still scales it). ``params`` is anything a torch
    optimizer takes: tensors, ``(name, tensor)`` pairs (``module.named_parameters()``)
    or param-group dicts. A group's own ``lr``/``weight_decay`` override the
    arguments and its other settings are kept. A tensor ``lr`` stays a tensor (each
    group gets its own product); with a nonzero float ``weight_decay`` it is read
    once here to compute the decay. A tagged parameter's group records its factor
    ``lr_scale_func(p)`` under ``"mup_lr_scale"``, for
    :func:`unit_scaling.analysis.optimizer_report`; an untagged one's has no such
    key.

    Args:
        params: parameters, named parameters or param groups to scale.
        lr_scale_func: the rule, e.g. :func:`lr_scale_func_adam`.
        lr: the base learning rate, for groups without their own ``lr``.
        weight_decay: the base weight decay, for groups without their own.
        independent_weight_decay: divide each decay by its parameter's lr.
        allow_non_unit_scaling_params: give untagged parameters the base lr (with a
            warning) instead of raising ``ValueError``.
        tags: ``name -> MupTags`` (or a tuple ``(mup_type, mup_scaling_depth[,
            mup_fan_in])``) for named parameters that lost their tags (see
            :func:`mup_tags`); an entry wins over a parameter's own tags.

    Example::

        >>> model = uu.TransformerDecoder(64, 256, layers=2, heads=4,
        ...                               **uu.RECOMMENDED.multipliers)
        >>> lr = uu.RECOMMENDED.lr
        >>> groups = scaled_parameters(model.parameters(), lr_scale_func_adam, lr=lr)
        >>> groups[0]["lr"] == lr / 64**0.5  # the embedding: lr / sqrt(fan_in)
        True
        >>> opt = torch.optim.AdamW(groups)
    """
    if isinstance(params, Tensor):
        raise TypeError(
            "params must be an iterable of tensors, (name, tensor) pairs or param "
            f"groups, got a single tensor of shape {tuple(params.shape)}; wrap it "
            "in a list"
        )
    groups: list[Any] = list(params)
    if groups and not isinstance(groups[0], dict):
        groups = [{"params": groups}]
    scaled: list[dict[str, Any]] = []
    untagged: list[str] = []
    for g, group in enumerate(groups):
        base_lr = group.get("lr", lr)
        if base_lr is None:
            raise ValueError(
                f"param group {g} has no learning rate: pass lr= or give the group "
                "an 'lr'"
            )
        base_decay = group.get("weight_decay", weight_decay)
        settings = {
            key: value
            for key, value in group.items()
            if key not in _GROUP_KEYS_SET_HERE
        }
        for i, (name, param) in enumerate(_group_members(group)):
            if tags is not None and name is None:
                raise ValueError(
                    "tags= maps parameter names to tags, but "
                    f"{_describe(name, g, i, param)} has no name; pass "
                    "module.named_parameters()"
                )
            tagged = _tagged(param, name, tags)
            recorded: dict[str, float] = {}
            if tagged is not None:
                recorded["mup_lr_scale"] = lr_scale_func(tagged)
                param_lr = base_lr * recorded["mup_lr_scale"]
            elif allow_non_unit_scaling_params:
                untagged.append(_describe(name, g, i, param))
                # A product even here, so that no two groups share one lr tensor
                # (schedulers update tensor lrs in place, group by group).
                param_lr = base_lr * 1.0
            else:
                raise ValueError(
                    f"{_describe(name, g, i, param)} has no u-μP tags, so its "
                    "learning rate cannot be scaled. Create it as "
                    "unit_scaling.Parameter, shard with unit_scaling.parallel."
                    "fully_shard (torch's fully_shard drops tags), pass tags= "
                    "captured with mup_tags() before the parameters were replaced, "
                    "call unit_scaling.transforms.tag_added_parameters(model) for "
                    "one that joined a unit_scale output later (an adapter's), "
                    "or set allow_non_unit_scaling_params=True to give it the base lr"
                )
            decay = (
                _independent_decay(base_decay, param_lr)
                if independent_weight_decay
                else base_decay
            )
            member = param if name is None else (name, param)
            scaled.append(
                {
                    **settings,
                    "params": [member],
                    "lr": param_lr,
                    "weight_decay": decay,
                    **recorded,
                }
            )
    if untagged:
        warnings.warn(
            f"{len(untagged)} parameters have no u-μP tags and keep the base "
            f"learning rate: {', '.join(untagged)}",
            stacklevel=2,
        )
    return scaled


class SGD(BatchedStep, torch.optim.SGD):
    """:class:`torch.optim.SGD` with u-μP learning rates (:func:`lr_scale_func_sgd`).

    Arguments are torch's plus the keyword-only ones of :func:`scaled_parameters`
    and ``readout_constraint`` (the constraint of the model's readout layer).
    ``weight_decay`` is independent of the lr by default (see
    :func:`scaled_parameters`). Groups added later with ``add_param_group`` are
    not rescaled: build them with :func:`scaled_parameters`.

    Example::

        >>> model = uu.TransformerDecoder(64, 256, layers=2, heads=4,
        ...                               **uu.RECOMMENDED.multipliers)
        >>> # not the recommended lr: RECOMMENDED's were found for Adam, not SGD
        >>> opt = SGD(model.parameters(), lr=2**-2, momentum=0.9)
        >>> len(opt.param_groups)  # one group per parameter, with its u-μP lr
        12
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float | Tensor = 1e-3,
        momentum: float = 0,
        dampening: float = 0,
        weight_decay: float | Tensor = 0,
        nesterov: bool = False,
        *,
        readout_constraint: str | None = None,
        independent_weight_decay: bool = True,
        allow_non_unit_scaling_params: bool = False,
        tags: _TagMapping | None = None,
        **options: Any,  # torch's keyword-only flags (foreach, fused, ...)
    ) -> None:
        rule = lr_scale_func_sgd(readout_constraint)
        groups = scaled_parameters(
            params,
            rule,
            lr,
            weight_decay,
            independent_weight_decay,
            allow_non_unit_scaling_params,
            tags=tags,
        )
        super().__init__(
            groups, lr, momentum, dampening, weight_decay, nesterov, **options
        )


class _ScaledAdam:
    """The constructor :class:`Adam` and :class:`AdamW` share: u-μP parameter
    groups, then torch's class (the next in the method resolution order)."""

    def __init__(
        self,
        params: ParamsT,
        lr: float | Tensor = 1e-3,
        betas: tuple[float | Tensor, float | Tensor] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0,
        amsgrad: bool = False,
        *,
        independent_weight_decay: bool = True,
        allow_non_unit_scaling_params: bool = False,
        tags: _TagMapping | None = None,
        **options: Any,  # torch's keyword-only flags (foreach, fused, ...)
    ) -> None:
        groups = scaled_parameters(
            params,
            lr_scale_func_adam,
            lr,
            weight_decay,
            independent_weight_decay,
            allow_non_unit_scaling_params,
            tags=tags,
        )
        super().__init__(  # type: ignore[call-arg]
            groups, lr, betas, eps, weight_decay, amsgrad, **options
        )


class Adam(_ScaledAdam, BatchedAdam, torch.optim.Adam):
    """:class:`torch.optim.Adam` with u-μP learning rates (:func:`lr_scale_func_adam`).

    Arguments are torch's plus the keyword-only ones of :func:`scaled_parameters`.
    ``weight_decay`` is independent of the lr by default (see
    :func:`scaled_parameters`). Groups added later with ``add_param_group`` are
    not rescaled: build them with :func:`scaled_parameters`. On the foreach path
    (``foreach=True``, or the default on a GPU) ``step`` updates all groups that
    differ only in lr in one pass of foreach kernels; otherwise it runs torch's
    over the groups merged where all their settings are equal.

    Example::

        >>> model = uu.TransformerDecoder(64, 256, layers=2, heads=4,
        ...                               **uu.RECOMMENDED.multipliers)
        >>> opt = Adam(model.parameters(), lr=uu.RECOMMENDED.lr)
        >>> len(opt.param_groups)  # one group per parameter, with its u-μP lr
        12
    """


class AdamW(_ScaledAdam, BatchedAdam, torch.optim.AdamW):
    """:class:`torch.optim.AdamW` with u-μP learning rates (:func:`lr_scale_func_adam`).

    Arguments are torch's plus the keyword-only ones of :func:`scaled_parameters`.
    ``weight_decay`` is independent of the lr by default, so it is the fraction of
    each weight removed per step (times any lr schedule); it defaults to ``0``
    because torch's ``0.01`` would mean 1% per step. Groups added later with
    ``add_param_group`` are not rescaled: build them with :func:`scaled_parameters`.
    ``step`` batches the groups as :class:`Adam`'s does.

    Example::

        >>> model = uu.TransformerDecoder(64, 256, layers=2, heads=4,
        ...                               **uu.RECOMMENDED.multipliers)
        >>> opt = AdamW(model.parameters(), lr=uu.RECOMMENDED.lr, weight_decay=1e-4)
        >>> len(opt.param_groups)  # one group per parameter, with its u-μP lr
        12
    """
