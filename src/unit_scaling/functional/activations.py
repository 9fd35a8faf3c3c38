"""Placeholder: being written."""

from typing import Any


def gelu(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError


def silu(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError


def silu_glu(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError


def relu(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError


def tanh(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError


def sigmoid(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError


def softmax(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError


def dropout(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError
