"""``compile``: ``torch.compile`` as a transform that composes with the others."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch.fx import GraphModule

from ._capture.dynamo import inductor_backend
from ._capture.engine import M, Place, Transform, apply_transform

__all__ = ["compile"]


def _inductor(gm: GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
    compiled: Callable[..., Any] = inductor_backend()(gm, list(example_inputs))
    return compiled


def compile(module: M) -> M:
    """Return a copy of ``module`` whose transformed graphs are compiled by Inductor.

    ``compile(simulate_fp8(unit_scale(model)))`` runs every graph rewrite and then
    compiles the result, in one Dynamo capture. (Plain ``torch.compile`` of a
    transformed module also works; this form avoids a second capture.)
    It cannot follow :func:`track_scales`, which runs the model eagerly.

    Raises:
        ValueError: if ``module`` is already tracked by :func:`track_scales`.

    Example::

        >>> model = compile(nn.Linear(16, 16))
        >>> model(torch.randn(2, 16)).shape
        torch.Size([2, 16])
    """
    transform = Transform(name="compile", place=Place.REWRITE, backend=_inductor)
    return apply_transform(module, transform)
