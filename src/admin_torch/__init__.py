"""Admin: adaptive model initialisation for residual networks.

Deep Post-LN transformers are hard to train because each residual sum
``LN(x + f(x))`` lets every branch change the output by a large fraction, and the
changes compound with depth. Admin rescales each shortcut, ``LN(x * omega + f(x))``,
so that the shortcut dominates at initialisation:

* closed form (:func:`calculate_init`, :func:`as_module`, :func:`as_buffer`,
  :func:`as_parameter`): one ``omega`` per stack from the number of residual
  branches;
* profiled (:func:`profile_init`): the original method, ``omega_i`` from the
  variances of the branches before residual ``i``, measured on a batch.

Example::

    >>> import torch
    >>> import admin_torch
    >>> residual = admin_torch.as_module(num_res_layers=24)  # omega ≈ 2.60
    >>> x, f_x = torch.randn(2, 8), torch.randn(2, 8)
    >>> out = residual(x, f_x)  # x * omega + f_x
"""

from . import admin
from .admin import *  # noqa: F403  (its __all__: the closed-form API)
from .profiling import profile_init
from .residual import OmegaResidual

__all__ = [*admin.__all__, "OmegaResidual", "profile_init"]
