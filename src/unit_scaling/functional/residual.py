"""Placeholder: being written."""

from typing import Any


def add(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError


def residual_split(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError


def residual_add(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError


def residual_apply(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError
