"""``optimizer_report``: the learning rate and decay each parameter really gets.

When a u-μP model does not learn, the cause is often in the optimizer, not the
model: a plain torch optimizer where a u-μP one was meant (every parameter at the
base lr), parameters that lost their tags, or a weight decay far from the one
intended. The report shows, per parameter, the tags u-μP's rules read and what the
optimizer made of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from ..optim import fan_in
from ..parameter import tags_of
from ._optional import require_plot_extra

if TYPE_CHECKING:  # pandas is imported when a table is made
    import pandas as pd  # type: ignore[import-untyped,unused-ignore]

__all__ = ["format_optimizer_report", "optimizer_report"]

_COLUMNS = [
    "name",
    "group",
    "shape",
    "mup_type",
    "fan_in",
    "depth",
    "lr_scale",
    "lr",
    "weight_decay",
    "effective_weight_decay",
    "rule_applied",
]


def _fan_in_or_none(shape: torch.Size) -> int | None:
    try:
        return fan_in(shape)
    except ValueError:  # 0-D or over 5-D: no u-μP rule reads a fan-in there
        return None


def _row(name: str, index: int, param: Tensor, group: dict[str, Any]) -> dict[str, Any]:
    lr = float(group["lr"])  # a tensor lr too
    decay = float(group.get("weight_decay", 0.0))
    tags = tags_of(param)
    given_fan_in = tags.mup_fan_in if tags is not None else None
    return {
        "name": name,
        "group": index,
        "shape": tuple(param.shape),
        "mup_type": tags.mup_type if tags is not None else None,
        "fan_in": given_fan_in or _fan_in_or_none(param.shape),
        "depth": tags.mup_scaling_depth if tags is not None else None,
        "lr_scale": float(group.get("mup_lr_scale", 1.0)),
        "lr": lr,
        "weight_decay": decay,
        "effective_weight_decay": lr * decay,
        "rule_applied": "mup_lr_scale" in group,
    }


def optimizer_report(
    optimizer: torch.optim.Optimizer, model: nn.Module | None = None
) -> pd.DataFrame:
    r"""What ``optimizer`` does to each parameter it holds, one row per parameter.

    For a u-μP optimizer (:class:`unit_scaling.optim.AdamW` and the others built
    with :func:`unit_scaling.optim.scaled_parameters`) the learning rate of
    parameter :math:`p` is :math:`\eta_p = \eta \cdot s_p` with :math:`s_p` its
    rule's factor (e.g. :math:`\text{fan\_in}^{-1/2} L^{-1/2}` for an Adam hidden
    weight at depth :math:`L`), and with independent weight decay its decay is
    :math:`\lambda / \eta_p`, so that each step removes the fraction
    :math:`\eta_p \cdot \lambda / \eta_p = \lambda` of the weight. For any other
    optimizer :math:`s_p = 1`, and the tags still show.

    Columns:
        ``name`` (from ``model.named_parameters()``, else the group's
        ``param_names``, else ``"group<i>.param<j>"``), ``group`` (the param group
        index), ``shape``, ``mup_type`` and ``depth`` (the parameter's u-μP tags,
        ``None`` if it has none), ``fan_in`` (as the rules compute it, see
        :func:`unit_scaling.optim.fan_in`; ``None`` for a rank they do not
        support), ``lr_scale`` (:math:`s_p`), ``lr`` (the group's current
        learning rate, schedules included), ``weight_decay`` (the group's, as
        torch applies it), ``effective_weight_decay`` (``lr * weight_decay``: the
        fraction of the weight a decoupled decay such as AdamW's removes per step)
        and ``rule_applied`` (whether a u-μP rule set this lr).

    Args:
        optimizer: any torch optimizer.
        model: the model the parameters belong to, for their names.

    Raises:
        TypeError: ``optimizer`` is not a :class:`torch.optim.Optimizer`, or
            ``model`` is not an :class:`torch.nn.Module`.

    Example::

        >>> model = uu.TransformerDecoder(64, 256, layers=2, heads=4)
        >>> opt = uu.optim.AdamW(model.parameters(), lr=0.5, weight_decay=0.1)
        >>> report = optimizer_report(opt, model)
        >>> report.loc[[0, 1, 11], ["name", "fan_in", "depth", "lr_scale", "lr"]]
                                   name  fan_in  depth  lr_scale        lr
        0                  embedding.weight      64   <NA>  0.125000  0.062500
        1   layers.0.mhsa.linear_qkv.weight      64      2  0.088388  0.044194
        11                projection.weight      64   <NA>  1.000000  0.500000
        >>> report.effective_weight_decay.round(6).unique().tolist()  # λ for all
        [0.1]
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            "optimizer_report: optimizer must be a torch.optim.Optimizer, got "
            f"{type(optimizer).__name__}; pass the optimizer itself, e.g. "
            "optimizer_report(uu.optim.AdamW(model.parameters(), lr=1e-2), model)"
        )
    if model is not None and not isinstance(model, nn.Module):
        raise TypeError(
            "optimizer_report: model must be an nn.Module (it names the "
            f"parameters) or None, got {type(model).__name__}"
        )
    require_plot_extra()
    import pandas as pd

    names = {} if model is None else {id(p): n for n, p in model.named_parameters()}
    rows = []
    for i, group in enumerate(optimizer.param_groups):
        group_names = group.get("param_names")
        for j, param in enumerate(group["params"]):
            name = names.get(id(param)) or (
                group_names[j] if group_names is not None else f"group{i}.param{j}"
            )
            rows.append(_row(name, i, param, group))
    # Nullable integers: a missing depth or fan-in shows as <NA>, not as NaN
    # turning the column into floats.
    return pd.DataFrame(rows, columns=_COLUMNS).astype(
        {"fan_in": "Int64", "depth": "Int64"}
    )


def format_optimizer_report(report: pd.DataFrame) -> str:
    """An :func:`optimizer_report` as a plain-text table, numbers to 4 digits.

    Args:
        report: the table :func:`optimizer_report` returned (or a selection of its
            rows and columns).

    Example::

        >>> model = uu.TransformerDecoder(64, 256, layers=1, heads=4)
        >>> opt = torch.optim.AdamW(model.parameters(), lr=0.5, weight_decay=0.1)
        >>> report = optimizer_report(opt, model)  # a plain optimizer: no u-μP rule
        >>> columns = ["name", "depth", "lr_scale", "lr", "rule_applied"]
        >>> print(format_optimizer_report(report.head(2)[columns]))
                                   name  depth  lr_scale  lr  rule_applied
                       embedding.weight   <NA>         1 0.5         False
        layers.0.mhsa.linear_qkv.weight      1         1 0.5         False
    """
    text: str = report.to_string(index=False, float_format=lambda v: f"{v:.4g}")
    return text
