"""``simulate_format``, ``simulate_fp8``: matrix products on low-precision inputs."""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.fx import Graph, GraphModule, Node

from .. import functional as U
from ..formats import FP8_E4M3, FP8_E5M2, FPFormat
from ._capture.engine import GraphPass, M, Place, Transform, apply_transform
from ._capture.graph import is_float_tensor_node
from ._capture.opaque import UNIT_SCALED_FUNCTIONS

__all__ = ["simulate_format", "simulate_fp8"]

logger = logging.getLogger(__name__)

# The ops that would run in the low-precision format on hardware.
_QUANTISED_FUNCTIONS = {
    F.linear,
    U.linear,
    U.linear_readout,
    torch.matmul,
    operator.matmul,
    U.matmul,
    torch.bmm,
    U.bmm,
    torch.addmm,
    torch.baddbmm,
    torch.einsum,
    U.einsum,
    F.scaled_dot_product_attention,
    U.scaled_dot_product_attention,
}
_QUANTISED_METHODS = {"matmul", "__matmul__", "bmm"}


def _quantiser(fwd: FPFormat, bwd: FPFormat) -> Callable[[Tensor], Tensor]:
    """A graph target quantising its input to ``fwd`` and its gradient to ``bwd``."""

    def quantise(x: Tensor) -> Tensor:
        return fwd.quantise_fwd(bwd.quantise_bwd(x))

    quantise.__name__ = quantise.__qualname__ = f"quantise_{fwd}_{bwd}".replace(
        "-", "_"
    )
    return quantise


def _quantise_inputs(
    graph: Graph, node: Node, quantise: Callable[[Tensor], Tensor]
) -> None:
    def wrap(arg: Any) -> Any:
        if not is_float_tensor_node(arg):
            return arg
        with graph.inserting_before(node):
            return graph.call_function(quantise, (arg,))

    node.args = tuple(wrap(a) for a in node.args)
    node.kwargs = {k: wrap(v) for k, v in node.kwargs.items()}


def _quantisation_pass(fwd: FPFormat, bwd: FPFormat) -> GraphPass:
    quantise = _quantiser(fwd, bwd)

    def run(gm: GraphModule) -> GraphModule:
        for node in list(gm.graph.nodes):
            if (node.op == "call_function" and node.target in _QUANTISED_FUNCTIONS) or (
                node.op == "call_method" and node.target in _QUANTISED_METHODS
            ):
                logger.info("quantising function: %s", node)
                _quantise_inputs(gm.graph, node, quantise)
        return gm

    return run


def simulate_format(module: M, fwd_format: FPFormat, bwd_format: FPFormat) -> M:
    """Return a copy of ``module`` whose matrix products see quantised inputs.

    The inputs of every linear layer, matmul and attention (plain torch ones and
    the unit-scaled ones) are rounded to ``fwd_format`` in the forward pass, and
    the gradients flowing back into those inputs to ``bwd_format``, simulating
    hardware that runs these ops in a low-precision format. Everything else
    keeps its precision. Composes with the other transforms; unit scaling always
    runs first.

    Args:
        module: the module to transform (never modified).
        fwd_format: format of the forward-pass inputs.
        bwd_format: format of the gradients.

    Example::

        >>> from unit_scaling.formats import FPFormat
        >>> model = simulate_format(nn.Linear(16, 16), FPFormat(4, 3, "nearest"),
        ...                         FPFormat(5, 2, "nearest"))
        >>> model(torch.randn(2, 16)).shape
        torch.Size([2, 16])
    """
    for name, fmt in (("fwd_format", fwd_format), ("bwd_format", bwd_format)):
        if not isinstance(fmt, FPFormat):
            raise TypeError(f"{name} must be an FPFormat, got {type(fmt).__name__}")
    transform = Transform(
        name="simulate_format",
        label="quantisation backend",
        place=Place.QUANTISE,
        graph_pass=_quantisation_pass(fwd_format, bwd_format),
        non_recurse=UNIT_SCALED_FUNCTIONS,
    )
    return apply_transform(module, transform)


def simulate_fp8(module: M) -> M:
    """:func:`simulate_format` with the OCP FP8 formats hardware uses.

    Forward inputs in E4M3 (``torch.float8_e4m3fn``, max 448), gradients in E5M2
    (``torch.float8_e5m2``, max 57344), both rounded to nearest and saturating.
    No loss scaling is applied: a unit-scaled model needs none.

    Example::

        >>> model = simulate_fp8(nn.Linear(16, 16))
        >>> model(torch.randn(2, 16)).shape
        torch.Size([2, 16])
    """
    return simulate_format(module, FP8_E4M3, FP8_E5M2)
