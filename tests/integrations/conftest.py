"""Whole ``Trainer`` and Accelerate runs cost seconds each, so most of this
folder is marked ``integration`` (``make test-integration``; CI runs it after
the default suite). One case of each target stays in the default run, and so do
the checks that train nothing."""

from __future__ import annotations

import pytest

DEFAULT_RUN = {
    # a stock Trainer's gradients are unit-scaled; the integration accumulates
    "test_trainer.py::test_a_stock_trainer_trains_with_unit_scaled_gradients[llama-float]",
    "test_trainer.py::test_the_integration_accumulates_to_the_whole_batch[2-with-count]",
    "test_trainer.py::test_the_integration_builds_u_mup_optimizers",
    "test_trainer.py::test_the_integration_rejects_what_it_cannot_honour",
    # an Accelerate loop accumulates; the helpers that train nothing
    "test_accelerate.py::test_an_accelerate_loop_accumulates_to_the_whole_batch[2-mean]",
    "test_accelerate.py::test_a_plain_model_keeps_accelerates_mean",
    "test_accelerate.py::test_a_loss_carries_its_share_of_the_step",
    "test_accelerate.py::test_clip_grad_rms_bounds_the_rms",
}


@pytest.hookimpl(tryfirst=True)  # before -m selects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        here = item.nodeid.split("tests/integrations/")[-1]
        if "tests/integrations/" in item.nodeid and here not in DEFAULT_RUN:
            item.add_marker(pytest.mark.integration)
