"""The examples in the docstrings of ``unit_scaling.modules`` run and are right.

Docstring examples use ``torch``, ``nn`` and the public classes without importing
them, as the documentation does.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest
import torch
from torch import nn

import unit_scaling as uu
import unit_scaling.functional as U
import unit_scaling.modules

MODULES = sorted(
    f"{unit_scaling.modules.__name__}.{info.name}"
    for info in pkgutil.iter_modules(unit_scaling.modules.__path__)
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    torch.manual_seed(0)
    public = {name: getattr(uu, name) for name in uu.__all__}
    globs = {"torch": torch, "nn": nn, "uu": uu, "U": U, **public, **vars(module)}
    result = doctest.testmod(module, globs=globs, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
