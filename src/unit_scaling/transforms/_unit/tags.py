"""u-μP tags for every parameter of a unit-scaled model.

:mod:`unit_scaling.optim` gives each parameter its learning rate from its tags,
``mup_type``, ``mup_scaling_depth`` and, where the shape does not say it,
``mup_fan_in`` (see :mod:`unit_scaling.parameter`).
``unit_scale`` puts them on every parameter of the module it returns, so that
``uu.optim.AdamW(unit_scale(model).parameters(), lr=...)`` works as it does for a
native ``uu`` model:

* **from the layer** (when ``unit_scale`` is called): the weight of a linear,
  convolution, embedding or attention layer is a ``"weight"``, its bias a
  ``"bias"``; a normalisation's weight a ``"norm"``, its bias a ``"bias"``.
* **the readout**: the weight of the last linear layer registered after the
  model's repeated blocks (``lm_head``, a classifier) is ``"output"``, also when
  it is tied to an embedding table (GPT-2), reported. The table then learns at
  the output rule's ``lr`` instead of the weight rule's ``lr/√width`` in both of
  its uses: μP's rule for a readout and for an input weight under Adam alike
  (u-μP's ``lr/√width`` for an embedding is its own choice). With the weight rule
  a tied readout's updates shrank like ``width^-½``, and a ``unit_scale``d GPT-2
  got no better with width (docs/results/umup_width.md).
* **a weight stored** ``(in, out)``: Hugging Face's ``Conv1D`` (GPT-2), used as
  ``x @ W``, is a ``"weight"`` whose fan-in is ``shape[0]``, which its
  ``mup_fan_in`` tag says (read from its shape, the lr rules would take its
  output size: ``c_fc``'s lr would be 2× too small in a GPT-2).
* **from the graph** (at the first call), for a parameter no layer owns: used as
  the weight of a product or as a table, ``"weight"``, with the fan-in of that
  product where the shape would say otherwise; as a bias, ``"bias"``;
  multiplying activations (a layer scale) or normalising, ``"norm"``.
* **generic**, for a parameter neither shows (``A_log`` of a state-space model,
  used through ``exp``): a matrix is a ``"weight"``, a vector a ``"bias"``. Such
  parameters are listed in the report.

**Depth.** Parameters inside the model's repeated blocks — the outermost
``nn.ModuleList`` or ``nn.Sequential`` of at least two children of one class —
get ``mup_scaling_depth`` = the number of blocks, as
:class:`unit_scaling.DepthModuleList` does; the rest (embeddings, final norm,
readout) none.

A parameter that already carries tags (a native ``uu`` module) keeps them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Literal

from torch import Tensor, nn

from ..._torch_internals import BatchNormBase, ConvNdBase, InstanceNormBase
from ...optim import fan_in
from ...parameter import MupType, retag, tags_of

__all__ = ["TagRecord", "depths", "tag_added", "tag_from_graph", "tag_structure"]

Source = Literal["model", "layer", "readout", "graph", "generic"]

_WEIGHTED_LAYERS = (
    nn.Linear,
    nn.Bilinear,
    nn.Embedding,
    nn.EmbeddingBag,
    nn.MultiheadAttention,
    ConvNdBase,
)
_NORM_LAYERS = (
    nn.LayerNorm,
    nn.GroupNorm,
    nn.RMSNorm,
    BatchNormBase,
    InstanceNormBase,
)
_TIED = "readout tied to an embedding table: both learn by the output rule"
# A parameter's role in the graph (see transforms._unit.params) -> its u-μP type.
_ROLE_TYPES: dict[str, MupType] = {
    "weight": "weight",
    "table": "weight",
    "bias": "bias",
    "norm bias": "bias",
    "norm": "norm",
    "gain": "norm",
}


@dataclasses.dataclass(frozen=True)
class TagRecord:
    """The u-μP tags ``unit_scale`` gave a parameter, and from what: ``"model"``
    (it had them), ``"layer"``, ``"readout"``, ``"graph"`` or ``"generic"``
    (see :mod:`unit_scaling.transforms._unit.tags`)."""

    name: str
    mup_type: MupType
    mup_scaling_depth: int | None
    source: Source
    detail: str = ""
    mup_fan_in: int | None = None


def _repeated(module: nn.Module) -> bool:
    children = list(module.children())
    return (
        isinstance(module, (nn.ModuleList, nn.Sequential))
        and len(children) >= 2
        and len({type(c) for c in children}) == 1
        and any(True for _ in module.parameters())
    )


def _nested_blocks(module: nn.Module, prefix: str = "") -> Iterator[tuple[str, int]]:
    for name, child in module.named_children():
        path = f"{prefix}{name}"
        if _repeated(child):
            yield path, len(list(child.children()))
        else:
            yield from _nested_blocks(child, f"{path}.")


def _blocks(module: nn.Module) -> list[tuple[str, int]]:
    """``(path, count)`` of each outermost list of repeated blocks (the path
    ``""`` when ``module`` itself is one, an ``nn.Sequential`` of layers)."""
    if _repeated(module):
        return [("", len(list(module.children())))]
    return list(_nested_blocks(module))


def depths(module: nn.Module, blocks: list[tuple[str, int]]) -> dict[str, int]:
    """``mup_scaling_depth`` of each parameter name inside repeated blocks."""
    found: dict[str, int] = {}
    for path, count in blocks:
        block = module.get_submodule(path)
        for name, _ in block.named_parameters(remove_duplicate=False):
            found[f"{path}.{name}" if path else name] = count
    return found


def _stored_in_out(owner: nn.Module, param: Tensor) -> bool:
    """Whether ``param`` is the ``(in, out)`` weight of a Hugging Face ``Conv1D``
    (recognised by its class name and sizes, without importing transformers)."""
    sizes = (getattr(owner, "nx", None), getattr(owner, "nf", None))
    return (
        type(owner).__name__ == "Conv1D"
        and param is getattr(owner, "weight", None)
        and tuple(param.shape) == sizes
    )


def _shape_fan_in(param: Tensor) -> int | None:
    try:
        return fan_in(param.shape)
    except ValueError:  # a rank no rule reads a fan-in of
        return None


def _generic(param: Tensor) -> MupType:
    return "weight" if param.dim() >= 2 else "bias"


def _readout(module: nn.Module, blocks: list[str]) -> str | None:
    """The module path of the readout: the last linear layer registered after
    the last list of repeated ``blocks`` (or anywhere, if there is none)."""
    after = not blocks
    readout = None
    for path, sub in module.named_modules():
        if blocks and path == blocks[-1]:
            after = True
        inside = any(path == b or path.startswith(f"{b}.") or not b for b in blocks)
        if after and not inside and isinstance(sub, nn.Linear):
            readout = path
    return readout


def _structure(module: nn.Module) -> tuple[dict[str, int], str | None, set[int]]:
    """What tagging reads of ``module``'s structure: the depth of each
    parameter name inside repeated blocks, the readout's path, and the ids of
    embedding tables."""
    blocks = _blocks(module)
    readout = _readout(module, [path for path, _ in blocks])
    embeddings = {
        id(sub.weight)
        for sub in module.modules()
        if isinstance(sub, (nn.Embedding, nn.EmbeddingBag))
    }
    return depths(module, blocks), readout, embeddings


def tag_structure(module: nn.Module) -> dict[int, TagRecord]:
    """Tag every parameter of ``module`` in place from the layer that owns it
    (or generically); returns the record of each, by ``id`` of the parameter."""
    depth, readout, embeddings = _structure(module)
    records: dict[int, TagRecord] = {}
    for path, sub in module.named_modules():
        for attr, param in sub.named_parameters(prefix="", recurse=False):
            name = f"{path}.{attr}" if path else attr
            if id(param) in records:  # tied: the first owner decides the type,
                if path == readout and attr == "weight":  # unless it is a readout
                    retag(param, "output", None)
                    records[id(param)] = dataclasses.replace(
                        records[id(param)],
                        mup_type="output",
                        mup_scaling_depth=None,
                        source="readout",
                        detail=_TIED,
                    )
                continue
            records[id(param)] = _tag_one(
                param, name, sub, attr, depth.get(name), path == readout, embeddings
            )
    return records


def tag_added(
    module: nn.Module, params: list[tuple[str, Tensor]]
) -> dict[str, TagRecord]:
    """Tag ``params``, which joined ``module`` after ``unit_scale`` tagged it
    (an adapter's weights), in place as :func:`tag_structure` would have had
    they been there (a parameter that carries tags keeps them); a generic one
    is retagged from its use in the graph. Returns the record of each, by
    name."""
    depth, readout, embeddings = _structure(module)
    records = {}
    for name, param in params:
        path, _, attr = name.rpartition(".")
        owner = module.get_submodule(path)
        is_readout = path == readout and attr == "weight"
        records[name] = _tag_one(
            param, name, owner, attr, depth.get(name), is_readout, embeddings
        )
    return records


def _tag_one(
    param: Tensor,
    name: str,
    owner: nn.Module,
    attr: str,
    depth: int | None,
    is_readout: bool,
    embeddings: set[int],
) -> TagRecord:
    own = tags_of(param)
    if own is not None:
        return TagRecord(
            name, own.mup_type, own.mup_scaling_depth, "model", "", own.mup_fan_in
        )
    mup_type: MupType
    source: Source = "layer"
    detail = ""
    fan: int | None = None
    if is_readout and attr == "weight":
        mup_type, source, depth = "output", "readout", None
        if id(param) in embeddings:
            detail = _TIED
    elif isinstance(owner, _WEIGHTED_LAYERS):
        mup_type = "bias" if "bias" in attr else "weight"
    elif isinstance(owner, _NORM_LAYERS):
        mup_type = "bias" if attr == "bias" else "norm"
    elif _stored_in_out(owner, param):
        mup_type, fan = "weight", param.shape[0]
        detail = "stored (in, out), used as x @ W: fan-in shape[0]"
    else:
        mup_type, source = _generic(param), "generic"
    retag(param, mup_type, depth, fan)
    return TagRecord(name, mup_type, depth, source, detail, fan)


def tag_from_graph(
    param: Tensor, record: TagRecord, role: str, used_fan_in: int | None = None
) -> TagRecord:
    """Retag a generically tagged ``param`` from its ``role`` in a captured graph
    (in place), with ``used_fan_in`` (the fan-in of the product it is the weight
    of, if known) as its ``mup_fan_in`` where its shape says otherwise; returns
    its new record, or ``record`` if nothing changed."""
    mup_type = _ROLE_TYPES.get(role)
    if record.source != "generic" or mup_type is None:
        return record
    fan = None
    detail = f"used as a {role}"
    if mup_type == "weight" and used_fan_in not in (None, _shape_fan_in(param)):
        fan = used_fan_in
        detail += f" with fan-in {fan}"
    retag(param, mup_type, record.mup_scaling_depth, fan)
    return dataclasses.replace(
        record, mup_type=mup_type, source="graph", detail=detail, mup_fan_in=fan
    )
