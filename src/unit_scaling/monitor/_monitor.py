"""The scale monitor: :class:`Monitor`."""

from __future__ import annotations

import collections
import logging
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from .._torch_internals import pytree
from ._alerts import AlertPolicy, Alerts
from ._guard import NonFiniteError, first_nonfinite_module
from ._observe import add_site, observe_activation
from ._statistics import (
    finalize,
    merge_raw,
    raw_statistics,
    read_back,
    reduce_over_processes,
)

if TYPE_CHECKING:
    import pandas  # type: ignore[import-untyped,unused-ignore]

__all__ = ["KINDS", "Monitor", "ScaleLogger"]

logger = logging.getLogger("unit_scaling.monitor")

KINDS: tuple[str, ...] = (
    "activation",
    "activation_grad",
    "weight",
    "weight_grad",
    "update",
)
"""The kinds of tensor the monitor records: module outputs, their gradients,
parameters, their gradients, and the change an optimizer step makes to each
parameter."""

COLUMNS = ("step", "tensor", "kind", "statistic", "value")
"""The columns of :meth:`Monitor.table`."""

ScaleLogger = Callable[[int, Mapping[str, float]], None]
"""Receives each record: its step and ``{tag: value}`` with tags
``scales/<tensor>/<kind>/<statistic>``."""

# Modules whose output is their input, up to noise: observing them repeats a
# tensor.
_PASS_THROUGH = (nn.Dropout, nn.Identity)
_Key = tuple[str, str]
_DEFAULT_ALERTS = AlertPolicy()


