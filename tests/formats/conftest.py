"""The golden fixtures of the block-format tests (``make_fixtures.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from .make_fixtures import load


@pytest.fixture(scope="module")
def fixtures() -> dict[str, Any]:
    return load()
