"""The plotting dependencies are optional: a clear error when they are missing."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest


@pytest.mark.parametrize("package", ["matplotlib", "pandas"])
def test_missing_extra_explains_how_to_install(
    package: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(sys.modules):
        if name == "unit_scaling.analysis" or name.startswith("unit_scaling.analysis."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, package, None)  # makes `import package` fail
    with pytest.raises(ImportError, match=r'pip install "torch-unit-scaling\[plot\]"'):
        importlib.import_module("unit_scaling.analysis")


def test_core_package_never_needs_the_extra() -> None:
    code = (
        "import sys\n"
        "sys.modules['matplotlib'] = sys.modules['pandas'] = None\n"
        "import unit_scaling, unit_scaling.transforms, unit_scaling.utils\n"
        "import torch\n"
        "print(unit_scaling.utils.analyse_module(unit_scaling.Linear(4, 4),"
        " torch.randn(2, 4)).splitlines()[0])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("def forward(")
