"""Accelerate: an ``Accelerator`` that trains unit-scaled models the unit-scaled way.

A stock ``accelerate.Accelerator`` computes a step's gradient as the mean of
its micro-batches' and processes' gradients: ``accelerator.backward`` divides
each loss by ``gradient_accumulation_steps`` and DDP averages over the ``W``
processes. That is the whole batch's gradient for a plain model, but for a
unit-scaled one (whose gradient carries ``batch^-½`` rather than ``1/batch``)
it is ``(k W)^-½`` of it. :class:`Accelerator` is a drop-in subclass that
applies the library's rule (:mod:`unit_scaling.functional.steps`) instead:

* ``backward(loss)`` takes a micro-batch's loss, a mean over its own examples
  as before, and scales its gradient by ``k^-½`` (the value still ``loss / k``);
* ``prepare`` gives a DDP model :func:`unit_scaling.parallel.reduction_hook`
  (``sum / √W``) and an FSDP2 model (``FullyShardedDataParallelPlugin(
  fsdp_version=2)``) the same divide factor, and puts the u-μP tags back on the
  parameters FSDP2 replaced (as :func:`unit_scaling.parallel.fully_shard` does);
  a :func:`~unit_scaling.transforms.unit_scale` output prepared for several
  processes calibrates at its first call on process 0's inputs
  (:func:`unit_scaling.parallel.calibrate_at_first_call`), so that every
  process measures the same scales: make that first call on every process;
* :meth:`Accelerator.clip_grad_rms_` bounds the gradient's RMS, the measure a
  unit-scaled gradient is at 1 in (its norm is about ``√(parameters)``).

A loss normalised inside the model by the step's count (Hugging Face's
``num_items_in_batch``, which :func:`~unit_scaling.transforms.unit_scale`
turns into :func:`unit_scaling.functional.step_mean`) already holds its share
of the step: its loop then follows Hugging Face's recipe (the loss multiplied
by ``k`` and ``W`` to undo the mean), and the accelerator applies the stock
mean to it. Models that are not unit-scaled get the stock behaviour throughout.

Example::

    from unit_scaling.integrations.accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=4)   # was accelerate's
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for batch in loader:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            optimizer.step()
            optimizer.zero_grad()
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Any, cast

import torch
from torch import Tensor, nn

from .. import functional as U
from ..optim import mup_tags
from ..parallel import Reduction, calibrate_at_first_call, reduction_hook
from ..parameter import is_unit_scaled, retag
from ._models import made_by_unit_scale

try:
    import accelerate  # type: ignore[import-untyped]
    from accelerate.utils import DistributedType  # type: ignore[import-untyped]
except ImportError as error:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "unit_scaling.integrations.accelerate needs accelerate: "
        "pip install 'torch-unit-scaling[hf]'"
    ) from error

__all__ = ["Accelerator", "carries_step_share"]

logger = logging.getLogger(__name__)

# How far back from a loss to look for a step_mean: the loss functions that
# divide by the step's count do so last, before at most a few scalar ops.
_SEARCH_NODES = 32


def carries_step_share(loss: Tensor) -> bool:
    """Whether ``loss`` was normalised by the step's count inside the model
    (it was computed through :func:`unit_scaling.functional.step_mean`), so
    that it already holds its share of the step; read from the last few
    operations of its autograd graph.

    Example::

        >>> total = U.cross_entropy(torch.randn(4, 8, requires_grad=True),
        ...                         torch.randint(8, (4,)), reduction="sum")
        >>> carries_step_share(U.step_mean(total, 4, 16) * 2), carries_step_share(total)
        (True, False)
    """
    stack = [loss.grad_fn]
    seen = 0
    while stack and seen < _SEARCH_NODES:
        node = stack.pop(0)
        if node is None:
            continue
        seen += 1
        if type(node).__name__ == "_StepShareBackward":
            return True
        stack.extend(next_node for next_node, _ in node.next_functions)
    return False


class Accelerator(accelerate.Accelerator):  # type: ignore[misc]
    """:class:`accelerate.Accelerator` for unit-scaled models (see the module
    docstring): the same arguments, and the unit-scaled rule for accumulation
    and data-parallel reduction.

    Attributes:
        reduction: the :class:`unit_scaling.parallel.Reduction` whose divisor
            the data-parallel reduction of unit-scaled models uses.
        infer_reduction: whether :meth:`backward` sets that divisor from the
            loss (``True`` until :meth:`set_reduction_divisor` is called): the
            mean for a loss that carries its share of the step, ``sqrt(W)``
            otherwise.
        clip_by_rms: whether :meth:`clip_grad_norm_` reads ``max_norm`` as a
            bound on the gradient's RMS (``False``; Hugging Face ``Trainer``
            with :class:`unit_scaling.integrations.hf.UnitScalingMixin` sets it).

    Raises:
        ValueError: at ``prepare``, for DeepSpeed, which scales and reduces
            gradients itself, and for a model mixing unit-scaled and plain
            trainable parameters.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._start_unit_scaling()

    def _start_unit_scaling(self) -> None:
        self.reduction = Reduction()
        self.clip_by_rms = False
        self.infer_reduction = True
        self._unit_scaled = False
        self._sharded: list[Any] = []

    @classmethod
    def adopt(cls, accelerator: accelerate.Accelerator) -> Accelerator:
        """Make ``accelerator`` (a stock one that another tool created, such as
        ``Trainer``'s) an instance of this class, in place, before it prepares
        anything; returns it.

        Raises:
            ValueError: if it has prepared a model already.
        """
        if accelerator._models:
            raise ValueError(
                "Accelerator.adopt: the accelerator has prepared a model already; "
                "adopt it before prepare()"
            )
        if not isinstance(accelerator, cls):
            accelerator.__class__ = cls
            accelerator._start_unit_scaling()
        return cast(Accelerator, accelerator)

    def set_reduction_divisor(self, divisor: float | None) -> None:
        """Divide the sum of the processes' gradients by ``divisor`` from now on
        (``None``: ``sqrt(W)``), in DDP's hook and FSDP2's divide factor; for a
        loop that scales its loss itself (see :class:`unit_scaling.parallel.Reduction`).
        Until it is called, :meth:`backward` chooses (see :attr:`infer_reduction`)."""
        self.infer_reduction = False
        self._set_divisor(divisor)

    # -- prepare ------------------------------------------------------------ #
    def prepare(self, *args: Any, device_placement: Any = None) -> Any:
        modules = [a for a in args if isinstance(a, nn.Module)]
        unit = [m for m in modules if is_unit_scaled(m)]
        if unit and self.distributed_type == DistributedType.DEEPSPEED:
            raise ValueError(
                "unit_scaling.integrations.accelerate.Accelerator: DeepSpeed scales "
                "and reduces gradients itself, which the unit-scaled rule cannot "
                "follow; use DDP or FSDP2 (FullyShardedDataParallelPlugin("
                "fsdp_version=2))"
            )
        tags = {id(m): mup_tags(m) for m in unit}
        result = super().prepare(*args, device_placement=device_placement)
        prepared = result if isinstance(result, (tuple, list)) else (result,)
        for before, after in zip(args, prepared, strict=True):
            if id(before) in tags:
                self._unit_scaled = True
                self._after_prepare(after, tags[id(before)])
        return result

    def _after_prepare(self, model: nn.Module, tags: dict[str, Any]) -> None:
        from torch.distributed.fsdp import FSDPModule
        from torch.nn.parallel import DistributedDataParallel

        inner = self.unwrap_model(model)
        if self.num_processes > 1 and made_by_unit_scale(inner):
            calibrate_at_first_call(inner)
        if isinstance(model, DistributedDataParallel):
            model.register_comm_hook(self.reduction, reduction_hook)
            return
        sharded = [m for m in inner.modules() if isinstance(m, FSDPModule)]
        if not sharded:
            return
        params = dict(inner.named_parameters())
        for name, own in tags.items():
            if name in params:
                retag(params[name], *own)
        for module in sharded:
            # gloo has no PREMUL_SUM: a sum then a division, as uu.parallel does
            module.set_force_sum_reduction_for_comms(True)
        self._sharded.extend(sharded)
        self._set_divisor(self.reduction.divisor)

    def _set_divisor(self, divisor: float | None) -> None:
        self.reduction.divisor = divisor
        for module in self._sharded:
            module.set_gradient_divide_factor(self.reduction.divisor)

    # -- backward ----------------------------------------------------------- #
    def backward(self, loss: Tensor, **kwargs: Any) -> None:
        """``accelerate.Accelerator.backward`` for one micro-batch's loss, its
        gradient scaled by ``gradient_accumulation_steps^-½`` for a unit-scaled
        model (see the module docstring)."""
        if not self._unit_scaled:
            return super().backward(loss, **kwargs)  # type: ignore[no-any-return]
        if carries_step_share(loss):
            # The loop normalised by the step's count and undoes the mean itself.
            if self.infer_reduction:
                self._set_divisor(float(self.num_processes))
            return super().backward(loss, **kwargs)  # type: ignore[no-any-return]
        if self.infer_reduction:
            self._set_divisor(None)
        steps = self.gradient_accumulation_steps
        if steps > 1:
            # Accelerate divides by `steps`; what reaches backward is then the
            # rule's loss / steps with gradient steps^-1/2.
            loss = U.micro_batch_loss(loss, 1 / steps) * steps
        return super().backward(loss, **kwargs)  # type: ignore[no-any-return]

    # -- clipping ----------------------------------------------------------- #
    def clip_grad_rms_(self, parameters: Iterable[Tensor], max_rms: float) -> Tensor:
        """Clip the gradients of ``parameters`` (together) to RMS ``max_rms``,
        and return their RMS before clipping.

        A unit-scaled gradient has RMS about 1, so its norm grows as the square
        root of the parameter count: a norm bound such as 1.0 clips every step
        by a factor of hundreds, while an RMS bound means the same at every
        size. This is :meth:`clip_grad_norm_` with ``max_norm = max_rms ·
        √(elements with a gradient)``.
        """
        params = [p for p in parameters if p.grad is not None]
        size = sum(p.numel() for p in params)
        if not size:
            return torch.zeros((), device=self.device)
        norm = super().clip_grad_norm_(params, max_rms * math.sqrt(size))
        return norm / math.sqrt(size)  # type: ignore[no-any-return]

    def clip_grad_norm_(
        self, parameters: Iterable[Tensor], max_norm: float, norm_type: float = 2
    ) -> Tensor:
        """``accelerate``'s, or, with :attr:`clip_by_rms` set and a unit-scaled
        model, ``max_norm`` read as an RMS bound (see :meth:`clip_grad_rms_`);
        returns the norm before clipping either way."""
        if not (self.clip_by_rms and self._unit_scaled and norm_type == 2):
            return super().clip_grad_norm_(parameters, max_norm, norm_type)  # type: ignore[no-any-return]
        params = [p for p in parameters if p.grad is not None]
        size = sum(p.numel() for p in params)
        return super().clip_grad_norm_(params, max_norm * math.sqrt(max(size, 1)))  # type: ignore[no-any-return]