def _default_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every leaf module but those that pass their input through."""
    return [
        (name, module)
        for name, module in model.named_modules()
        if name
        and next(iter(module.children()), None) is None
        and not isinstance(module, _PASS_THROUGH)
    ]


def _first_float_tensor(output: Any) -> Tensor | None:
    for leaf in pytree.tree_leaves(output):
        if isinstance(leaf, Tensor) and leaf.is_floating_point():
            return leaf
    return None


def _loss_of(output: Any) -> Tensor | None:
    """A model's loss among its outputs: a scalar tensor output, or the
    ``loss`` field of a Hugging Face output."""
    if isinstance(output, Tensor):
        return output if output.dim() == 0 else None
    loss = output.get("loss") if isinstance(output, Mapping) else None
    loss = getattr(output, "loss", loss)
    return loss if isinstance(loss, Tensor) and loss.dim() == 0 else None


class Monitor:
    """Records the scale statistics of a model's tensors every ``every`` steps.

    On a recording step it measures (:data:`STATISTICS`: RMS, abs max, log2 RMS,
    and the fractions that would saturate and flush to zero in E4M3, E5M2 and
    FP16) each module's output (``activation``) and that output's gradient
    (``activation_grad``), each parameter (``weight``), its gradient before the
    optimizer step (``weight_grad``) and the change the step makes to it
    (``update``, with ``relative_rms``: its RMS over the weight's, the quantity
    μP reasons about). Other steps cost one attribute check per module call.

    A step ends at ``optimizer.step()`` (hooked) or, without an optimizer, at
    :meth:`step`. All micro-batches of an accumulated step are recorded
    together, and with ``torch.distributed`` initialised each record is
    summed over the processes: every statistic is that of the step's global
    batch (weight gradients as reduced; activations of every process's
    micro-batches taken together).

    Attach it before the model's first call and before ``torch.compile``: a
    compiled model then has two graphs (recording or not) and is not compiled
    again. A model transformed by :func:`~unit_scaling.transforms.unit_scale`
    (or another transform) records each module's output as the transformed
    graph uses it (after the calibrated scale ``unit_scale`` may give it), and
    its gradient; its graphs are captured once whatever the step. Under a
    transform that compiles its graphs (``transforms.compile``), activations are
    not recorded (a warning says so).

    The loss is checked for ``inf``/NaN at every step (the model's own loss
    output, or what :meth:`check_loss` is given): when it is not finite, the
    step's call is replayed with a check on every module and
    :class:`NonFiniteError` names the first module that produced one.

    Args:
        model: the model (a ``DistributedDataParallel`` wrapper is looked through).
        every: record every ``every`` steps, starting with step ``start_step``.
        optimizer: the optimizer whose ``step`` ends a training step.
        kinds: the kinds of tensor to record (see :data:`KINDS`).
        modules: the modules whose outputs are recorded: names, or a predicate
            ``(name, module) -> bool``; default: every leaf module but dropout
            and identities.
        scale: the scale each tensor gets when cast to low precision,
            ``(tensor, kind) -> float``; default 1 (unit-scaled models, and our
            FP8 paths, cast with scale 1).
        aggregate: ``"tensor"`` (default) or ``"type"``: pool the tensors of
            each module type (``Linear``, ``Linear.weight``, ...) into one.
        max_tensors: keep, per kind and record, only this many tensors: those
            farthest from unit scale (largest ``|log2 RMS|``); ``None`` keeps all.
        alerts: when to warn (:class:`AlertPolicy`), or ``None`` for no alerts.
        loggers: callables receiving each record (see :data:`ScaleLogger`).
        check_loss: check the loss for ``inf``/NaN every step.

    Example::

        >>> import unit_scaling as uu
        >>> model = nn.Sequential(uu.Linear(8, 8), uu.GELU(), uu.Linear(8, 1))
        >>> opt = uu.optim.AdamW(model.parameters(), lr=1e-2)
        >>> monitor = Monitor(model, every=2, optimizer=opt)
        >>> for _ in range(3):
        ...     model(torch.randn(4, 8)).pow(2).mean().backward()
        ...     opt.step()
        ...     opt.zero_grad()
        >>> sorted(set(monitor.table()["step"]))
        [0, 2]
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        every: int = 100,
        optimizer: torch.optim.Optimizer | None = None,
        kinds: Sequence[str] = KINDS,
        modules: Sequence[str] | Callable[[str, nn.Module], bool] | None = None,
        scale: Callable[[str, str], float] | None = None,
        aggregate: str = "tensor",
        max_tensors: int | None = None,
        alerts: AlertPolicy | None = _DEFAULT_ALERTS,
        loggers: Iterable[ScaleLogger] = (),
        check_loss: bool = True,
        start_step: int = 0,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(
                f"Monitor: model must be an nn.Module, got {type(model).__name__}"
            )
        if not (isinstance(every, int) and every >= 1):
            raise ValueError(f"Monitor: every must be a positive int, got {every!r}")
        unknown = set(kinds) - set(KINDS)
        if unknown or not kinds:
            raise ValueError(
                f"Monitor: kinds must be a non-empty subset of {KINDS}, got "
                f"{tuple(kinds)!r}"
            )
        if aggregate not in ("tensor", "type"):
            raise ValueError(
                f"Monitor: aggregate must be 'tensor' or 'type', got {aggregate!r}"
            )
        if max_tensors is not None and not (
            isinstance(max_tensors, int) and max_tensors >= 1
        ):
            raise ValueError(
                f"Monitor: max_tensors must be a positive int or None, got "
                f"{max_tensors!r}"
            )
        self.model = model
        self.every = every
        self.kinds = tuple(kinds)
        self.aggregate = aggregate
        self.max_tensors = max_tensors
        self.loggers = list(loggers)
        self.step_count = start_step
        self._scale = scale
        self._recording = self._records(start_step)
        self._pending: dict[_Key, list[Tensor]] = {}
        self._rows: list[tuple[int, str, str, str, float]] = []
        self._before_step: dict[str, Tensor] = {}
        self._last_call: (
            tuple[tuple[Any, ...], dict[str, Any], Tensor | None] | None
        ) = None
        self._loss: Tensor | None = None
        self._check_loss = check_loss
        self._handles: list[Any] = []
        self._hooks_fired = False
        self._warned_no_hooks = False
        self._compiled = False
        self._warned_compiled = "activation_grad" not in self.kinds

        inner = (
            model.module
            if isinstance(model, nn.parallel.DistributedDataParallel)
            else model
        )
        self._inner = inner
        self._parameters = [
            (name, p) for name, p in inner.named_parameters() if p.requires_grad
        ]
        self._types = {
            name: type(module).__name__ for name, module in inner.named_modules()
        }
        self.alerts = (
            Alerts(alerts, unit_scaled=_unit_scaled(inner)) if alerts else None
        )
        self._transformed = _is_transformed(inner)
        if {"activation", "activation_grad"} & set(self.kinds):
            for name, module in self._observed(inner, modules):
                self._handles.append(
                    module.register_forward_hook(self._forward_hook(name))
                )
        if check_loss:
            self._handles.append(
                inner.register_forward_hook(self._root_hook, with_kwargs=True)
            )
            self._handles.append(
                inner.register_forward_pre_hook(self._root_pre_hook, with_kwargs=True)
            )
        self.optimizer: torch.optim.Optimizer | None = None
        if optimizer is not None:
            self.attach_optimizer(optimizer)

    # -- set-up ---------------------------------------------------------------

    @staticmethod
    def _observed(
        model: nn.Module,
        modules: Sequence[str] | Callable[[str, nn.Module], bool] | None,
    ) -> list[tuple[str, nn.Module]]:
        if modules is None:
            return _default_modules(model)
        named = dict(model.named_modules())
        if callable(modules):
            return [(n, m) for n, m in named.items() if modules(n, m)]
        if isinstance(modules, str):
            raise TypeError(
                "Monitor: modules must be a sequence of module names or a "
                f"predicate, got the string {modules!r} (wrap it in a list)"
            )
        missing = [n for n in modules if n not in named]
        if missing:
            raise ValueError(
                f"Monitor: modules {missing} are not in the model; its modules "
                f"include {list(named)[1:6]}"
            )
        return [(n, named[n]) for n in modules]

    def attach_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """End each training step at ``optimizer.step()``: record the weights
        and their gradients before it, the updates after it."""
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                "Monitor: optimizer must be a torch.optim.Optimizer, got "
                f"{type(optimizer).__name__}"
            )
        if self.optimizer is not None:
            raise ValueError("Monitor: an optimizer is already attached")
        self.optimizer = optimizer
        self._handles.append(optimizer.register_step_pre_hook(self._pre_step))
        self._handles.append(optimizer.register_step_post_hook(self._post_step))

    def remove(self) -> None:
        """Detach every hook; the records stay."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _records(self, step: int) -> bool:
        return step % self.every == 0

    @property
    def recording(self) -> bool:
        """Whether the current step is recorded."""
        return self._recording

    def _scale_of(self, tensor: str, kind: str) -> float:
        return 1.0 if self._scale is None else float(self._scale(tensor, kind))

    # -- hooks ----------------------------------------------------------------

    def _add(self, tensor: str, kind: str, value: Tensor) -> None:
        raw = raw_statistics(value, self._scale_of(tensor, kind))
        self._pending.setdefault((tensor, kind), []).append(raw)

    def _forward_hook(self, name: str) -> Callable[..., None]:
        site = add_site(self, name)

        def hook(module: nn.Module, args: Any, output: Any) -> None:
            compiling = torch.compiler.is_compiling()
            if not (compiling or self._recording):
                return
            tensor = _first_float_tensor(output)
            if tensor is None:
                return
            if compiling:
                # Traced: by torch.compile (into observe), or by a transform's
                # capture (one node of its graph, run with the graph).
                observe_activation(tensor, site)
            else:
                self.observe(name, tensor)

        return hook

    def observe(self, name: str, tensor: Tensor) -> None:
        """Record ``tensor`` as the output of module ``name``, and its gradient,
        on a recording step with gradients enabled: what each observed
        module's forward hook does (compiled by ``torch.compile``, without the
        gradient)."""
        if not self._recording or not torch.is_grad_enabled():
            return  # (evaluation, without gradients, is not a step)
        self._hooks_fired = True
        if "activation" in self.kinds:
            self._add(name, "activation", tensor)
        if torch.compiler.is_compiling():
            # A hook on an intermediate tensor of a compiled graph would
            # break the graph: compiled, activation gradients go unrecorded.
            self._compiled = True
        elif "activation_grad" in self.kinds and tensor.requires_grad:
            tensor.register_hook(self._gradient_hook(name))  # type: ignore[no-untyped-call]

    def _gradient_hook(self, name: str) -> Callable[[Tensor], None]:
        def hook(grad: Tensor) -> None:
            self._add(name, "activation_grad", grad)

        return hook

    def _root_pre_hook(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        # (Compiled, the call's draws are not replayed: Dynamo cannot read
        # the generator's state inside a graph.)
        rng = None if torch.compiler.is_compiling() else torch.random.get_rng_state()
        self._last_call = (args, kwargs, rng)

    def _root_hook(
        self, module: nn.Module, args: Any, kwargs: Any, output: Any
    ) -> None:
        loss = _loss_of(output)
        if loss is not None:
            self._loss = loss.detach()

    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._before_optimizer()

    def _post_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._recording and "update" in self.kinds:
            for name, p in self._parameters:
                before = self._before_step.get(name)
                if before is not None:
                    self._add(name, "update", p.detach() - before)
        self._before_step = {}
        self._end_step()

    def _before_optimizer(self) -> None:
        if self._check_loss and self._loss is not None:
            loss, self._loss = self._loss, None
            self.check_loss(loss)
        if not self._recording:
            return
        for name, p in self._parameters:
            if "weight" in self.kinds or "update" in self.kinds:
                self._add(name, "weight", p)
            if "weight_grad" in self.kinds and p.grad is not None:
                self._add(name, "weight_grad", p.grad)
            if "update" in self.kinds and self.optimizer is not None:
                self._before_step[name] = p.detach().clone()

    # -- the public step API --------------------------------------------------

    def step(self) -> None:
        """End a training step in a loop without an attached optimizer: record
        the weights and their gradients (call it after the backward pass)."""
        if self.optimizer is not None:
            raise RuntimeError(
                "Monitor.step: steps end at the attached optimizer's step(); "
                "do not call step() as well"
            )
        self._before_optimizer()
        self._end_step()

    def check_loss(self, loss: Tensor) -> None:
        """Raise :class:`NonFiniteError` if ``loss`` is ``inf`` or NaN, naming
        the first module that produced a non-finite value (found by replaying
        the model's last call). Called at every step for a loss the model
        returns; call it yourself for a loss computed outside the model."""
        if bool(torch.isfinite(loss.detach()).all()):
            return
        where = "the model's call could not be replayed (none was seen)"
        if self._last_call is not None:
            args, kwargs, rng = self._last_call
            with torch.random.fork_rng(devices=[]):
                if rng is not None:
                    torch.random.set_rng_state(rng)
                where = first_nonfinite_module(
                    self._inner, lambda: self._inner(*args, **kwargs)
                )
        raise NonFiniteError(
            f"step {self.step_count}: the loss is {loss.detach().float().item()}; "
            f"{where}"
        )

    # -- records --------------------------------------------------------------

    def _end_step(self) -> None:
        if self._recording:
            if (
                not self._hooks_fired
                and not self._warned_no_hooks
                and "activation" in self.kinds
                and self._handles
                and self._transformed
            ):
                self._warned_no_hooks = True
                logger.warning(
                    "unit_scaling.monitor: the model runs as a transformed graph "
                    "that is compiled (transforms.compile), in which module hooks "
                    "do not run: its activations and their gradients are not "
                    "recorded, its parameters are"
                )
            if self._compiled and not self._warned_compiled:
                self._warned_compiled = True
                logger.warning(
                    "unit_scaling.monitor: the model is compiled: its activation "
                    "gradients are not recorded (a hook on a compiled graph's "
                    "intermediate tensor would break the graph)"
                )
            if self._pending:
                self._record(self._pending)
        self._pending = {}
        self._hooks_fired = False
        self.step_count += 1
        self._recording = self._records(self.step_count)

    def _group(self, tensor: str, kind: str) -> str:
        if self.aggregate == "tensor":
            return tensor
        if kind in ("activation", "activation_grad"):
            return self._types.get(tensor, tensor)
        owner, _, leaf = tensor.rpartition(".")
        return f"{self._types.get(owner, 'model')}.{leaf}"

    def _record(self, pending: Mapping[_Key, list[Tensor]]) -> None:
        groups: dict[_Key, list[int]] = collections.defaultdict(list)
        vectors: list[Tensor] = []
        for (tensor, kind), raws in pending.items():
            group = groups[(self._group(tensor, kind), kind)]
            for raw in raws:
                group.append(len(vectors))
                vectors.append(raw)
        device = vectors[0].device
        rows = read_back(vectors)
        keys = list(groups)
        merged = [merge_raw([rows[i] for i in groups[key]]) for key in keys]
        merged = reduce_over_processes(merged, device)
        values = {key: finalize(raw) for key, raw in zip(keys, merged, strict=True)}
        for (tensor, kind), stats in values.items():
            if kind == "update":
                weight = values.get((tensor, "weight"))
                rms = weight["rms"] if weight else math.nan
                stats["relative_rms"] = stats["rms"] / rms if rms else math.inf
        if "weight" not in self.kinds:
            values = {k: v for k, v in values.items() if k[1] != "weight"}
        values = self._keep_worst(values)
        step = self.step_count
        if self.alerts is not None:
            self.alerts.check(step, values)
        for (tensor, kind), stats in values.items():
            self._rows.extend((step, tensor, kind, s, v) for s, v in stats.items())
        if self.loggers:
            scalars = {
                f"scales/{tensor}/{kind}/{s}": v
                for (tensor, kind), stats in values.items()
                for s, v in stats.items()
            }
            for log in self.loggers:
                log(step, scalars)

    def _keep_worst(
        self, values: dict[_Key, dict[str, float]]
    ) -> dict[_Key, dict[str, float]]:
        if self.max_tensors is None:
            return values
        by_kind: dict[str, list[_Key]] = collections.defaultdict(list)
        for key in values:
            by_kind[key[1]].append(key)
        kept: set[_Key] = set()
        for keys in by_kind.values():
            keys.sort(key=lambda k: -_distance(values[k]["log2_rms"]))
            kept.update(keys[: self.max_tensors])
        return {k: v for k, v in values.items() if k in kept}

    def latest(self) -> dict[str, float]:
        """The last record as ``{tag: value}``."""
        if not self._rows:
            return {}
        last = self._rows[-1][0]
        return {
            f"scales/{t}/{k}/{s}": v for step, t, k, s, v in self._rows if step == last
        }

    def table(self) -> pandas.DataFrame:
        """Every record as a tidy table: one row per step, tensor, kind and
        statistic (columns :data:`COLUMNS`). Needs pandas."""
        from ..analysis._optional import require_plot_extra

        require_plot_extra()
        import pandas  # type: ignore[import-untyped,unused-ignore]

        return pandas.DataFrame(self._rows, columns=list(COLUMNS))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`table` to a ``.csv`` or ``.parquet`` file."""
        suffix = os.fspath(path).rsplit(".", 1)[-1].lower()
        if suffix not in ("csv", "parquet"):
            raise ValueError(
                f"Monitor.save: path must end in .csv or .parquet, got {path!r}"
            )
        table = self.table()
        if suffix == "csv":
            table.to_csv(path, index=False)
        else:
            table.to_parquet(path, index=False)


def _distance(log2_rms: float) -> float:
    return abs(log2_rms) if not math.isnan(log2_rms) else math.inf


def _unit_scaled(model: nn.Module) -> bool:
    from ..parameter import is_unit_scaled

    try:
        return is_unit_scaled(model)
    except ValueError:
        return False


def _is_transformed(model: nn.Module) -> bool:
    from ..transforms._capture.engine import transform_state

    return transform_state(model) is not None
