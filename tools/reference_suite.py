"""Run the test suite of Graphcore's ``unit-scaling`` 0.3.5 against this package.

We replace that library under the same import name, so its own tests are the
most literal check of the contract a user who switches relies on. This script
(``make test-reference``):

1. fetches the ``unit-scaling==0.3.5`` wheel, without its dependencies, into a
   cache outside the repository (``$XDG_CACHE_HOME/torch-unit-scaling/reference``,
   by default ``~/.cache/...``) and checks its SHA-256. The wheel is never
   installed: it would shadow this package.
2. extracts only ``unit_scaling/tests/`` into a temporary directory, as the
   package ``reference_tests`` (a name that cannot shadow ours), and rewrites
   their relative imports of the library to its public paths in this package
   (``from ..functional import gelu`` becomes ``from unit_scaling.functional
   import gelu``). Names that only exist in that library's private modules are
   imported from a stub that raises when used; the tests that use them are on
   the exclusion list.
3. checks that every rewritten file differs from the wheel's only in import
   statements, and that those bind the same names.
4. runs pytest on them with this package, deselecting the tests listed, one by
   one, in ``tools/reference_exclusions.py`` (each with its reason and the
   section of ``docs/from-unit-scaling.md`` that explains it). A listed test
   that no longer exists fails the run, as does any failure.

Usage::

    python -m tools.reference_suite [--wheel PATH] [--all] [pytest arguments...]
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import get_args

import pytest

from .reference_exclusions import EXCLUDED, PAGE, PRIVATE, Exclusion, Reason

REQUIREMENT = "unit-scaling==0.3.5"
WHEEL_NAME = "unit_scaling-0.3.5-py3-none-any.whl"
# The wheel on PyPI; a different file (a corrupt download, a re-upload) stops the run.
WHEEL_SHA256 = "53c270afb1e8bf804a39612b544dafedf1065b0cbf79820296d843392bcfac2c"
WHEEL_TESTS = "unit_scaling/tests/"
THEIR_TESTS = "unit_scaling.tests"
PACKAGE = "reference_tests"
STUB_MODULE = f"{PACKAGE}._absent"
# Copied into the suite as STUB_MODULE.
STUB_SOURCE = Path(__file__).with_name("reference_stub.py")
REASONS: tuple[Reason, ...] = get_args(Reason)

# Their private modules whose contents this package exports from a public path.
PUBLIC_PATHS = {"unit_scaling._modules": "unit_scaling"}


class ReferenceSuiteError(RuntimeError):
    """The reference suite could not be prepared or did not pass."""


def check_exclusions(excluded: Sequence[Exclusion]) -> None:
    """Check the form of the exclusion list (the tests' existence is checked when
    the suite is collected, the sections' by ``tests/test_reference_suite.py``).

    Raises:
        ReferenceSuiteError: an entry that is not one test, an unknown reason, a
            link that is not to a section of the page, or a test listed twice.
    """
    for entry in excluded:
        if "::" not in entry.test or entry.test.endswith((".py", "::")):
            raise ReferenceSuiteError(
                f"exclude tests one by one ('file.py::test'), not {entry.test!r}"
            )
        if entry.reason not in REASONS:
            raise ReferenceSuiteError(
                f"{entry.test}: the reason must be one of {REASONS}, not "
                f"{entry.reason!r}"
            )
        if not entry.see.startswith(f"{PAGE}#") or entry.see == f"{PAGE}#":
            raise ReferenceSuiteError(
                f"{entry.test}: link to the section of {PAGE} that explains it "
                f"('{PAGE}#anchor'), not {entry.see!r}"
            )
    twice = sorted(t for t, n in Counter(e.test for e in excluded).items() if n > 1)
    if twice:
        raise ReferenceSuiteError(f"excluded more than once: {twice}")


def cache_dir() -> Path:
    """Where the reference wheel is kept: outside the repository, reused."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "torch-unit-scaling" / "reference"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch_wheel(cache: Path) -> Path:
    """The reference wheel: from ``cache`` if there, else downloaded into it.

    Raises:
        ReferenceSuiteError: it can be neither found nor downloaded, or it is
            not the wheel published on PyPI (its SHA-256 differs).
    """
    wheel = cache / WHEEL_NAME
    if not wheel.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps",
            "--only-binary=:all:", "--disable-pip-version-check", "--quiet",
            "--dest", str(cache), REQUIREMENT,
        ]  # fmt: skip
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, check=False, timeout=300
            )
            failure = done.stderr.strip() if done.returncode else ""
        except subprocess.TimeoutExpired:
            failure = "no answer in 300 s"
        if failure or not wheel.is_file():
            last_lines = "\n".join(failure.splitlines()[-3:]) or "no such file"
            raise ReferenceSuiteError(
                f"the reference wheel {WHEEL_NAME} is not in {cache} and could not "
                f"be downloaded (pip download {REQUIREMENT}: {last_lines}). Download"
                f" it where there is a network and put it in {cache}, or pass "
                "--wheel PATH."
            )
    digest = _sha256(wheel)
    if digest != WHEEL_SHA256:
        raise ReferenceSuiteError(
            f"{wheel} has SHA-256 {digest}, not {WHEEL_SHA256} (the wheel on PyPI):"
            " delete it to download it again"
        )
    return wheel


