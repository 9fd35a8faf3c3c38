"""Integrations with other tools' training loops, one module per tool.

- :mod:`unit_scaling.integrations.hf`: Hugging Face ``Trainer``
  (``UnitScalingTrainer``, or ``UnitScalingMixin`` for a ``Trainer`` subclass).
- :mod:`unit_scaling.integrations.accelerate`: an ``accelerate.Accelerator`` for
  unit-scaled models.

Each imports its tool when imported itself, and says which extra to install
when the tool is missing; nothing else in ``unit_scaling`` imports them. The
rules they apply live in the core: a step's gradient in
:mod:`unit_scaling.functional.steps`, the data-parallel reduction in
:mod:`unit_scaling.parallel`, u-μP's learning rates in :mod:`unit_scaling.optim`.
"""
