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


def _check_tagged(owner: str, modules: Iterable[nn.Module], start: int = 0) -> None:
    for i, module in enumerate(modules, start):
        for name, param in module.named_parameters():
            if not has_parameter_data(param):
                raise ValueError(
                    f"{owner}: parameter {f'{i}.{name}'!r} (shape "
                    f"{tuple(param.shape)}) has no u-μP tag; depth containers hold "
                    "only unit_scaling modules, or parameters created with "
                    "unit_scaling.Parameter(data, mup_type=...)"
                )


class _TagsDepth:
    """Mixin keeping ``mup_scaling_depth = len(self)`` through every mutation of a
    ModuleList/Sequential, and refusing untagged parameters before they enter."""

    def _retag(self) -> None:
        assert isinstance(self, nn.Module)
        _check_tagged(type(self).__name__, self._modules.values())  # type: ignore[arg-type]
        for param in self.parameters():
            param.mup_scaling_depth = len(self._modules)  # type: ignore[attr-defined]

    def _admit(self, modules: Iterable[nn.Module], at: Any = None) -> None:
        assert isinstance(self, nn.Module)
        start = len(self._modules) if at is None else at
        _check_tagged(
            type(self).__name__, modules, start if isinstance(start, int) else 0
        )

    def __setitem__(self, idx: Any, module: nn.Module) -> None:
        self._admit([module], idx)
        super().__setitem__(idx, module)  # type: ignore[misc]
        self._retag()

    def __delitem__(self, idx: Any) -> None:
        super().__delitem__(idx)  # type: ignore[misc]
        self._retag()

    def insert(self, index: int, module: nn.Module) -> Any:
        self._admit([module], index)
        out = super().insert(index, module)  # type: ignore[misc]
        self._retag()
        return out

    def append(self, module: nn.Module) -> Any:
        self._admit([module])
        out = super().append(module)  # type: ignore[misc]
        self._retag()
        return out

    def extend(self, modules: Iterable[nn.Module]) -> Any:
        modules = list(modules)
        self._admit(modules)
        out = super().extend(modules)  # type: ignore[misc]
        self._retag()
        return out

    def __iadd__(self, other: Any) -> Any:
        self._admit(list(other))
        out = super().__iadd__(other)  # type: ignore[misc]
        self._retag()
        return out

    def __imul__(self, other: int) -> Any:
        out = super().__imul__(other)  # type: ignore[misc]
        self._retag()
        return out

    def pop(self, key: Any) -> nn.Module:
        out: nn.Module = super().pop(key)  # type: ignore[misc]
        self._retag()
        return out


class DepthModuleList(_TagsDepth, nn.ModuleList):
    """A :class:`torch.nn.ModuleList` that sets ``mup_scaling_depth = len(self)``
    on every parameter inside it, and keeps it right as modules are added.

    Every parameter must carry a u-μP tag (``ValueError`` otherwise).

    Example::

        >>> blocks = DepthModuleList([uu.Linear(8, 8) for _ in range(4)])
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

        >>> stack = DepthSequential(*[uu.Linear(8, 8) for _ in range(3)])
        >>> stack[2].weight.mup_scaling_depth
        3
    """

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._retag()
