"""The default run's share of a module's end-to-end checks.

A test module whose cases each cost seconds (whole ``Trainer`` runs, the batch
law over zoo models, every count type on every model) may list in
``DEFAULT_RUN`` the test ids (``name[params]``) that stay in the default run:
one case of each claim. Its other tests are marked ``integration``, which
``make test-integration`` (and CI, after the default suite) runs, so the
default run stays within its ten minutes on two cores and nothing goes
unchecked.
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(tryfirst=True)  # before -m selects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        chosen = getattr(item.module, "DEFAULT_RUN", None)
        if chosen is not None and item.name not in chosen:
            item.add_marker(pytest.mark.integration)
