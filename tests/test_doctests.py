"""Every docstring example of ``unit_scaling`` and ``admin_torch`` runs and is right.

Examples use ``torch``, ``nn``, ``F``, ``U`` (``unit_scaling.functional``),
``uu`` (``unit_scaling``) and ``admin_torch`` without importing them, as the
documentation does, and the names of their own module; anything else they
import. They run in a temporary directory (some save figures), with torch's
seed set to 0 for each module, and the examples of ``unit_scaling.parallel``
inside a one-process gloo group. None is skipped.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import admin_torch
import unit_scaling as uu
import unit_scaling.functional as U


def _modules() -> list[str]:
    names = []
    for package in (uu, admin_torch):
        names.append(package.__name__)
        names += [
            info.name
            for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
            if not info.name.endswith("__main__")
        ]
    return sorted(names)


MODULES = _modules()


@contextmanager
def _process_group() -> Iterator[None]:
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = importlib.import_module(name)
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    globs = {
        "torch": torch,
        "nn": nn,
        "F": F,
        "U": U,
        "uu": uu,
        "admin_torch": admin_torch,
        **vars(module),
    }
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    try:
        if name == "unit_scaling.parallel":
            with _process_group():
                result = doctest.testmod(module, globs=globs, optionflags=flags)
        else:
            result = doctest.testmod(module, globs=globs, optionflags=flags)
    finally:
        plt.close("all")
    assert result.failed == 0


def test_the_examples_are_many_and_found() -> None:
    finder = doctest.DocTestFinder()
    counts = {
        name: sum(len(t.examples) for t in finder.find(importlib.import_module(name)))
        for name in MODULES
    }
    assert sum(counts.values()) > 300
    # the public modules every user meets each show at least one example
    for name in (
        "unit_scaling.scale",
        "unit_scaling.functional.linear",
        "unit_scaling.modules.transformer",
        "unit_scaling.optim",
        "unit_scaling.formats",
        "unit_scaling.transforms.unit_scale",
        "unit_scaling.utils",
        "admin_torch.admin",
    ):
        # (a package's examples are in its modules)
        found = sum(n for module, n in counts.items() if module.startswith(name))
        assert found > 0, name
