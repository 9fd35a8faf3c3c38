"""What a checkpoint keeps of ``unit_scale``: the record of a unit-scaled model.

A model made by ``unit_scale`` computes a function of its weights *and* of what
``unit_scale`` measured at its first call: the calibrated scales of regions no
rule covers, the parameter-gradient and cut-vertex gradient corrections, and
which parameters it initialised. Weights alone do not bring that function back:
``unit_scale`` of a reloaded model would initialise the trained weights again
and measure new scales (with the trained weights, on other stand-ins).

:func:`encode` turns that state into a **record**, plain JSON data (a dict of
lists, strings and floats) that travels

* in a state dict's metadata (``state_dict._metadata[prefix]["unit_scaling"]``,
  kept by ``torch.save`` / ``torch.load(weights_only=True)`` and read back by
  ``load_state_dict``), and
* in a Hugging Face model's config (``config.unit_scaling``, written to
  ``config.json`` by ``save_pretrained``);

:func:`decode` reads it back. A record says the weights were trained
unit-scaled: ``unit_scale`` keeps them, and takes every measured scale from the
record instead of measuring it again, so the reloaded model computes the same
function and its training continues on the same path.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from torch import nn

__all__ = [
    "FORMAT",
    "KEY",
    "Record",
    "decode",
    "encode",
    "key_to_text",
    "record_in_config",
    "write_to_config",
]

# The key under which the record is stored (metadata, config attribute).
KEY = "unit_scaling"
# Version of the record's layout; a record of another format is refused.
FORMAT = 2  # 2: parameter-gradient scales keyed by input shapes too

# A region's calibration in a form another capture of it can take: the RMS of
# each output, and of each input's gradient by the input's position.
Measured = tuple[list[float | None], dict[int, float]]


@dataclasses.dataclass
class Record:
    """What ``unit_scale`` learned of a model, in memory."""

    residual_scaling: str
    initialised: set[str]
    grad_scales: dict[str, float]
    measured: dict[tuple[Any, ...], Measured]
    cut_scales: dict[str, float]


def key_to_text(key: tuple[Any, ...]) -> str:
    """A capture key (module path, ops, input shapes, occurrence) as text."""
    where, op, shapes, occurrence = key
    plain = [None if s is None else [int(d) for d in s] for s in shapes]
    return json.dumps([where, op, plain, occurrence])


def _key_from_text(text: str) -> tuple[Any, ...]:
    where, op, shapes, occurrence = json.loads(text)
    # A torch.Size hashes and compares as the tuple of its sizes.
    return (
        where,
        op,
        tuple(None if s is None else tuple(s) for s in shapes),
        occurrence,
    )


def encode(record: Record) -> dict[str, Any]:
    """``record`` as plain JSON data."""
    return {
        "format": FORMAT,
        "residual_scaling": record.residual_scaling,
        "initialised": sorted(record.initialised),
        "grad_scales": dict(sorted(record.grad_scales.items())),
        "regions": {
            key_to_text(key): [list(rms), {str(i): g for i, g in grads.items()}]
            for key, (rms, grads) in record.measured.items()
        },
        "cut_scales": dict(sorted(record.cut_scales.items())),
    }


def decode(data: Any, where: str) -> Record:
    """The :class:`Record` of ``data`` (what :func:`encode` wrote). ``where``
    names its source in the error raised for anything else."""
    if not isinstance(data, Mapping):
        raise ValueError(
            f"{where}: expected a unit_scaling record (a dict, as "
            f"checkpoint_record returns), got {type(data).__name__}"
        )
    if data.get("format") != FORMAT:
        raise ValueError(
            f"{where}: not a unit_scaling record of format {FORMAT} (found format "
            f"{data.get('format')!r}); it was written by another version of "
            "unit_scaling"
        )
    try:
        measured: dict[tuple[Any, ...], Measured] = {
            _key_from_text(key): (
                [None if v is None else float(v) for v in rms],
                {int(i): float(g) for i, g in grads.items()},
            )
            for key, (rms, grads) in data["regions"].items()
        }
        return Record(
            residual_scaling=str(data["residual_scaling"]),
            initialised=set(data["initialised"]),
            grad_scales={str(k): float(v) for k, v in data["grad_scales"].items()},
            measured=measured,
            cut_scales={str(k): float(v) for k, v in data["cut_scales"].items()},
        )
    except (AttributeError, KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{where}: a damaged unit_scaling record ({error})") from None


def record_in_config(module: nn.Module) -> Any:
    """The record a Hugging Face model's config carries (``None`` if none)."""
    config = getattr(module, "config", None)
    return getattr(config, KEY, None) if config is not None else None


def write_to_config(module: nn.Module, data: dict[str, Any]) -> None:
    """Store ``data`` in ``module.config`` if it is a Hugging Face config (which
    ``save_pretrained`` writes to ``config.json``)."""
    config = getattr(module, "config", None)
    if config is not None and callable(getattr(config, "to_json_string", None)):
        setattr(config, KEY, data)
