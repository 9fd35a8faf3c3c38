"""TensorBoard for the scale monitor: :class:`TensorBoardLogger`.

Needs ``tensorboard`` (``pip install "torch-unit-scaling[tensorboard]"``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

try:
    import tensorboard  # type: ignore[import-untyped]  # noqa: F401
    from torch.utils.tensorboard import SummaryWriter
except ImportError as error:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "unit_scaling.integrations.tensorboard needs tensorboard: "
        'pip install "torch-unit-scaling[tensorboard]"'
    ) from error

__all__ = ["TensorBoardLogger"]


class TensorBoardLogger:
    """Writes each record of a :class:`~unit_scaling.monitor.Monitor` to
    TensorBoard, one scalar per tag (``scales/<tensor>/<kind>/<statistic>``) at
    the record's step.

    Args:
        writer: a ``SummaryWriter``, or the log directory to make one in.

    Example::

        >>> import tempfile, torch, unit_scaling as uu
        >>> from unit_scaling.monitor import Monitor
        >>> model = uu.Linear(4, 4)
        >>> log = TensorBoardLogger(tempfile.mkdtemp())
        >>> monitor = Monitor(model, every=1, loggers=[log], alerts=None)
        >>> model(torch.randn(2, 4)).sum().backward()
        >>> monitor.step()
        >>> log.close()
    """

    def __init__(self, writer: SummaryWriter | str | os.PathLike[str]) -> None:
        if isinstance(writer, (str, os.PathLike)):
            writer = SummaryWriter(os.fspath(writer))
        if not isinstance(writer, SummaryWriter):
            raise TypeError(
                "TensorBoardLogger: writer must be a SummaryWriter or a log "
                f"directory, got {type(writer).__name__}"
            )
        self.writer = writer

    def __call__(self, step: int, scalars: Mapping[str, float]) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        """Flush and close the writer."""
        self.writer.close()
