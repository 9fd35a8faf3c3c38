"""Names private to ``unit-scaling`` 0.3.5 that this package does not have.

``tools/reference_suite.py`` copies this file into the reference suite and
imports such names from it, so that a test file that imports one still runs its
other tests. The tests that use one are on the exclusion list
(``tools/reference_exclusions.py``); a test that uses one anyway fails, saying so.
"""

from __future__ import annotations


class _Absent:
    """Stands for one absent name: fails whatever calls it."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: object, **kwargs: object) -> None:
        raise NotImplementedError(
            f"{self._name} is private to unit-scaling 0.3.5 and has no counterpart"
            " in this package: exclude the test in tools/reference_exclusions.py"
        )


def __getattr__(name: str) -> _Absent:
    return _Absent(name)
