"""The Python blocks of the README, the home page and the user guide run as
written, in order.

Each page's runnable blocks go, in order and at their own line numbers (every
other line left blank, so a traceback's line number is the page's), into one
script named after the page. A fresh interpreter runs it in a temporary
directory, as a user who copied the blocks into a file would:
``if __name__ == "__main__":`` and worker processes behave as they would for
them. ``bash``, ``text`` and other blocks are not run.

A block's first line may carry a marker, which must give its reason:

- ``# doc-test: skip (<reason>)``: not run, because it needs ``torchrun``, a
  GPU, the network or minutes of compute. It is compiled (its syntax checked),
  then reported as skipped with its reason.
- ``# doc-test: own-process (<reason>)``: run alone, as its own script in its
  own directory. For a block that starts worker processes: each imports the
  script that holds the block, so inside the page's script every worker would
  run the whole page again.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import unit_scaling

ROOT = Path(__file__).resolve().parents[1]
# The pages and the fewest blocks each must run, so that skipping cannot make
# the test pass by running nothing.
MIN_RUNNABLE = {
    "README.md": 6,
    "docs/index.md": 3,
    "docs/guide.md": 10,
    "docs/monitoring.md": 2,
}
KINDS = ("skip", "own-process")
_FENCE = re.compile(r"^```(\S*)\s*$")
_MARKER = re.compile(r"^# doc-test: (?P<kind>\S+) \((?P<reason>[^()]*\S[^()]*)\)$")
# The page's imports resolve to the package under test, offline.
_ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(
        [str(Path(unit_scaling.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
    ),
    "HF_HUB_OFFLINE": "1",
    "MPLBACKEND": "Agg",
}


@dataclass(frozen=True)
class Block:
    """A fenced ``python`` block of a page: ``line`` is its first code line."""

    page: str
    line: int
    code: str
    kind: str = "run"
    reason: str = ""

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def python_blocks(page: str, text: str) -> list[Block]:
    """The ``python`` blocks of ``text`` (the page ``page``), in order, each
    with the marker of its first line.

    Raises:
        ValueError: a marker that is malformed, of an unknown kind, without a
            reason, or on any line but a block's first; an unclosed block.
    """
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        i += 1
        if fence is None:
            continue
        start = i
        while i < len(lines) and lines[i] != "```":
            i += 1
        if i == len(lines):
            raise ValueError(f"{page}:{start}: the block opened here is not closed")
        body = lines[start:i]
        i += 1
        if fence.group(1) != "python":
            continue
        blocks.append(_block(page, start + 1, body))
    return blocks


def _block(page: str, line: int, body: list[str]) -> Block:
    for offset, text in enumerate(body[1:], start=1):
        if "doc-test" in text:
            raise ValueError(
                f"{page}:{line + offset}: a doc-test marker must be the block's "
                "first line"
            )
    code = "\n".join(body) + "\n"
    first = body[0] if body else ""
    if "doc-test" not in first:
        return Block(page, line, code)
    marker = _MARKER.match(first)
    if marker is None or marker["kind"] not in KINDS:
        raise ValueError(
            f"{page}:{line}: malformed marker {first!r}; write "
            f"'# doc-test: <kind> (<reason>)' with a kind of {KINDS} and a reason"
        )
    return Block(page, line, code, marker["kind"], marker["reason"].strip())


def _page_blocks(page: str) -> list[Block]:
    return python_blocks(page, (ROOT / page).read_text(encoding="utf-8"))


BLOCKS = {page: _page_blocks(page) for page in MIN_RUNNABLE}
SKIPPED = [b for blocks in BLOCKS.values() for b in blocks if b.kind == "skip"]
OWN_PROCESS = [
    b for blocks in BLOCKS.values() for b in blocks if b.kind == "own-process"
]


def _script(blocks: list[Block]) -> str:
    """The blocks at their own line numbers, every other line blank."""
    lines: list[str] = []
    for block in blocks:
        lines += [""] * (block.line - 1 - len(lines))
        lines += block.code.splitlines()
    return "\n".join(lines) + "\n"


def _run(blocks: list[Block], name: str, tmp_path: Path) -> None:
    """Run ``blocks`` as one script ``name`` in a fresh interpreter, in an
    empty working directory; fail with the script's output if it fails."""
    # The script alone in its folder: nothing the blocks write (a folder
    # named `export`, say) lands on the import path.
    script = tmp_path / "script" / name
    work = tmp_path / "work"
    script.parent.mkdir()
    work.mkdir()
    script.write_text(_script(blocks), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=work,
        env=_ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, (
        f"{name} (the blocks of {blocks[0].page}, at the page's line numbers) "
        f"exited with {done.returncode}\n--- stdout (end) ---\n"
        f"{done.stdout[-3000:]}\n--- stderr (end) ---\n{done.stderr[-6000:]}"
    )


@pytest.mark.parametrize("page", list(MIN_RUNNABLE))
def test_page_runs_as_written(page: str, tmp_path: Path) -> None:
    runnable = [b for b in BLOCKS[page] if b.kind == "run"]
    assert len(runnable) >= MIN_RUNNABLE[page], (
        f"{page} runs {len(runnable)} blocks, fewer than {MIN_RUNNABLE[page]}: "
        "a block was skipped or removed"
    )
    _run(runnable, f"{Path(page).stem}.py", tmp_path)


@pytest.mark.parametrize("block", OWN_PROCESS, ids=lambda b: b.where)
def test_own_process_block_runs_as_written(block: Block, tmp_path: Path) -> None:
    _run([block], f"{Path(block.page).stem}_{block.line}.py", tmp_path)


@pytest.mark.parametrize("block", SKIPPED, ids=lambda b: b.where)
def test_skipped_block_compiles(block: Block) -> None:
    # at its own line number, so a syntax error points into the page
    compile("\n" * (block.line - 1) + block.code, block.page, "exec")
    pytest.skip(f"{block.where}: {block.reason}")


def test_every_marker_is_known_and_gives_a_reason() -> None:
    # the pages parsed at import; the rules, on made-up pages
    assert sum(len(b) for b in BLOCKS.values()) >= sum(MIN_RUNNABLE.values())
    good = "```python\n# doc-test: skip (needs torchrun)\nx = 1\n```\n"
    (block,) = python_blocks("page.md", good)
    assert (block.kind, block.reason, block.line) == ("skip", "needs torchrun", 2)
    for first in (
        "# doc-test: skip",
        "# doc-test: skip ()",
        "# doc-test: skip (  )",
        "# doc-test: skipped (needs a GPU)",
        "#doc-test: skip (needs a GPU)",
    ):
        with pytest.raises(ValueError, match=r"page\.md:2: malformed marker"):
            python_blocks("page.md", f"```python\n{first}\nx = 1\n```\n")
    late = "```python\nx = 1\n# doc-test: skip (needs a GPU)\n```\n"
    with pytest.raises(ValueError, match=r"page\.md:3: .* first line"):
        python_blocks("page.md", late)
    with pytest.raises(ValueError, match="not closed"):
        python_blocks("page.md", "```python\nx = 1\n")
    # other languages are not read, markers and all
    assert python_blocks("page.md", "```bash\n# doc-test: no\n```\n") == []


def test_scripts_keep_the_pages_line_numbers() -> None:
    text = "intro\n```python\na = 1\n```\nprose\n\n```python\nb = a\n```\n"
    blocks = python_blocks("page.md", text)
    assert [b.line for b in blocks] == [3, 8]
    lines = _script(blocks).splitlines()
    assert (lines[2], lines[7]) == ("a = 1", "b = a")
    assert all(line == "" for i, line in enumerate(lines) if i not in (2, 7))
