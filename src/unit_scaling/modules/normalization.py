"""Unit-scaled normalisation layers.

A norm's output is already unit-scaled; each layer only rescales its affine
parameters' gradients (in the ``U.*`` function it calls). Gains are tagged
``mup_type="norm"`` and initialised to ones, biases ``"bias"`` and zeros.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .. import functional as U
from .._torch_internals import BatchNormBase, InstanceNormBase
from ..parameter import MupType, has_parameter_data, retag
from ._base import KeepsTags

__all__ = [
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNorm3d",
    "GroupNorm",
    "InstanceNorm1d",
    "InstanceNorm2d",
    "InstanceNorm3d",
    "LayerNorm",
    "RMSNorm",
]


class _NormBase(KeepsTags):
    """Tags the affine parameters that torch's constructor creates: the gain
    ``"norm"``, the bias ``"bias"``.

    Each torch norm's constructor ends by calling ``reset_parameters``, so the
    tags go on there, once for every norm; parameters already tagged are left as
    they are.
    """

    def reset_parameters(self) -> None:
        super().reset_parameters()  # type: ignore[misc]
        tags: tuple[tuple[str, MupType], ...] = (("weight", "norm"), ("bias", "bias"))
        for name, mup_type in tags:
            param = getattr(self, name, None)
            if isinstance(param, Tensor) and not has_parameter_data(param):
                retag(param, mup_type, None)


class LayerNorm(_NormBase, nn.LayerNorm):
    """Unit-scaled :class:`torch.nn.LayerNorm`: ``y = U.layer_norm(x, ...)``.

    The output of a norm is already unit-scaled; only the affine gradients are
    rescaled. Unlike torch, ``elementwise_affine`` defaults to ``False`` (u-μP
    removes trainable gains by default). Weight tagged ``"norm"``, bias ``"bias"``.

    Example::

        >>> LayerNorm(64)(torch.randn(8, 64)).std().item() > 0.99
        True
    """

    def __init__(
        self,
        normalized_shape: int | tuple[int, ...],
        eps: float = 1e-5,
        elementwise_affine: bool = False,
        bias: bool = True,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(normalized_shape, eps, elementwise_affine, bias, device, dtype)

    def forward(self, input: Tensor) -> Tensor:
        return U.layer_norm(
            input, self.normalized_shape, self.weight, self.bias, self.eps
        )


class RMSNorm(_NormBase, nn.RMSNorm):
    """Unit-scaled :class:`torch.nn.RMSNorm`: ``y = U.rms_norm(x, ...)``.

    ``elementwise_affine`` defaults to ``False``; when on, the gain is tagged
    ``"norm"`` and its gradient rescaled.

    Example::

        >>> y = RMSNorm(64)(3 * torch.randn(8, 64))
        >>> round(y.pow(2).mean().sqrt().item(), 2)
        1.0
    """

    def __init__(
        self,
        normalized_shape: int | tuple[int, ...],
        eps: float | None = None,
        elementwise_affine: bool = False,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(normalized_shape, eps, elementwise_affine, device, dtype)

    def forward(self, input: Tensor) -> Tensor:
        return U.rms_norm(input, self.normalized_shape, self.weight, self.eps)


class GroupNorm(_NormBase, nn.GroupNorm):
    """Unit-scaled :class:`torch.nn.GroupNorm`: ``y = U.group_norm(x, ...)``.

    Affine by default, as in torch: the per-channel gain is tagged ``"norm"``,
    the bias ``"bias"``.

    Example::

        >>> norm = GroupNorm(4, 32)
        >>> norm.weight.mup_type, norm(torch.randn(8, 32, 16)).shape
        ('norm', torch.Size([8, 32, 16]))
    """

    def __init__(
        self,
        num_groups: int,
        num_channels: int,
        eps: float = 1e-5,
        affine: bool = True,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(num_groups, num_channels, eps, affine, device, dtype)

    def forward(self, input: Tensor) -> Tensor:
        return U.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)


class _BatchNorm(_NormBase, BatchNormBase):
    """Torch's batch-norm module logic (running statistics, momentum ``None`` as
    a cumulative average, evaluation without running statistics) on
    :func:`~unit_scaling.functional.batch_norm`."""

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            num_features, eps, momentum, affine, track_running_stats, device, dtype
        )

    def forward(self, input: Tensor) -> Tensor:
        self._check_input_dim(input)  # type: ignore[no-untyped-call]
        momentum = 0.0 if self.momentum is None else self.momentum
        tracked = self.num_batches_tracked
        if self.training and self.track_running_stats and tracked is not None:
            tracked.add_(1)
            if self.momentum is None:
                momentum = 1.0 / float(tracked)
        # Running statistics are used in evaluation when they exist, and
        # updated in training only when tracked.
        use_batch_stats = self.training or (
            self.running_mean is None and self.running_var is None
        )
        track = not self.training or self.track_running_stats
        return U.batch_norm(
            input,
            self.running_mean if track else None,
            self.running_var if track else None,
            self.weight,
            self.bias,
            use_batch_stats,
            momentum,
            self.eps,
        )


class BatchNorm1d(_BatchNorm, nn.BatchNorm1d):
    """Unit-scaled :class:`torch.nn.BatchNorm1d`: ``y = U.batch_norm(x, ...)``.

    Example::

        >>> BatchNorm1d(16)(3 * torch.randn(32, 16)).std().item() > 0.99
        True
    """


class BatchNorm2d(_BatchNorm, nn.BatchNorm2d):
    """Unit-scaled :class:`torch.nn.BatchNorm2d`: ``y = U.batch_norm(x, ...)``.

    Example::

        >>> BatchNorm2d(16)(torch.randn(8, 16, 4, 4)).shape
        torch.Size([8, 16, 4, 4])
    """


class BatchNorm3d(_BatchNorm, nn.BatchNorm3d):
    """Unit-scaled :class:`torch.nn.BatchNorm3d`: ``y = U.batch_norm(x, ...)``.

    Example::

        >>> BatchNorm3d(8)(torch.randn(4, 8, 4, 4, 4)).shape
        torch.Size([4, 8, 4, 4, 4])
    """


class _InstanceNorm(_NormBase, InstanceNormBase):
    """Torch's instance-norm module (input checks, unbatched input) calling
    :func:`~unit_scaling.functional.instance_norm`."""

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float = 0.1,
        affine: bool = False,
        track_running_stats: bool = False,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            num_features, eps, momentum, affine, track_running_stats, device, dtype
        )

    def _apply_instance_norm(self, input: Tensor) -> Tensor:
        return U.instance_norm(
            input,
            self.running_mean,
            self.running_var,
            self.weight,
            self.bias,
            self.training or not self.track_running_stats,
            0.0 if self.momentum is None else self.momentum,
            self.eps,
        )


class InstanceNorm1d(_InstanceNorm, nn.InstanceNorm1d):
    """Unit-scaled :class:`torch.nn.InstanceNorm1d`: ``U.instance_norm``.

    Not affine by default, as in torch.

    Example::

        >>> InstanceNorm1d(16)(3 * torch.randn(8, 16, 64)).std().item() > 0.99
        True
    """


class InstanceNorm2d(_InstanceNorm, nn.InstanceNorm2d):
    """Unit-scaled :class:`torch.nn.InstanceNorm2d`: ``U.instance_norm``.

    Example::

        >>> InstanceNorm2d(16, affine=True)(torch.randn(4, 16, 8, 8)).shape
        torch.Size([4, 16, 8, 8])
    """


class InstanceNorm3d(_InstanceNorm, nn.InstanceNorm3d):
    """Unit-scaled :class:`torch.nn.InstanceNorm3d`: ``U.instance_norm``.

    Example::

        >>> InstanceNorm3d(8)(torch.randn(2, 8, 4, 4, 4)).shape
        torch.Size([2, 8, 4, 4, 4])
    """
