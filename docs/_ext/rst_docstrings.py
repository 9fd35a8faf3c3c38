"""A griffe extension for the API reference (``make docs``): turns the
reStructuredText in our docstrings into the Markdown that mkdocstrings renders.

The docstrings are Google style with some reStructuredText, also read by
``help()`` and the doctests, so they are not edited for the site. Before
mkdocstrings parses a docstring, this rewrites, in the text only:

- roles (``:func:`x```, ``:class:`~a.B```, ...) into code spans (``~`` keeps the
  last name, as in Sphinx);
- ``:math:`x``` into inline math, and ``.. math::`` directives into math blocks
  (rendered by MathJax; ``pymdownx.arithmatex`` in ``mkdocs.yml``);
- literal blocks (a paragraph ending in ``::``, then an indented block) into
  fenced code blocks: ``pycon`` for doctests, ``bash`` for shell commands,
  ``python`` otherwise.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension, Object

_ROLE = re.compile(r":(?:py:)?(?:func|class|data|mod|meth|attr|exc|obj):`(~?)([^`]+)`")
_MATH_ROLE = re.compile(r":math:`([^`]+)`")
_MATH_DIRECTIVE = re.compile(r"^(\s*)\.\. math::\s*(.*)$")
# A line that griffe's Google parser could take for a section title.
_SECTION_LIKE = re.compile(r"^\s*\w[\w\s]*:\s*$")
_SHELL = ("python ", ".venv/", "unit-scaling ", "torchrun ", "make ", "pip ", "$ ")


def _role(match: re.Match[str]) -> str:
    short, target = match.groups()
    if short:
        target = target.rsplit(".", 1)[-1]
    return f"`{target}`"


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _block(lines: list[str], start: int, base: int) -> tuple[list[str], int]:
    """The lines indented deeper than ``base`` from ``start`` (blank lines inside
    kept, trailing ones dropped), and the index after them."""
    end = start
    while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) > base):
        end += 1
    block = lines[start:end]
    while block and not block[-1].strip():
        block.pop()
        end -= 1
    return block, end


def _dedent(block: list[str]) -> list[str]:
    depth = min(_indent(line) for line in block if line.strip())
    return [line[depth:] if line.strip() else "" for line in block]


def _language(block: list[str]) -> str:
    code = [line for line in block if line.strip()]
    if any(line.startswith(">>>") for line in code):
        return "pycon"
    if all(line.startswith(_SHELL) for line in code):
        return "bash"
    return "python"


def convert(text: str) -> str:
    """The Markdown for one docstring's text."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        directive = _MATH_DIRECTIVE.match(line)
        if directive:
            pad, inline = directive.groups()
            block, i = _block(lines, i + 1, _indent(line))
            body = ([inline] if inline else []) + [
                row.strip() for row in block if row.strip()
            ]
            if out and out[-1].strip():
                out.append("")
            out += [f"{pad}$$", *(pad + row for row in body), f"{pad}$$", ""]
            continue
        stripped = line.rstrip()
        if stripped.endswith("::") and i + 1 < len(lines) and not lines[i + 1].strip():
            block, end = _block(lines, i + 1, _indent(line))
            if block and any(row.strip() for row in block):
                pad = " " * _indent(line)
                intro = stripped[:-1]
                if _SECTION_LIKE.match(intro):
                    intro = f"{pad}**{intro.strip()[:-1]}:**"
                if intro.strip() != ":":
                    out.append(intro)
                code = _dedent(block)
                while code and not code[0].strip():
                    code.pop(0)
                out += ["", f"{pad}```{_language(code)}"]
                out += [pad + row if row else "" for row in code]
                out += [f"{pad}```", ""]
                i = end
                continue
        out.append(line)
        i += 1
    result = "\n".join(out)
    result = _MATH_ROLE.sub(lambda m: f"${m.group(1).strip()}$", result)
    return _ROLE.sub(_role, result)


class RstDocstrings(Extension):
    """Rewrites every docstring with :func:`convert` as griffe loads it."""

    def on_instance(self, *, obj: Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = convert(obj.docstring.value)
