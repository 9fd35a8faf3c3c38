"""Data-parallel training of unit-scaled, u-μP models with DDP and FSDP2.

Two things need care when a u-μP model trains on several processes.

**Tags.** FSDP2's :func:`torch.distributed.fsdp.fully_shard` replaces every
parameter by a new DTensor parameter, dropping the ``mup_type`` and
``mup_scaling_depth`` tags that the u-μP optimizers read. :func:`fully_shard` puts
them back. DDP and ``torch.compile`` keep the parameter objects, and the unit-scaled
modules re-tag the parameters that ``to("meta")``/``to_empty`` replace, so the
usual meta-device recipe (build on ``meta``, shard, ``to_empty``, initialise) keeps
its tags too. The learning-rate rules read a DTensor's global shape.

**Gradient reduction.** A unit-scaled weight gradient is the sum of per-token
contributions scaled by ``batch^-½`` (see :func:`unit_scaling.functional.linear`;
the unit-scaled loss's backward is that of a sum). Split a batch over ``W``
processes and the gradient of the whole batch is therefore

.. math:: g = \\frac{1}{\\sqrt{W}} \\sum_{r=1}^{W} g_r,

not torch's default mean :math:`\\frac{1}{W}\\sum_r g_r`, which is
:math:`\\sqrt{W}` times smaller. Adam is blind to a constant gradient scale (up to
``eps``), but SGD, gradient clipping and low-precision gradients are not.
:func:`fully_shard` and :func:`allreduce_hook` reduce as above, so a data-parallel
step computes the gradients a single process computes on the global batch. This
holds for models unit-scaled end to end, loss included (every ``unit_scaling``
module and :func:`unit_scaling.functional.cross_entropy`); a parameter of a plain
torch layer whose gradient is a plain sum would want the plain sum instead.

**Calibration.** A :func:`~unit_scaling.transforms.unit_scale` output measures
its scales at its first call, from that call's batch: :func:`calibrate` (or
:func:`calibrate_at_first_call`) makes that call the same on every process.

Example (in a process group: ``torchrun``, or ``dist.init_process_group``)::

    >>> import unit_scaling.parallel
    >>> model = uu.TransformerDecoder(64, 256, layers=2, heads=4)
    >>> for layer in model.layers:
    ...     _ = uu.parallel.fully_shard(layer)
    >>> _ = uu.parallel.fully_shard(model)
    >>> opt = uu.optim.AdamW(model.parameters(), lr=2**-4)

    >>> from torch.nn.parallel import DistributedDataParallel
    >>> ddp = DistributedDataParallel(uu.TransformerDecoder(64, 256, 2, 4))
    >>> ddp.register_comm_hook(None, uu.parallel.allreduce_hook)
"""

# No `from __future__ import annotations`: DDP checks a hook's annotations against
# the real classes when it is registered.
import math
import weakref
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp import fully_shard as _torch_fully_shard

from ._torch_internals import GradBucket, pytree
from .optim import mup_tags
from .parameter import retag

__all__ = [
    "Reduction",
    "allreduce_hook",
    "calibrate",
    "calibrate_at_first_call",
    "fully_shard",
    "reduction_hook",
]


def _data_parallel_size(mesh: DeviceMesh | None, dp_mesh_dims: Any) -> int:
    """The number of processes a gradient is reduced over, as torch's FSDP2 sees it."""
    if mesh is None:
        return dist.get_world_size()
    if dp_mesh_dims is None:
        return mesh.size()  # 1-D: FSDP; 2-D: HSDP, both dimensions data-parallel
    names = tuple(dp_mesh_dims.shard_names) + tuple(dp_mesh_dims.replicate_names)
    return math.prod(mesh[name].size() for name in names)


