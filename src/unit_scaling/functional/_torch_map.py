"""Placeholder: being written."""

from collections.abc import Callable
from typing import Any

torch_map: dict[Callable[..., Any], Callable[..., Any]] = {}