def read_wheel_tests(wheel: Path) -> dict[str, str]:
    """The wheel's test files, by path relative to their ``tests/`` folder."""
    with zipfile.ZipFile(wheel) as archive:
        return {
            name.removeprefix(WHEEL_TESTS): archive.read(name).decode("utf-8")
            for name in archive.namelist()
            if name.startswith(WHEEL_TESTS) and not name.endswith("/")
        }


def _their_package(relative_path: str) -> str:
    """The package a test file lives in, in that library's layout."""
    parts = [THEIR_TESTS, *Path(relative_path).parent.parts]
    return ".".join(parts)


def _alias(name: str, asname: str | None) -> str:
    return name if asname is None else f"{name} as {asname}"


def _rewrite_import(
    node: ast.ImportFrom, package: str, private: Mapping[str, frozenset[str] | None]
) -> str | None:
    """The absolute import statements that replace ``node``; ``None``: keep it."""
    relative = "." * node.level + (node.module or "")
    target = importlib.util.resolve_name(relative, package)
    if target == THEIR_TESTS or target.startswith(f"{THEIR_TESTS}."):
        return None  # among their test files: stays relative in reference_tests
    theirs_only = private.get(target, frozenset())
    ours, absent, modules = [], [], []
    for alias in node.names:
        submodule = PUBLIC_PATHS.get(f"{target}.{alias.name}")
        if submodule is not None:  # `from .. import _modules as uu`
            modules.append(f"import {submodule} as {alias.asname or alias.name}")
        elif theirs_only is None or alias.name in theirs_only:
            absent.append(_alias(alias.name, alias.asname))
        else:
            ours.append(_alias(alias.name, alias.asname))
    statements = modules
    if ours:
        statements.append(
            f"from {PUBLIC_PATHS.get(target, target)} import {', '.join(ours)}"
        )
    if absent:
        statements.append(f"from {STUB_MODULE} import {', '.join(absent)}")
    return "; ".join(statements)


def rewrite_imports(
    source: str,
    relative_path: str,
    private: Mapping[str, frozenset[str] | None],
) -> str:
    """Point a test file's relative imports of the library to our public paths.

    Imports among their test files (``from .helper import ...``) stay relative.
    A statement whose module path alone changes keeps its layout (so line
    numbers in tracebacks match the wheel's); one that is split keeps its
    first line.

    Args:
        source: the file as the wheel has it.
        relative_path: its path under their ``tests/`` folder.
        private: their modules' names this package does not have (as
            ``reference_exclusions.PRIVATE``); imported from a stub instead.
    """
    lines = source.splitlines(keepends=True)
    package = _their_package(relative_path)
    imports = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom)]
    for node in sorted(imports, key=lambda n: n.lineno, reverse=True):
        if node.level == 0:
            continue
        new = _rewrite_import(node, package, private)
        if new is None:
            continue
        first, last = node.lineno - 1, (node.end_lineno or node.lineno) - 1
        indent = lines[first][: node.col_offset]
        head = "from " + "." * node.level + (node.module or "") + " import "
        start = lines[first][node.col_offset :]
        simple = new.startswith("from ") and ";" not in new and start.startswith(head)
        if simple:  # only the module path changes: keep the names as written
            new_head = new[: new.index(" import ") + len(" import ")]
            lines[first] = indent + new_head + start[len(head) :]
        else:
            lines[first : last + 1] = [indent + new + "\n"]
    return "".join(lines)


def _import_spans(tree: ast.AST) -> set[int]:
    """Line numbers (1-based) of every import statement in ``tree``."""
    spans: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            spans.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return spans


def _bound_names(tree: ast.AST) -> Counter[str]:
    """The names that the import statements of ``tree`` bind, counted."""
    names: Counter[str] = Counter()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] += 1
    return names


def check_only_imports_differ(original: str, rewritten: str, name: str) -> None:
    """Fail unless ``rewritten`` is ``original`` with other import statements.

    The lines outside import statements must be identical, in order, and the
    import statements must bind the same names, as many times.

    Raises:
        ReferenceSuiteError: naming the file and the first differing line.
    """
    before, after = ast.parse(original), ast.parse(rewritten)
    spans = _import_spans(before)
    for node in ast.walk(before):
        if (
            isinstance(node, ast.stmt)
            and not isinstance(node, ast.Import | ast.ImportFrom)
            and node.lineno in spans
        ):
            raise ReferenceSuiteError(
                f"{name}:{node.lineno}: an import shares its line with other code;"
                " the rewrite cannot be checked"
            )
    kept_before = [
        (n, line) for n, line in enumerate(original.splitlines(), 1) if n not in spans
    ]
    after_spans = _import_spans(after)
    kept_after = [
        line for n, line in enumerate(rewritten.splitlines(), 1) if n not in after_spans
    ]
    for (number, line), other in zip(kept_before, kept_after, strict=False):
        if line != other:
            raise ReferenceSuiteError(
                f"{name}:{number}: the rewritten file differs from the wheel's outside"
                f" its imports: {line!r} became {other!r}"
            )
    if len(kept_before) != len(kept_after):
        raise ReferenceSuiteError(
            f"{name}: the rewritten file has {len(kept_after)} lines outside its "
            f"imports, the wheel's {len(kept_before)}"
        )
    if _bound_names(before) != _bound_names(after):
        raise ReferenceSuiteError(
            f"{name}: the rewritten imports bind {sorted(_bound_names(after))}, the"
            f" wheel's {sorted(_bound_names(before))}"
        )


