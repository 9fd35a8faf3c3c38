"""Unit scaling and u-μP for PyTorch.

Every activation, weight and gradient at RMS ≈ 1 at initialisation, learning rates
that transfer across width and depth, and tools to see and simulate low-precision
numerics. Conventionally imported as ``import unit_scaling as uu``.

Example::

    >>> import unit_scaling as uu
    >>> model = uu.TransformerDecoder(hidden_size=64, vocab_size=256, layers=2,
    ...                               heads=4, **uu.RECOMMENDED.multipliers)
    >>> opt = uu.optim.AdamW(model.parameters(), lr=uu.RECOMMENDED.lr)
"""

from . import (
    _torch_internals,  # noqa: F401 - first: refuses a torch below the floor
    constraints,
    core,
    functional,
    modules,
    optim,
    scale,
)
from .core.functional import transformer_residual_scaling_rule
from .modules import *  # noqa: F403 - every module class, as torch.nn has them
from .parameter import MupType, Parameter
from .recommended import RECOMMENDED, Recommended

__version__ = "0.1.0"

__all__ = [  # the module classes are listed in modules.__all__
    *modules.__all__,
    "RECOMMENDED",
    "MupType",
    "Parameter",
    "Recommended",
    "__version__",
    "constraints",
    "core",
    "functional",
    "optim",
    "scale",
    "transformer_residual_scaling_rule",
]
