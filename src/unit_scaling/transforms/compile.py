"""``compile``: ``torch.compile`` as a transform that composes with the others."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch._dynamo
from torch import nn
from torch.fx import GraphModule

from ._dynamo import apply_transform, transform_state

__all__ = ["compile"]

M = TypeVar("M", bound=nn.Module)


def _inductor(gm: GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
    backend = torch._dynamo.lookup_backend("inductor")
    return backend(gm, list(example_inputs))


def compile(module: M) -> M:
    """Return a copy of ``module`` whose transformed graphs are compiled by Inductor.

    ``compile(simulate_fp8(unit_scale(model)))`` runs every graph rewrite and then
    compiles the result, in one Dynamo capture. (Plain ``torch.compile`` of a
    transformed module also works; this form avoids a second capture.)

    Example::

        >>> model = compile(nn.Linear(16, 16))
        >>> model(torch.randn(2, 16)).shape
        torch.Size([2, 16])
    """
    state = transform_state(module) if isinstance(module, nn.Module) else None
    if state is not None and any(name == "track_scales" for name, _ in state.passes):
        raise ValueError(
            "compile() cannot follow track_scales(): scale tracking must be the "
            "last transform; compile first, then track"
        )
    return apply_transform(module, "compile", executor=_inductor)
