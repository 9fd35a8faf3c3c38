"""A base for the package's custom autograd functions, without per-call binding.

``torch.autograd.Function.apply`` binds its arguments to ``forward``'s signature
with :mod:`inspect` on every call when ``setup_context`` is defined (to fill in
defaults for functorch). That costs about 30 µs a call — more than the whole op
for small tensors, and a measurable share of a transformer's eager step. Our
functions are always called with every argument given positionally, so there is
nothing to bind: outside functorch transforms we go straight to the C++
``apply``; inside them (``vmap``, ``grad``, ...) we defer to torch unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ._torch_internals import functorch_transforms_active, unwrap_dead_wrappers

__all__ = ["Function"]


class Function(torch.autograd.Function):
    """``torch.autograd.Function`` whose ``apply`` takes positional arguments only
    and skips signature binding (identical semantics otherwise).

    ``generate_vmap_rule`` lets ``torch.func.vmap`` batch the forward and
    backward, which are written in batchable torch ops.
    """

    generate_vmap_rule = True
    # The C++ apply (found after torch.autograd.Function in the MRO), bound to each
    # subclass once rather than looked up through ``super()`` on every call.
    _c_apply: Callable[..., Any]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._c_apply = super(torch.autograd.Function, cls).apply  # type: ignore[misc]

    @classmethod
    def apply(cls, *args: Any) -> Any:
        if functorch_transforms_active():
            return super().apply(*args)  # type: ignore[no-untyped-call]
        return cls._c_apply(*unwrap_dead_wrappers(args))