def fully_shard(module: nn.Module, **kwargs: Any) -> FSDPModule:
    r"""FSDP2's :func:`torch.distributed.fsdp.fully_shard`, keeping u-μP intact.

    Shards ``module`` exactly as torch does, then

    * re-attaches each parameter's u-μP tags (:class:`~unit_scaling.optim.MupTags`)
      to the DTensor parameter that replaced it, so
      :class:`unit_scaling.optim.AdamW` and friends give every parameter its
      u-μP learning rate (computed from the global shape);
    * reduces gradients as :math:`\frac{1}{\sqrt{W}}\sum_r g_r` over the ``W``
      data-parallel processes (with ``set_gradient_divide_factor(sqrt(W))`` and
      sum-only collectives), so the gradients equal those of one process on the
      global batch. ``module.set_gradient_divide_factor(W)`` restores torch's mean.

    Call it like torch's: on each block first, then on the root. Parameters that
    were already sharded (by an earlier call) keep their tags.

    Args:
        module: the module to shard.
        **kwargs: torch's keyword arguments (``mesh``, ``reshard_after_forward``,
            ``shard_placement_fn``, ``mp_policy``, ...), passed through.

    Returns:
        ``module``, now an ``FSDPModule``.

    Example::

        >>> model = uu.TransformerDecoder(64, 256, layers=2, heads=4)
        >>> for layer in model.layers:
        ...     _ = fully_shard(layer)
        >>> _ = fully_shard(model)
        >>> model.layers[0].mlp.linear_1.weight.mup_type
        'weight'
    """
    tags = mup_tags(module)
    for sub in module.modules():
        # A layer may say how its parameters travel (an FP8 layer gathers its
        # weight in FP8; see unit_scaling.float8).
        prepare = getattr(sub, "fsdp_prepare_parameters", None)
        if callable(prepare):
            prepare()
    sharded = _torch_fully_shard(module, **kwargs)
    params = dict(module.named_parameters())
    for name, own in tags.items():
        retag(params[name], *own)
    size = _data_parallel_size(kwargs.get("mesh"), kwargs.get("dp_mesh_dims"))
    sharded.set_gradient_divide_factor(math.sqrt(size))
    # With a divide factor torch reduces with PREMUL_SUM, which gloo lacks; a sum
    # followed by a division works on every backend and touches only the shard.
    sharded.set_force_sum_reduction_for_comms(True)
    return sharded


def allreduce_hook(
    process_group: dist.ProcessGroup | None, bucket: GradBucket
) -> torch.futures.Future[Tensor]:
    r"""DDP communication hook reducing gradients as ``sum / sqrt(world_size)``.

    .. math:: g = \frac{1}{\sqrt{W}} \sum_{r=1}^{W} g_r

    Use it in place of DDP's default, the mean (:math:`\sqrt{W}` times smaller):
    the reduced gradients then equal those of one process on the global batch.
    Dividing before the all-reduce keeps the summed gradient at unit scale, which
    matters for fp16/bf16 gradients.

    Args:
        process_group: the group to reduce over; ``None`` for the default group
            (what ``register_comm_hook(None, allreduce_hook)`` passes).
        bucket: DDP's bucket of flattened gradients.

    Example::

        >>> model = uu.TransformerDecoder(64, 256, layers=2, heads=4)
        >>> ddp = torch.nn.parallel.DistributedDataParallel(model)
        >>> ddp.register_comm_hook(None, allreduce_hook)
    """
    return reduction_hook(Reduction(process_group=process_group), bucket)


def calibrate(module: nn.Module, *args: Any, **kwargs: Any) -> None:
    """Call ``module`` once, without gradients, on process 0's ``args`` and
    ``kwargs``, on every process of the default group (in one process, or
    outside a group: on its own ``args`` and ``kwargs``). Every process must
    call it together.

    A :func:`~unit_scaling.transforms.unit_scale` output measures its
    calibrated scales at its first call, from that call's inputs (token ids,
    labels and masks enter the measurement as they are): processes whose first
    calls see different batches compute different functions (scales apart by
    up to 25% on a small GPT-2), and their gradients do not add up to one
    process's. Make this the first call on every process; later calls reuse
    its measurements. Tensors travel through the CPU and arrive on
    ``module``'s device. :func:`calibrate_at_first_call` does it for you.

    Example::

        >>> from unit_scaling.transforms import unit_scale
        >>> model = unit_scale(nn.Sequential(nn.Linear(16, 16), nn.GELU()))
        >>> calibrate(model, torch.randn(4, 16))
    """
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        cpu = pytree.tree_map_only(Tensor, lambda t: t.detach().cpu(), (args, kwargs))
        payload = [cpu]
        dist.broadcast_object_list(payload, src=0)
        device = next((p.device for p in module.parameters()), torch.device("cpu"))
        args, kwargs = pytree.tree_map_only(Tensor, lambda t: t.to(device), payload[0])
    with torch.no_grad():
        module(*args, **kwargs)


# The modules whose next call calibrates (one hook each, however often asked).
_CALIBRATING: "weakref.WeakSet[nn.Module]" = weakref.WeakSet()


