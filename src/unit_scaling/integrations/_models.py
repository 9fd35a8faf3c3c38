"""What the integrations ask of a model they are given."""

from __future__ import annotations

from torch import nn

from ..transforms import unit_scale_report


def base_model(model: nn.Module) -> nn.Module:
    """The model under a PEFT wrapper, if any (``PeftModel.get_base_model``)."""
    base = getattr(model, "get_base_model", None)
    inner = base() if callable(base) else model
    return inner if isinstance(inner, nn.Module) else model


def made_by_unit_scale(model: nn.Module) -> bool:
    """Whether ``model`` (or the model under its PEFT wrapper) is a
    :func:`~unit_scaling.transforms.unit_scale` output."""
    try:
        unit_scale_report(base_model(model))
    except TypeError:  # (not a unit_scale output)
        return False
    return True
