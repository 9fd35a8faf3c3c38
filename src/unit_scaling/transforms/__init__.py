"""Graph transforms that apply unit scaling, scale tracking and format simulation
to any ``nn.Module``.

Each transform traces the module with TorchDynamo, rewrites the captured FX
graph, and returns a new module (the input is never modified). Transforms
compose in any order the documents allow::

    model = compile(simulate_fp8(unit_scale(model)))
    model = track_scales(unit_scale(model))

``unit_scale(model).unit_scale_report()`` says what was done to every op and
parameter (see :class:`UnitScaleReport`).
"""

from .compile import compile
from .simulate_format import simulate_format, simulate_fp8
from .track_scales import (
    Metrics,
    prune_non_float_tensors,
    prune_same_scale_tensors,
    prune_selected_nodes,
    track_scales,
)
from .unit_scale import (
    UnitScaleReport,
    checkpoint_record,
    load_checkpoint_record,
    tag_added_parameters,
    unit_scale,
    unit_scale_report,
)

__all__ = [
    "Metrics",
    "UnitScaleReport",
    "checkpoint_record",
    "compile",
    "load_checkpoint_record",
    "prune_non_float_tensors",
    "prune_same_scale_tensors",
    "prune_selected_nodes",
    "simulate_format",
    "simulate_fp8",
    "tag_added_parameters",
    "track_scales",
    "unit_scale",
    "unit_scale_report",
]