def calibrate_at_first_call(module: nn.Module) -> None:
    """Make ``module``'s next call start with :func:`calibrate` on that call's
    inputs (process 0's, on every process), once.

    For a :func:`~unit_scaling.transforms.unit_scale` output trained on several
    processes, before DDP or FSDP2 wraps it or after (it hooks the module
    itself). Its next call must then happen on every process together, as a
    training step's forward does: a first call on process 0 alone (a sample
    generated before training) would wait for the others.
    :class:`unit_scaling.integrations.accelerate.Accelerator` and
    :class:`~unit_scaling.integrations.hf.UnitScalingTrainer` call it for a
    ``unit_scale`` output they prepare for several processes.

    Example::

        >>> from unit_scaling.transforms import unit_scale
        >>> model = unit_scale(nn.Sequential(nn.Linear(16, 16), nn.GELU()))
        >>> calibrate_at_first_call(model)
        >>> model(torch.randn(4, 16)).shape
        torch.Size([4, 16])
    """

    if module in _CALIBRATING:
        return
    _CALIBRATING.add(module)

    def first_call(
        module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        handle.remove()
        _CALIBRATING.discard(module)
        calibrate(module, *args, **kwargs)

    # (before any other pre-hook: FSDP2's gathers its parameters for each call)
    handle = module.register_forward_pre_hook(
        first_call, with_kwargs=True, prepend=True
    )


class Reduction:
    r"""What the sum of the processes' gradients is divided by, settable per
    step: the state of :func:`reduction_hook`.

    ``sqrt(W)`` (the default, :func:`allreduce_hook`'s) when each process's
    loss is normalised by its own examples; ``W`` when a loop multiplies each
    process's loss by ``W`` to undo a mean (Hugging Face ``Trainer`` does when
    its ``num_items_in_batch`` already counts every process's tokens: the loss's
    share :math:`\varphi` of the step then holds the ``1/W``, see
    :mod:`unit_scaling.functional.steps`, and the processes' shares add up).

    Args:
        divisor: the initial divisor; ``None`` (the default, and what setting
            it to ``None`` restores) for ``sqrt(W)``, read when used.
        process_group: the group to reduce over; ``None`` for the default group.

    Example::

        >>> reduction = Reduction()  # sqrt(W), read from the process group
        >>> ddp = torch.nn.parallel.DistributedDataParallel(uu.Linear(8, 8))
        >>> ddp.register_comm_hook(reduction, reduction_hook)
        >>> reduction.divisor = 4.0  # from now on: the mean over 4 processes
        >>> reduction.divisor
        4.0
    """

    def __init__(
        self,
        divisor: float | None = None,
        process_group: dist.ProcessGroup | None = None,
    ) -> None:
        self._divisor = divisor
        self.process_group = process_group

    @property
    def divisor(self) -> float:
        if self._divisor is None:
            return math.sqrt(dist.get_world_size(self.process_group))
        return self._divisor

    @divisor.setter
    def divisor(self, value: float | None) -> None:
        # (None: back to the default, sqrt(W))
        if value is not None and not (
            isinstance(value, (int, float)) and value > 0 and math.isfinite(value)
        ):
            raise ValueError(
                f"Reduction.divisor must be a positive number or None, got {value!r}"
            )
        self._divisor = None if value is None else float(value)


def reduction_hook(
    state: Reduction, bucket: GradBucket
) -> torch.futures.Future[Tensor]:
    """DDP communication hook reducing gradients as ``sum / state.divisor``,
    the divisor read at each reduction (see :class:`Reduction`);
    :func:`allreduce_hook` is this hook with ``sqrt(world_size)``.

    Example::

        >>> ddp = torch.nn.parallel.DistributedDataParallel(uu.Linear(8, 8))
        >>> ddp.register_comm_hook(Reduction(divisor=2.0), reduction_hook)
        >>> ddp(torch.randn(4, 8)).sum().backward()  # gradients summed, then / 2
    """
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    buffer.div_(state.divisor)
    work = dist.all_reduce(buffer, group=group, async_op=True)
    assert work is not None  # async_op=True always returns a Work
    reduced: torch.futures.Future[list[Tensor]] = work.get_future()
    return reduced.then(_first)


def _first(future: torch.futures.Future[list[Tensor]]) -> Tensor:
    return future.value()[0]
