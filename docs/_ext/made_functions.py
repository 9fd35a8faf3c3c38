"""A griffe extension for the API reference (``make docs``): documents the public
functions that a module makes at import time rather than with ``def``.

``unit_scaling.functional`` makes its per-dimension ops from one rule each
(``conv2d = for_dims(_conv, 2, ...)``). Read statically, such a name is an
attribute with no docstring; this extension imports its module and puts the
function it finds there (signature and docstring) in the attribute's place.
"""

from __future__ import annotations

from typing import Any

import griffe
from griffe import Attribute, Extension, Module

# The calls that make a module-level function.
_MAKERS = ("for_dims(",)


class MadeFunctions(Extension):
    """Replaces each attribute made by one of :data:`_MAKERS` with its function."""

    def on_module_members(self, *, mod: Module, agent: Any, **kwargs: Any) -> None:
        made = [
            name
            for name, member in mod.members.items()
            if isinstance(member, Attribute)
            and str(member.value).startswith(_MAKERS)
        ]
        if not made:
            return
        inspected = griffe.inspect(
            mod.path,
            extensions=agent.extensions,
            docstring_parser=agent.docstring_parser,
            docstring_options=agent.docstring_options,
        )
        for name in made:
            function = inspected.members[name]
            function.lineno = mod.members[name].lineno
            function.endlineno = mod.members[name].endlineno
            mod.set_member(name, function)
