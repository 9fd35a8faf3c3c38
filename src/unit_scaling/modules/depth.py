"""Containers that tag their parameters with the depth of the residual stack.

u-μP scales each parameter's learning rate by ``depth^-½`` where ``depth`` is the
number of blocks in the residual stack it belongs to. These containers keep that
tag (``mup_scaling_depth = len(self)``) correct as blocks are added or removed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import nn

from ..parameter import has_parameter_data

__all__ = ["DepthModuleList", "DepthSequential"]


def _set_scaling_depth(container: nn.Module, depth: int) -> None:
    for name, param in container.named_parameters():
        if has_parameter_data(param):
            param.mup_scaling_depth = depth
        else:
            raise ValueError(
                f"{type(container).__name__}: parameter {name!r} "
                f"(shape {tuple(param.shape)}) has no u-μP tag; depth containers "
                "hold only unit_scaling modules, or parameters created with "
                "unit_scaling.Parameter(data, mup_type=...)"
            )


class _TagsDepth:
    """Mixin re-tagging after every mutation of a ModuleList/Sequential."""

    def _retag(self) -> None:
        assert isinstance(self, nn.Module)
        _set_scaling_depth(self, len(self._modules))

    def __setitem__(self, idx: Any, module: nn.Module) -> None:
        super().__setitem__(idx, module)  # type: ignore[misc]
        self._retag()

    def __delitem__(self, idx: Any) -> None:
        super().__delitem__(idx)  # type: ignore[misc]
        self._retag()

    def insert(self, index: int, module: nn.Module) -> Any:
        out = super().insert(index, module)  # type: ignore[misc]
        self._retag()
        return out

    def append(self, module: nn.Module) -> Any:
        out = super().append(module)  # type: ignore[misc]
        self._retag()
        return out

    def extend(self, modules: Iterable[nn.Module]) -> Any:
        out = super().extend(modules)  # type: ignore[misc]
        self._retag()
        return out


class DepthModuleList(_TagsDepth, nn.ModuleList):
    """A :class:`torch.nn.ModuleList` that sets ``mup_scaling_depth = len(self)``
    on every parameter inside it, and keeps it right as modules are added.

    Every parameter must carry a u-μP tag (``ValueError`` otherwise).

    Example::

        >>> blocks = DepthModuleList([Linear(8, 8) for _ in range(4)])
        >>> blocks[0].weight.mup_scaling_depth
        4
    """

    def __init__(self, modules: Iterable[nn.Module] | None = None) -> None:
        super().__init__(modules)
        self._retag()


class DepthSequential(_TagsDepth, nn.Sequential):
    """A :class:`torch.nn.Sequential` that sets ``mup_scaling_depth = len(self)``
    on every parameter inside it, and keeps it right as modules are added.

    Example::

        >>> stack = DepthSequential(*[Linear(8, 8) for _ in range(3)])
        >>> stack[2].weight.mup_scaling_depth
        3
    """

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._retag()
