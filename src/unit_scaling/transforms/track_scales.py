"""``track_scales``: record the scale of every tensor in the forward and backward pass.

Statistics are computed on the tensor's device as it is produced (and on its
gradient as backpropagation reaches it, through a tensor hook), kept as small
device tensors of raw sums and counts, and read back to the host in one
transfer per device when ``scales_graph()`` is called. Tracking saves no tensor
for the backward pass, so it holds no activation longer than the untracked
model does.

On CPU one C++ pass reads each tensor in place (any layout that is rows of
contiguous elements, so slices and permutations need no copy); elsewhere, and
as the fallback, fused torch ops compute the same sums. Values that are
provably the same (views, aliases, unchanged parameters) are measured once.
"""

from __future__ import annotations

import logging

from torch import nn

from ..formats import BlockFormat
from ._capture.engine import (
    M,
    Place,
    RunState,
    Transform,
    apply_transform,
    transform_state,
)
from ._capture.library import Prepared
from ._capture.opaque import UNIT_SCALED_FUNCTIONS
from ._tracking.graph_pass import TrackingPass
from ._tracking.input_grads import InputGradFallback, make_inputs_require_grad
from ._tracking.metrics import Metrics
from ._tracking.pruning import (
    prune_non_float_tensors,
    prune_same_scale_tensors,
    prune_selected_nodes,
)
from ._tracking.scales_graph import ScalesGraph

__all__ = [
    "Metrics",
    "prune_non_float_tensors",
    "prune_same_scale_tensors",
    "prune_selected_nodes",
    "track_scales",
]

logger = logging.getLogger(__name__)


def track_scales(module: M, *, block_format: BlockFormat | None = None) -> M:
    """Return a copy of ``module`` that records the scale of every tensor it uses.

    After a forward (and optionally backward) pass, ``model.scales_graph()``
    returns a :class:`torch.fx.Graph` whose floating-point nodes carry
    ``meta["metrics"]`` (:class:`Metrics`, with ``.fwd`` and ``.bwd``
    statistics); every node, the output included, carries
    ``meta["clean_name"]``, ``meta["outputs_float_tensor"]`` and
    ``meta["requires_grad"]``. Before the first forward pass no metrics exist
    yet, and ``scales_graph()`` returns an empty graph. Beyond the scale
    statistics, each :class:`Metrics.Data` holds the fractions of elements that
    would overflow or flush to zero in FP8 E4M3 and E5M2. Where TorchDynamo
    breaks the forward into several graphs, all of them are tracked and merged.
    Values inside code traced under ``vmap`` are per-sample views, not tensors
    of the program: they are not tracked (``outputs_float_tensor`` is false).

    With a ``block_format`` (:class:`~unit_scaling.formats.BlockFormat`), each
    tensor and gradient is also quantised to it, in blocks along its last axis
    (a weight's and an activation's features: the forward GEMM's contraction),
    and its ``block_*`` fields report what that does
    (:func:`~unit_scaling.formats.quantisation_statistics`: the fractions that
    flush and saturate, the MSE and SQNR, the blocks' dynamic range); without
    one they are NaN. This costs an eager quantisation of every tensor.

    Floating-point tensor inputs get ``requires_grad_()`` so that their gradients
    are tracked too, unless the model cannot take such inputs (it sets
    ``requires_grad`` on a tensor computed from them): then the call is rerun
    with inputs as given, with a warning. Statistics stay on the device until
    ``scales_graph()`` reads them in one transfer. Tracking is always applied
    last, and runs eagerly.

    Example::

        >>> model = track_scales(nn.Sequential(nn.Linear(8, 8), nn.ReLU()))
        >>> model(torch.randn(4, 8)).sum().backward()
        >>> graph = model.scales_graph()
        >>> [n.meta["clean_name"] for n in graph.nodes if "metrics" in n.meta]
        ['0.weight', '0.bias', 'input', 'input_1', 'input_2']
        >>> from unit_scaling.formats import MXFP4
        >>> model = track_scales(nn.Linear(64, 8), block_format=MXFP4)
        >>> model(torch.randn(4, 64)).sum().backward()
        >>> node = next(n for n in model.scales_graph().nodes if "metrics" in n.meta)
        >>> 10 < node.meta["metrics"].fwd.block_sqnr_db < 20  # the weight in MXFP4
        True
    """
    if block_format is not None and not isinstance(block_format, BlockFormat):
        raise TypeError(
            f"block_format must be a BlockFormat, got {type(block_format).__name__}"
        )
    previous = transform_state(module) if isinstance(module, nn.Module) else None
    if previous is not None and previous.config.backend is not None:
        logger.info(
            "track_scales runs the model eagerly: dropping %s",
            previous.config.backend[0],
        )
    transform = Transform(
        name="track_scales",
        label="scale tracking backend",
        place=Place.OBSERVE,
        graph_pass=TrackingPass(block_format),
        eager=True,
        non_recurse=UNIT_SCALED_FUNCTIONS,
        before_call=(make_inputs_require_grad,),
        attributes=(("scales_graph", ScalesGraph),),
        setup=_fall_back_to_inputs_as_given,
    )
    return apply_transform(module, transform)


def _fall_back_to_inputs_as_given(
    module: nn.Module, state: RunState, prepared: Prepared
) -> None:
    """The engine's set-up stage: the forward reruns a call with the inputs as
    given when the model cannot take inputs that require grad."""
    object.__setattr__(module, "forward", InputGradFallback(module.forward, state))
