"""The API reference documents every public name: the site is built as
``make docs`` builds it, and each page shows, with a docstring, every name in
the ``__all__`` of each module it renders (``::: module``)."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs" / "api").glob("*.md"))
_DIRECTIVE = re.compile(r"^::: (\S+)\s*$", re.MULTILINE)
_ANCHOR = re.compile(r'id="([\w.]+)"')


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mkdocs")
    out = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    return out


def _public_names(page: Path) -> dict[str, str]:
    """Each name a page must show: ``__all__`` of every module it renders
    (or the object a directive names), by the module that lists it."""
    names = {}
    for target in _DIRECTIVE.findall(page.read_text()):
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError:
            names[target.rsplit(".", 1)[-1]] = target
            continue
        for name in getattr(module, "__all__", ()):
            names[name] = f"{target}.{name}"
    return names


@pytest.mark.parametrize("page", [p for p in PAGES if p.stem != "index"], ids=str)
def test_each_public_name_is_documented(site: Path, page: Path) -> None:
    html = (site / "api" / page.stem / "index.html").read_text()
    anchors = {a.rsplit(".", 1)[-1] for a in _ANCHOR.findall(html)}
    missing = sorted(
        full for name, full in _public_names(page).items() if name not in anchors
    )
    assert not missing, f"{page.name} does not show {missing}"


def test_the_check_reads_the_pages() -> None:
    names = _public_names(ROOT / "docs" / "api" / "transforms.md")
    assert {"unit_scale", "track_scales", "UnitScaleReport"} <= names.keys()
