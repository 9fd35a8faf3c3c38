"""What ``unit_scale`` does to its copy of the module once, before the first call.

The engine calls :func:`setup` after it has copied and prepared the module and
installed its run state (``_capture.engine``): a checkpoint's record is
restored, the weights of torch's own layers are initialised for unit scale
(unless they are to be kept), every parameter is tagged for u-μP, and the
state-dict hooks that carry the record in a checkpoint are registered. The
record's readers and writers for the public ``checkpoint_record`` and
``load_checkpoint_record`` are here too.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

from torch import nn

from .._capture.engine import RunState, recapture, transform_state
from .._capture.library import Prepared
from .checkpoint import KEY, Record, decode, encode
from .graph_pass import UnitScalingPass
from .params import unit_init_layers
from .tags import tag_structure

__all__ = ["load_record", "setup", "unit_pass_of"]

logger = logging.getLogger("unit_scaling.transforms.unit_scale")

# From here to the user's ``unit_scale(...)`` call: setup, apply_transform,
# unit_scale.
_USER_FRAME = 4


def setup(
    module: nn.Module,
    state: RunState,
    prepared: Prepared,
    *,
    replaced: frozenset[type[nn.Module]],
    record: Record | None,
    where: str,
    init_weights: bool | None,
) -> None:
    """Set up ``module``, the engine's prepared copy with its run ``state``.

    ``replaced`` are the classes of ``unit_scale``'s ``replace=``; ``record``
    the decoded record of the original module's config (found at ``where``), if
    one is to be used; ``init_weights`` is ``unit_scale``'s argument.
    """
    for cls in replaced - prepared.matched:
        warnings.warn(
            f"unit_scale: replace key {cls.__qualname__} matched no submodule",
            UserWarning,
            stacklevel=_USER_FRAME,
        )
    _reject_adapters(module)
    own_pass = state.pass_of(UnitScalingPass)
    params = list(module.named_parameters(remove_duplicate=False))
    own_pass.remember_setup(params)
    if record is not None:
        own_pass.restore(record, where)
    keep = _weights_to_keep(params, init_weights, record, type(module).__name__)
    done = unit_init_layers(module, skip=keep)
    records = tag_structure(module)
    for name, p in params:
        own_pass.report.tags[name] = records[id(p)]
    own_pass.initialised.update(
        name for name, p in params if id(p) in done or id(p) in keep
    )
    module.register_state_dict_post_hook(_save_record)  # type: ignore[no-untyped-call]
    module.register_load_state_dict_pre_hook(_load_record)  # type: ignore[no-untyped-call]


def _reject_adapters(module: nn.Module) -> None:
    """Refuse a module that already holds PEFT adapters: unit_scale would
    initialise their weights as a layer's (LoRA's zero ``lora_B`` made unit
    normal), changing the model. (Keyed on PEFT's package, for this message
    only: the adapters themselves are recognised from the graph.)"""
    found = [
        name or "<root>"
        for name, sub in module.named_modules()
        if type(sub).__module__.partition(".")[0] == "peft"
    ]
    if found:
        raise ValueError(
            f"unit_scale: {type(module).__name__} holds PEFT adapters ("
            f"{', '.join(found[:3])}{', ...' if len(found) > 3 else ''}), whose "
            "weights unit_scale would initialise as a layer's (LoRA's zero lora_B "
            "would become unit normal), changing the model. Attach the adapter "
            "after unit_scale instead: get_peft_model(unit_scale(model), config) "
            "starts from the unit-scaled model's function"
        )


def _weights_to_keep(
    params: list[tuple[str, nn.Parameter]],
    init_weights: bool | None,
    record: Record | None,
    model: str,
) -> set[int]:
    """Ids of the parameters ``unit_scale`` leaves as they are (see its
    ``init_weights``), with the choice logged."""
    if init_weights is True:
        logger.info("unit_scale: initialising every weight (init_weights=True)")
        return set()
    if init_weights is False or record is not None:
        if record is not None:
            logger.warning(
                "unit_scale: %s records that it was trained unit-scaled (its "
                "config's %r): keeping its weights and the recorded scales (pass "
                "init_weights=True to initialise it again)",
                model,
                KEY,
            )
        else:
            logger.info("unit_scale: keeping every weight (init_weights=False)")
        return {id(p) for _, p in params}
    tagged = {id(p) for _, p in params if getattr(p, "mup_type", None) is not None}
    if tagged:
        logger.info(
            "unit_scale: keeping %d parameter(s) that carry u-μP tags (unit-scaled "
            "by construction)",
            len(tagged),
        )
    return tagged


def _save_record(
    module: nn.Module, state_dict: dict[str, Any], prefix: str, metadata: Any
) -> None:
    """State-dict hook: the record of what ``unit_scale`` measured, in the
    state dict's metadata."""
    state = transform_state(module)
    unit_pass = state.pass_of(UnitScalingPass) if state is not None else None
    if unit_pass is not None:
        metadata[KEY] = encode(unit_pass.record())


def _load_record(
    module: nn.Module,
    state_dict: dict[str, Any],
    prefix: str,
    metadata: Any,
    *args: Any,
) -> None:
    """Load-state-dict hook: take the record of the state dict being loaded
    (which says which of its parameters were initialised, and what was
    measured), and capture again at the next call if this model has run
    already. A state dict without one (``torch.distributed.checkpoint`` drops
    the metadata) holds deliberate weights all the same: none of them is
    initialised again."""
    found = metadata.get(KEY) if isinstance(metadata, dict) else None
    if found is not None:
        load_record(module, found, "load_checkpoint_record")
        return
    state = transform_state(module)
    unit_pass = state.pass_of(UnitScalingPass) if state is not None else None
    if unit_pass is not None:
        unit_pass.initialised.update(
            key[len(prefix) :] for key in state_dict if key.startswith(prefix)
        )


def unit_pass_of(module: nn.Module, op: str) -> UnitScalingPass:
    """The ``unit_scale`` pass of ``module``, for the public function ``op``.

    Raises:
        TypeError: if ``module`` is not an ``nn.Module``.
        ValueError: if it was not made by ``unit_scale``.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"{op}: expected an nn.Module, got {type(module).__name__}")
    state = transform_state(module)
    unit_pass = state.pass_of(UnitScalingPass) if state is not None else None
    if unit_pass is None:
        raise ValueError(
            f"{op}: {type(module).__name__} was not made by unit_scale (a native "
            "uu model needs no record: its state dict is all there is)"
        )
    assert isinstance(unit_pass, UnitScalingPass)
    return unit_pass


def load_record(module: nn.Module, record: dict[str, Any], op: str) -> None:
    """Give ``module`` the encoded ``record`` (see ``load_checkpoint_record``),
    capturing again at its next call if it has run already."""
    unit_pass = unit_pass_of(module, op)
    unit_pass.restore(decode(record, op), "the record")
    state = transform_state(module)
    if state is not None and state.calls:
        recapture(module)
