"""Unit-scaled :mod:`torch.nn` modules; each holds parameters and calls one ``U.*``."""

# Each submodule lists its public classes in its own __all__, once.
from . import (
    activation,
    conv,
    depth,
    linear,
    loss,
    normalization,
    pooling,
    sparse,
    transformer,
    upsampling,
)
from .activation import *  # noqa: F403
from .conv import *  # noqa: F403
from .depth import *  # noqa: F403
from .linear import *  # noqa: F403
from .loss import *  # noqa: F403
from .normalization import *  # noqa: F403
from .pooling import *  # noqa: F403
from .sparse import *  # noqa: F403
from .transformer import *  # noqa: F403
from .upsampling import *  # noqa: F403

__all__ = [
    *activation.__all__,
    *conv.__all__,
    *depth.__all__,
    *linear.__all__,
    *loss.__all__,
    *normalization.__all__,
    *pooling.__all__,
    *sparse.__all__,
    *transformer.__all__,
    *upsampling.__all__,
]
