"""Placeholder: being written."""

from typing import Any


def embedding(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError
