"""Placeholder: being written."""

from typing import Any


def conv1d(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError


def conv2d(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError
