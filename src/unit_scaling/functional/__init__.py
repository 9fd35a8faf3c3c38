"""Unit-scaled versions of :mod:`torch.nn.functional` and :mod:`torch` ops.

Each function mirrors its torch counterpart's signature (extra keyword arguments
such as ``constraint`` and ``mult`` come last) and, given unit-normal inputs and a
unit-normal output gradient, returns an output and input gradients of RMS ≈ 1.
A torch argument that a function cannot honour raises ``ValueError`` when given a
non-default value.

Conventionally imported as ``import unit_scaling.functional as U``.
"""

# Each submodule lists its public functions in its own __all__, once.
from . import (
    activation,
    adaptive_pooling,
    attention,
    conv,
    conv_transpose,
    grouped,
    interpolation,
    losses,
    normalization,
    pooling,
    reductions,
    residual,
    routing,
    sparse,
    steps,
)
from . import linear as _linear  # (`linear` names its function here)
from . import softcap as _softcap  # (`softcap` names its function here)
from ._torch_map import torch_map
from .activation import *  # noqa: F403
from .adaptive_pooling import *  # noqa: F403
from .attention import *  # noqa: F403
from .conv import *  # noqa: F403
from .conv_transpose import *  # noqa: F403
from .grouped import *  # noqa: F403
from .interpolation import *  # noqa: F403
from .linear import *  # noqa: F403
from .losses import *  # noqa: F403
from .normalization import *  # noqa: F403
from .pooling import *  # noqa: F403
from .reductions import *  # noqa: F403
from .residual import *  # noqa: F403
from .routing import *  # noqa: F403
from .softcap import *  # noqa: F403
from .sparse import *  # noqa: F403
from .steps import *  # noqa: F403

__all__ = [
    *activation.__all__,
    *adaptive_pooling.__all__,
    *attention.__all__,
    *conv.__all__,
    *conv_transpose.__all__,
    *grouped.__all__,
    *interpolation.__all__,
    *_linear.__all__,
    *losses.__all__,
    *normalization.__all__,
    *pooling.__all__,
    *reductions.__all__,
    *residual.__all__,
    *routing.__all__,
    *_softcap.__all__,
    *sparse.__all__,
    *steps.__all__,
    "torch_map",
]
