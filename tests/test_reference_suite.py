"""``make test-reference``'s preparation: the import rewrite, the check that
nothing else changed, the wheel cache, the exclusion list and its stale check.

On fake files and a fake wheel: no network, and not the reference suite itself
(that is ``make test-reference``).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from tools import reference_suite as suite
from tools.reference_exclusions import EXCLUDED, PAGE, PRIVATE, Exclusion

ROOT = Path(__file__).parents[1]

_PRIVATE = {"unit_scaling.docs": None, "unit_scaling.analysis": frozenset({"_x"})}

# A test file of theirs, under transforms/: every form of import they use.
_THEIRS = '''\
"""Docstring."""

import torch
from torch import nn

from ... import _modules as uu
from ... import functional as U
from ...transforms import (  # a comment
    simulate_fp8,
    unit_scale,
)
from ...analysis import _x, plot
from ...docs import _validate
from ..helper import assert_unit_scaled
from . import sibling


def test_one() -> None:
    from ...formats import FPFormat

    assert unit_scale(nn.Linear(2, 2))
'''

_OURS = '''\
"""Docstring."""

import torch
from torch import nn

import unit_scaling as uu
from unit_scaling import functional as U
from unit_scaling.transforms import (  # a comment
    simulate_fp8,
    unit_scale,
)
from unit_scaling.analysis import plot; from reference_tests._absent import _x
from reference_tests._absent import _validate
from ..helper import assert_unit_scaled
from . import sibling


def test_one() -> None:
    from unit_scaling.formats import FPFormat

    assert unit_scale(nn.Linear(2, 2))
'''


def test_relative_imports_point_to_our_public_paths() -> None:
    rewritten = suite.rewrite_imports(_THEIRS, "transforms/test_x.py", _PRIVATE)
    assert rewritten == _OURS
    suite.check_only_imports_differ(_THEIRS, rewritten, "transforms/test_x.py")


def test_the_depth_of_a_file_sets_what_its_dots_mean() -> None:
    top = suite.rewrite_imports("from ..scale import scale_fwd\n", "test_s.py", {})
    assert top == "from unit_scaling.scale import scale_fwd\n"
    core = "from ...core.functional import rms\nfrom ..helper import unit_backward\n"
    assert suite.rewrite_imports(core, "core/test_f.py", {}) == (
        "from unit_scaling.core.functional import rms\n"
        "from ..helper import unit_backward\n"
    )


@pytest.mark.parametrize(
    ("rewritten", "message"),
    [
        (_OURS.replace("nn.Linear(2, 2)", "nn.Linear(2, 3)"), r"test_x.py:21: .*"),
        (_OURS + "x = 1\n", "lines outside its imports"),
        (_OURS.replace('"""Docstring."""\n', ""), r"test_x.py:1: .*Docstring"),
        (_OURS.replace("as uu", "as vv"), "bind"),
        (_OURS.replace("import _validate", "import _validate, F"), "bind"),
    ],
    ids=["changed line", "added line", "removed line", "renamed", "extra name"],
)
def test_any_other_change_is_refused(rewritten: str, message: str) -> None:
    with pytest.raises(suite.ReferenceSuiteError, match=message):
        suite.check_only_imports_differ(_THEIRS, rewritten, "transforms/test_x.py")


def test_an_import_sharing_its_line_with_code_is_refused() -> None:
    theirs = "from ..scale import scale_fwd; x = 1\n"
    ours = "from unit_scaling.scale import scale_fwd; x = 2\n"
    with pytest.raises(suite.ReferenceSuiteError, match="shares its line"):
        suite.check_only_imports_differ(theirs, ours, "test_s.py")


def _fake_wheel(path: Path, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return path


def test_only_their_tests_are_written_rewritten_and_checked(tmp_path: Path) -> None:
    wheel = _fake_wheel(
        tmp_path / "fake.whl",
        {
            "unit_scaling/__init__.py": "raise ImportError('never imported')\n",
            "unit_scaling/tests/__init__.py": "",
            "unit_scaling/tests/transforms/test_x.py": _THEIRS,
            "unit_scaling/tests/data.txt": "kept as is\n",
        },
    )
    tests = suite.read_wheel_tests(wheel)
    assert set(tests) == {"__init__.py", "transforms/test_x.py", "data.txt"}
    suite.write_suite(tests, tmp_path / "run", _PRIVATE)
    package = tmp_path / "run" / "reference_tests"
    written = {p.relative_to(package).as_posix() for p in package.rglob("*.*")}
    assert written == {
        "__init__.py",
        "_absent.py",
        "data.txt",
        "transforms/test_x.py",
    }
    assert (package / "transforms/test_x.py").read_text() == _OURS
    assert (tmp_path / "run" / "pytest.ini").read_text() == "[pytest]\n"


def test_a_private_name_imports_but_fails_when_used(tmp_path: Path) -> None:
    suite.write_suite({"__init__.py": ""}, tmp_path, {})
    path = tmp_path / "reference_tests" / "_absent.py"
    spec = importlib.util.spec_from_file_location("_absent", path)
    assert spec is not None and spec.loader is not None
    stub = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stub)
    validate = stub._validate  # as `from ._absent import _validate` gets it
    with pytest.raises(NotImplementedError, match="_validate is private to unit-sc"):
        validate(1, b=2)


def test_the_cached_wheel_is_reused_without_pip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel = _fake_wheel(tmp_path / suite.WHEEL_NAME, {"a": "b"})
    monkeypatch.setattr(suite, "WHEEL_SHA256", suite._sha256(wheel))

    def no_pip(*args: object, **kwargs: object) -> None:
        raise AssertionError("pip was run although the wheel is cached")

    monkeypatch.setattr(subprocess, "run", no_pip)
    assert suite.fetch_wheel(tmp_path) == wheel


def test_a_wheel_neither_cached_nor_downloaded_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def offline(
        command: list[str], **kwargs: object
    ) -> subprocess.CompletedProcess[str]:
        assert command[1:5] == ["-m", "pip", "download", "--no-deps"]
        assert command[-1] == "unit-scaling==0.3.5"
        return subprocess.CompletedProcess(command, 1, "", "Network is unreachable")

    monkeypatch.setattr(subprocess, "run", offline)
    with pytest.raises(suite.ReferenceSuiteError) as error:
        suite.fetch_wheel(tmp_path / "cache")
    assert "is not in" in str(error.value)
    assert "Network is unreachable" in str(error.value)
    assert "--wheel PATH" in str(error.value)


def test_a_cached_wheel_with_another_hash_is_refused(tmp_path: Path) -> None:
    _fake_wheel(tmp_path / suite.WHEEL_NAME, {"a": "b"})
    with pytest.raises(suite.ReferenceSuiteError, match="SHA-256"):
        suite.fetch_wheel(tmp_path)


def test_the_cache_is_outside_the_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", "/somewhere")
    assert suite.cache_dir() == Path("/somewhere/torch-unit-scaling/reference")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert suite.cache_dir() == Path.home() / ".cache/torch-unit-scaling/reference"


# --------------------------------------------------------------------------- #
# The exclusion list.
# --------------------------------------------------------------------------- #


def test_the_exclusion_list_is_well_formed() -> None:
    suite.check_exclusions(EXCLUDED)
    assert set(PRIVATE) == {"unit_scaling.docs", "unit_scaling.analysis"}


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (Exclusion("test_docs.py", "needs network", f"{PAGE}#a", ""), "one by one"),
        (Exclusion("t.py::t", "flaky", f"{PAGE}#a", ""), "reason"),  # type: ignore[arg-type]
        (Exclusion("t.py::t", "needs network", "README.md#a", ""), "link"),
        (Exclusion("t.py::t", "needs network", f"{PAGE}#", ""), "link"),
    ],
    ids=["whole file", "unknown reason", "other page", "no anchor"],
)
def test_bad_exclusions_are_refused(entry: Exclusion, message: str) -> None:
    with pytest.raises(suite.ReferenceSuiteError, match=message):
        suite.check_exclusions([entry])
    with pytest.raises(suite.ReferenceSuiteError, match="more than once"):
        suite.check_exclusions([EXCLUDED[0], EXCLUDED[0]])


def test_every_exclusion_links_to_a_section_of_the_page() -> None:
    markdown = pytest.importorskip("markdown")
    page = markdown.Markdown(extensions=["toc"])
    page.convert((ROOT / PAGE).read_text(encoding="utf-8"))
    anchors = {token["id"] for token in _flatten(page.toc_tokens)}
    for entry in EXCLUDED:
        assert entry.see.split("#", 1)[1] in anchors, (entry.test, sorted(anchors))


def _flatten(tokens: list[dict[str, object]]) -> list[dict[str, object]]:
    found = []
    for token in tokens:
        found.append(token)
        found += _flatten(token["children"])  # type: ignore[arg-type]
    return found


_FAKE_SUITE = """\
def test_passes():
    pass

def test_fails():
    assert False
"""


def _run(root: Path, excluded: list[str]) -> subprocess.CompletedProcess[str]:
    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from tools.reference_suite import run_suite
        from tools.reference_exclusions import Exclusion
        excluded = [Exclusion(t, "needs network", "", "") for t in {excluded!r}]
        sys.exit(run_suite(Path({str(root)!r}), excluded, ["-q"]))
    """)
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip


def test_listed_tests_are_deselected_and_stale_ones_fail(tmp_path: Path) -> None:
    suite.write_suite({"__init__.py": "", "test_a.py": _FAKE_SUITE}, tmp_path, {})
    failing = _run(tmp_path, [])
    assert failing.returncode == 1, failing.stdout
    assert "1 failed, 1 passed" in failing.stdout
    passing = _run(tmp_path, ["test_a.py::test_fails"])
    assert passing.returncode == 0, passing.stdout + passing.stderr
    assert "core       1 excluded, 1 passed" in passing.stdout
    stale = _run(tmp_path, ["test_a.py::test_fails", "test_a.py::test_gone"])
    assert stale.returncode == 1
    assert "no longer has" in stale.stderr and "test_a.py::test_gone" in stale.stderr
