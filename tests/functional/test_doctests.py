"""The examples in the docstrings of ``unit_scaling.functional`` run and are right.

Docstring examples use ``torch`` and ``U`` (and ``F``) without importing them, as
the documentation does.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest
import torch
import torch.nn.functional as F

import unit_scaling.functional as U

MODULES = sorted(
    f"{U.__name__}.{info.name}" for info in pkgutil.iter_modules(U.__path__)
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    torch.manual_seed(0)
    globs = {"torch": torch, "U": U, "F": F, **vars(module)}
    result = doctest.testmod(module, globs=globs, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
