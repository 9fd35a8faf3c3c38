"""The scale monitor in a Hugging Face ``Trainer``: :class:`MonitorCallback`
(exported by :mod:`unit_scaling.integrations.hf`)."""

from __future__ import annotations

import inspect
import logging
from typing import Any

import transformers
from transformers.trainer_callback import CallbackHandler

from ..monitor import Monitor

__all__ = ["MonitorCallback", "add_monitor"]

logger = logging.getLogger(__name__)


class MonitorCallback(transformers.TrainerCallback):
    """Attaches a :class:`~unit_scaling.monitor.Monitor` to ``Trainer``'s model
    and optimizer when training begins, and puts each record into ``Trainer``'s
    logs, so that every reporter of ``report_to`` (TensorBoard, W&B, trackio,
    MLflow...) receives the tags ``scales/<tensor>/<kind>/<statistic>`` at the
    record's step, numbered as ``Trainer`` numbers steps (the first is 1; a
    record at each multiple of ``every``). TensorBoard's reporter prefixes the
    tags with ``train/``.

    ``Trainer`` runs its reporters before the callbacks a user adds, and a
    reporter never sees what a later callback adds to the logs: this callback
    moves itself ahead of them when training begins (or use :func:`add_monitor`).
    It asks ``Trainer`` to log at each recording step.

    Args:
        every: record every ``every`` optimizer steps; default: the
            arguments' ``logging_steps``.
        **monitor_kwargs: the other arguments of :class:`Monitor` (``kinds``,
            ``alerts``, ``aggregate``, ``max_tensors``...).

    Example::

        >>> callback = MonitorCallback(every=50, max_tensors=20)
        >>> callback.monitor is None  # made when training begins
        True
    """

    def __init__(self, every: int | None = None, **monitor_kwargs: Any) -> None:
        for name in ("model", "optimizer", "loggers", "start_step"):
            if name in monitor_kwargs:
                raise TypeError(
                    f"MonitorCallback: {name} is set by the Trainer; pass the "
                    "Monitor's other arguments"
                )
        self.every = every
        self.monitor_kwargs = monitor_kwargs
        self.monitor: Monitor | None = None
        self._pending: dict[str, float] = {}

    def _keep(self, step: int, scalars: Any) -> None:
        self._pending.update(scalars)

    def on_train_begin(
        self,
        args: Any,
        state: Any,
        control: Any,
        model: Any = None,
        optimizer: Any = None,
        **kwargs: Any,
    ) -> None:
        if self.monitor is not None:
            self.monitor.remove()
        _move_ahead_of_reporters(self)
        self.monitor = Monitor(
            model,
            every=self.every or max(int(args.logging_steps), 1),
            optimizer=getattr(optimizer, "optimizer", optimizer),
            loggers=[self._keep],
            # (numbered as Trainer numbers them: the first step is 1)
            start_step=state.global_step + 1,
            **self.monitor_kwargs,
        )

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._pending:
            control.should_log = True

    def on_log(
        self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any
    ) -> None:
        if self._pending and logs is not None:
            logs.update(self._pending)
            self._pending = {}

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.monitor is not None:
            self.monitor.remove()


def _move_ahead_of_reporters(callback: MonitorCallback) -> None:
    """Put ``callback`` first in the ``CallbackHandler`` calling it (found on
    the stack: a callback is not given its handler). Safe while the handler
    iterates: the callbacks after this one keep their places."""
    frame = inspect.currentframe()
    while frame is not None:
        handler = frame.f_locals.get("self")
        if isinstance(handler, CallbackHandler):
            if callback in handler.callbacks:
                handler.callbacks.remove(callback)
                handler.callbacks.insert(0, callback)
            return
        frame = frame.f_back
    logger.warning(
        "MonitorCallback: could not find Trainer's callback handler; reporters "
        "that run before this callback will not receive the scales (add it "
        "with unit_scaling.integrations.hf.add_monitor)"
    )


def add_monitor(trainer: transformers.Trainer, **kwargs: Any) -> MonitorCallback:
    """Add a :class:`MonitorCallback` (made with ``kwargs``) to ``trainer``,
    ahead of its reporters, and return it."""
    callback = MonitorCallback(**kwargs)
    trainer.callback_handler.callbacks.insert(0, callback)
    return callback