def write_suite(
    tests: Mapping[str, str], root: Path, private: Mapping[str, frozenset[str] | None]
) -> None:
    """Write the rewritten, checked test files under ``root/reference_tests``."""
    package = root / PACKAGE
    for relative_path, source in sorted(tests.items()):
        out = package / relative_path
        out.parent.mkdir(parents=True, exist_ok=True)
        if relative_path.endswith(".py"):
            rewritten = rewrite_imports(source, relative_path, private)
            check_only_imports_differ(source, rewritten, relative_path)
            source = rewritten
        out.write_text(source, encoding="utf-8")
    shutil.copyfile(STUB_SOURCE, package / f"{STUB_MODULE.rsplit('.', 1)[1]}.py")
    # An empty configuration: this repository's pytest settings do not apply.
    (root / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")


def _group(test: str) -> str:
    """The part of the suite a test belongs to, as the summary counts them."""
    if test.startswith("transforms/"):
        return "transforms"
    if test.startswith(("test_utils.py", "test_analysis.py", "test_docs.py")):
        return test.removeprefix("test_").split(".")[0]
    return "core"


class _Exclude:
    """pytest plugin: deselects the listed tests and counts outcomes per group."""

    def __init__(self, tests: Iterable[str]) -> None:
        self.listed = set(tests)
        self.missing: set[str] = set()
        self.counts: dict[str, Counter[str]] = {}

    def _id(self, nodeid: str) -> str:
        return nodeid.removeprefix(f"{PACKAGE}/")

    @pytest.hookimpl(tryfirst=True)  # before -k and -m deselect any
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        kept: list[pytest.Item] = []
        dropped: list[pytest.Item] = []
        for item in items:
            (dropped if self._id(item.nodeid) in self.listed else kept).append(item)
        self.missing = self.listed - {self._id(item.nodeid) for item in items}
        for item in dropped:
            self._count(self._id(item.nodeid), "excluded")
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" or (report.when == "setup" and not report.passed):
            self._count(self._id(report.nodeid), report.outcome)

    def _count(self, test: str, outcome: str) -> None:
        self.counts.setdefault(_group(test), Counter())[outcome] += 1


def run_suite(
    root: Path, excluded: Sequence[Exclusion], pytest_args: Sequence[str]
) -> int:
    """Run the written suite; the exit status (0: passed, nothing stale)."""
    plugin = _Exclude(e.test for e in excluded)
    args = [
        str(root / PACKAGE), "-c", str(root / "pytest.ini"), "--rootdir", str(root),
        "-p", "no:cacheprovider", "-p", "no:xdist", "-q", *pytest_args,
    ]  # fmt: skip
    status = int(pytest.main(args, plugins=[plugin]))
    print("\nreference suite (unit-scaling 0.3.5), per part:")
    for group, counts in sorted(plugin.counts.items()):
        print(
            f"  {group:<10} " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
        )
    if plugin.missing:
        print(
            "tools/reference_exclusions.py lists tests that the suite no longer "
            "has (remove them):"
            + "".join(f"\n  {test}" for test in sorted(plugin.missing)),
            file=sys.stderr,
        )
        return status or 1
    return status


def main(argv: Sequence[str] | None = None) -> int:
    """Fetch, rewrite, check and run the reference suite; the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, help=f"a local {WHEEL_NAME} to use")
    parser.add_argument(
        "--all",
        action="store_true",
        help="run the excluded tests too (to see which exclusions still fail)",
    )
    options, pytest_args = parser.parse_known_args(argv)
    try:
        check_exclusions(EXCLUDED)
        if options.wheel is None:
            wheel = fetch_wheel(cache_dir())
        elif not options.wheel.is_file() or _sha256(options.wheel) != WHEEL_SHA256:
            raise ReferenceSuiteError(f"{options.wheel} is not {WHEEL_NAME} from PyPI")
        else:
            wheel = options.wheel
        root = Path(tempfile.mkdtemp(prefix="reference-suite-"))
        try:
            write_suite(read_wheel_tests(wheel), root, PRIVATE)
            return run_suite(root, () if options.all else EXCLUDED, pytest_args)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    except ReferenceSuiteError as error:
        print(f"make test-reference: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
