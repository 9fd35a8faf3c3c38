"""A base for the package's custom autograd functions, without per-call binding.

Written in the ``forward`` + ``setup_context`` style, a ``torch.autograd.Function``
has its arguments bound to ``forward``'s signature with :mod:`inspect` on every
``apply`` (to fill in defaults for functorch): about 30 µs a call, more than the
whole op for small tensors and a measurable share of a transformer's eager step.
Where that binding happens changes between torch versions (Python before 2.15,
C++ since), so instead of skipping torch's code we avoid the style that needs
it: each subclass gets a twin in the older combined style, ``forward(ctx,
*args)``, which torch never binds. Outside functorch transforms ``apply`` runs
the twin; inside them (``vmap``, ``grad``, ...) it defers to torch unchanged.
torch.compile traces the subclass itself; on torch 2.11 its ``forward`` then
returns fresh output tensors, without which Dynamo's graph drops the gradient
of an output made in place (see ``COMPILED_FUNCTION_OUTPUTS_NEED_FRESH_TENSORS``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ._torch_internals import (
    COMPILED_FUNCTION_OUTPUTS_NEED_FRESH_TENSORS,
    functorch_transforms_active,
    pytree,
    unsafe_view,
)

__all__ = ["Function"]


def _fresh_when_compiled(forward: Callable[..., Any]) -> Callable[..., Any]:
    """``forward`` returning, while torch.compile traces it, a new tensor on the
    same memory in place of each output tensor (free in a compiled graph): the
    workaround for ``COMPILED_FUNCTION_OUTPUTS_NEED_FRESH_TENSORS``. It keeps
    ``forward``'s signature: Dynamo reads it to tell whether to pass a ``ctx``."""

    @functools.wraps(forward)
    def fresh_forward(*args: Any) -> Any:
        output = forward(*args)
        if not torch.compiler.is_compiling():
            return output
        return pytree.tree_map_only(Tensor, lambda t: unsafe_view(t, t.shape), output)

    return fresh_forward


def _combined_style(
    cls: type[torch.autograd.Function],
) -> type[torch.autograd.Function]:
    """``cls`` as a ``torch.autograd.Function`` whose ``forward(ctx, *args)`` runs
    ``cls.forward`` and then ``cls.setup_context``: the same computation and
    backward, with nothing for torch to bind. Same name, so that ``grad_fn``
    reads as ``cls``'s."""
    forward, setup_context = cls.forward, cls.setup_context

    def forward_and_setup(ctx: Any, *args: Any) -> Any:
        output = forward(*args)
        setup_context(ctx, args, output)
        return output

    return type(
        cls.__name__,
        (torch.autograd.Function,),
        {
            "forward": staticmethod(forward_and_setup),
            "backward": staticmethod(cls.backward),
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            "__doc__": cls.__doc__,
        },
    )


class Function(torch.autograd.Function):
    """``torch.autograd.Function`` whose ``apply`` takes positional arguments only
    and does no signature binding (identical semantics otherwise).

    ``generate_vmap_rule`` lets ``torch.func.vmap`` batch the forward and
    backward, which are written in batchable torch ops.
    """

    generate_vmap_rule = True
    # The combined-style twin that ``apply`` runs outside functorch transforms.
    _combined: type[torch.autograd.Function]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._combined = _combined_style(cls)
        if COMPILED_FUNCTION_OUTPUTS_NEED_FRESH_TENSORS:
            # torch.compile traces ``cls`` itself (never the twin, nor ``apply``).
            cls.forward = staticmethod(_fresh_when_compiled(cls.forward))  # type: ignore[method-assign]

    @classmethod
    def apply(cls, *args: Any) -> Any:
        if functorch_transforms_active():
            return super().apply(*args)  # type: ignore[no-untyped-call]
        return cls._combined.apply(*args)  # type: ignore[no-untyped-call]
