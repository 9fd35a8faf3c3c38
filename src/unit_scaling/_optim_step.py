"""How :mod:`unit_scaling.optim`'s optimizers step: few kernels for many param groups.

u-μP gives every parameter its own param group (its own learning rate), and
torch's optimizers update group by group, so a foreach or fused implementation
launches its kernels once per *parameter* rather than once per step. A decoder
with 22 parameters ran 176 foreach kernels per AdamW step where torch's AdamW
runs 9. :class:`BatchedStep` keeps the param groups as they are (one per
parameter: schedulers, ``state_dict``, distributed checkpoints and
:func:`unit_scaling.analysis.optimizer_report` see what they always saw) and
changes only how ``step`` hands them to torch:

- Groups whose settings are all equal are merged, and torch's own ``step`` runs
  over the merged groups (any implementation: for-loop, foreach, fused,
  capturable).
- Adam and AdamW on the foreach path (the default on a GPU) go further: groups
  that differ only in their learning rate (and decoupled weight decay) take one
  pass of foreach kernels, each tensor with its own step size. These are the
  per-tensor scalars torch's own foreach Adam computes, computed the same way,
  so the update is bitwise the one torch makes group by group.

Where torch would choose its implementation (``foreach=None``), a
:class:`unit_scaling.Parameter` counts as the ``nn.Parameter`` it is: torch's rule
checks the exact type and would put every tagged parameter on the slow for-loop
path on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn

from . import _torch_internals as internals
from .parameter import Parameter

__all__ = ["BatchedAdam", "BatchedStep", "merge_equal_groups"]

# Group keys that no update reads: names, u-μP's record of its rule, and what lr
# schedulers keep in each group to compute the next lr.
_BOOKKEEPING = frozenset(
    {
        "params",
        "param_names",
        "mup_lr_scale",
        "initial_lr",
        "max_lr",
        "min_lr",
        "base_momentum",
        "max_momentum",
    }
)

# Parameter types whose foreach kernels are torch's own: torch's default rule
# accepts only the first two; unit_scaling's Parameter only adds attributes.
_PLAIN_TYPES = (Tensor, nn.Parameter, Parameter)

# A group's settings: ``(key, type, value)`` for a number, string or None (the
# type keeps True and 1 apart), ``(key, frozen)`` for anything else.
_Key = tuple[tuple[Any, ...], ...]
_SCALARS = frozenset({bool, int, float, complex, str, type(None)})


def _frozen(value: Any) -> Any:
    """A hashable stand-in for a setting that is not a number, equal only for
    equal settings. A tensor (a tensor lr or beta) stands for itself: comparing
    values would read device memory on every step."""
    if type(value) in _SCALARS:
        return (type(value), value)
    if isinstance(value, tuple | list):
        return (type(value), tuple(_frozen(v) for v in value))
    if isinstance(value, dict):
        return (dict, frozenset((k, _frozen(v)) for k, v in value.items()))
    return ("object", id(value))


def _settings(group: dict[str, Any]) -> _Key:
    """Everything in ``group`` an update could read, in the group's order (the
    same for every group torch's ``add_param_group`` completes from one set of
    defaults). Runs on every step for every group: kept to one pass."""
    return (
        ("named", "param_names" in group),
        *[
            (k, v.__class__, v) if v.__class__ in _SCALARS else (k, _frozen(v))
            for k, v in group.items()
            if k not in _BOOKKEEPING
        ],
    )


def _foreach_by_default(group: dict[str, Any], devices: list[str]) -> bool:
    """Whether torch would choose its foreach implementation for ``group`` with
    ``foreach=None`` (``devices``: those with foreach kernels), with a
    :class:`unit_scaling.Parameter` counted as a plain ``nn.Parameter``
    (torch's own rule checks the exact type)."""
    if group.get("fused") or group.get("differentiable"):
        return False
    if isinstance(group.get("lr"), Tensor):  # torch then keeps the for-loop too
        return False
    return all(
        type(p) in _PLAIN_TYPES and p.device.type in devices for p in group["params"]
    )


def _merge(groups: Iterable[dict[str, Any]]) -> dict[_Key, dict[str, Any]]:
    """:func:`merge_equal_groups`, by settings."""
    merged: dict[_Key, dict[str, Any]] = {}
    for group in groups:
        key = _settings(group)
        into = merged.get(key)
        if into is None:
            merged[key] = {**group, "params": list(group["params"])}
            if "param_names" in group:
                merged[key]["param_names"] = list(group["param_names"])
        else:
            into["params"].extend(group["params"])
            if "param_names" in group:
                into["param_names"].extend(group["param_names"])
    devices = None
    for group in merged.values():
        if group.get("foreach", False) is None:
            devices = devices or internals.foreach_kernel_devices()
            if _foreach_by_default(group, devices):
                group["foreach"] = True
    return merged


def merge_equal_groups(groups: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """New param groups, one per distinct setting, holding the parameters of all
    of ``groups`` with those settings (in order); ``groups`` are not changed.

    Settings are every key but the parameters, their names and what lr
    schedulers keep (``initial_lr``, ...); tensors compare by identity.
    ``foreach=None`` becomes what torch would choose for plain parameters.

    Example::

        >>> w, v = torch.zeros(2), torch.zeros(3)
        >>> merged = merge_equal_groups(
        ...     [{"params": [w], "lr": 0.1}, {"params": [v], "lr": 0.1}]
        ... )
        >>> [len(g["params"]) for g in merged]
        [2]
    """
    return list(_merge(groups).values())


class BatchedStep(torch.optim.Optimizer):
    """A torch optimizer whose ``step`` updates equal param groups together.

    Put it before the torch optimizer class among the bases:
    ``class AdamW(BatchedStep, torch.optim.AdamW)``. The param groups, the state
    and the update are torch's; only the number of kernels changes (see this
    module's docstring).
    """

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Update every parameter once, as the torch optimizer would.

        Args:
            closure: re-evaluates the model and returns the loss (evaluated
                once, before the update).
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # The hooks ran around this method; torch's step must not run them again.
        torch_step = internals.unhooked_optimizer_step(super().step)
        if torch.compiler.is_compiling():  # the compiler fuses the groups itself
            torch_step(self)
            return loss
        rest = self._step_batched(_merge(self.param_groups))
        if rest:
            saved = self.param_groups
            self.param_groups = rest
            try:
                torch_step(self)
            finally:
                self.param_groups = saved
        return loss

    def _step_batched(self, groups: dict[_Key, dict[str, Any]]) -> list[dict[str, Any]]:
        """Update what this optimizer can update in fewer kernels than torch's
        step over the merged ``groups`` would; return the groups left to torch."""
        return list(groups.values())


class BatchedAdam(BatchedStep):
    """:class:`BatchedStep` for Adam and AdamW: on the foreach path, groups that
    differ only in learning rate (and decoupled weight decay) share one pass."""

    def _step_batched(self, groups: dict[_Key, dict[str, Any]]) -> list[dict[str, Any]]:
        rest = []
        passes: dict[_Key, list[dict[str, Any]]] = {}
        for key, group in groups.items():
            if not self._one_pass_applies(group):
                rest.append(group)
                continue
            # A coupled decay joins the gradient with one foreach `add` whose
            # alpha is a single number, so it must be the same across the pass.
            decoupled = group["decoupled_weight_decay"]
            per_tensor = ("lr", "weight_decay") if decoupled else ("lr",)
            shared = tuple(item for item in key if item[0] not in per_tensor)
            passes.setdefault(shared, []).append(group)
        if passes:
            internals.graph_capture_health_check(self)
        for together in passes.values():
            self._one_pass(together)
        return rest

    def _one_pass_applies(self, group: dict[str, Any]) -> bool:
        """Whether torch would take the non-capturable foreach path for ``group``
        (the only one whose arithmetic :func:`_foreach_adam` repeats)."""
        scalars = (group["lr"], *group["betas"])
        return (
            group.get("foreach") is True
            and not group.get("fused")
            and not group.get("capturable")
            and not group.get("differentiable")
            and not any(isinstance(s, Tensor) for s in scalars)
            and not any(p.is_complex() for p in group["params"])
            and getattr(self, "grad_scale", None) is None
            and getattr(self, "found_inf", None) is None
        )

    @torch.no_grad()
    def _one_pass(self, groups: list[dict[str, Any]]) -> None:
        lists: tuple[list[Tensor], ...] = ([], [], [], [], [], [])
        lrs: list[float] = []
        decays: list[float] = []
        for group in groups:
            before = len(lists[0])
            internals.adam_init_group(self, group, *lists)
            added = len(lists[0]) - before
            lrs += [group["lr"]] * added
            decays += [group["weight_decay"]] * added
        params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps = lists
        settings = groups[0]
        by_device: dict[tuple[torch.device, torch.dtype], list[int]] = {}
        for i, p in enumerate(params):
            by_device.setdefault((p.device, p.dtype), []).append(i)
        for indices in by_device.values():

            def pick(values: list[Any], indices: list[int] = indices) -> list[Any]:
                return [values[i] for i in indices]

            _foreach_adam(
                pick(params),
                pick(grads),
                pick(exp_avgs),
                pick(exp_avg_sqs),
                pick(max_exp_avg_sqs) if settings["amsgrad"] else [],
                pick(steps),
                lrs=pick(lrs),
                decays=pick(decays),
                betas=settings["betas"],
                eps=settings["eps"],
                amsgrad=settings["amsgrad"],
                maximize=settings["maximize"],
                decoupled=settings["decoupled_weight_decay"],
            )


def _foreach_adam(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    max_exp_avg_sqs: list[Tensor],
    steps: list[Tensor],
    *,
    lrs: list[float],
    decays: list[float],
    betas: tuple[float, float],
    eps: float,
    amsgrad: bool,
    maximize: bool,
    decoupled: bool,
) -> None:
    r"""One Adam/AdamW update of tensors on one device, each with its own lr.

    .. math::
        m \leftarrow \beta_1 m + (1 - \beta_1) g, \quad
        v \leftarrow \beta_2 v + (1 - \beta_2) g^2, \quad
        p \leftarrow p - \frac{\eta_p}{1 - \beta_1^t}
            \frac{m}{\sqrt{v / (1 - \beta_2^t)} + \epsilon}

    with ``p ← p (1 − η_p λ_p)`` first (decoupled decay) or ``g ← g + λ p``
    (coupled, one ``λ`` for all). The operations and the per-tensor scalars are
    those of torch's non-capturable foreach Adam, in its order, so each tensor's
    result is bitwise the one torch computes for it alone.
    """
    if not params:
        return
    beta1, beta2 = betas
    if maximize:
        grads = internals.foreach_neg(grads)
    if steps[0].is_cpu:  # a CPU scalar tensor is faster than a Python 1 there
        one = torch.tensor(1.0, device=steps[0].device)
        internals.foreach_add_(steps, one, alpha=1.0)
    else:
        internals.foreach_add_(steps, 1)
    if decoupled:
        if any(decay != 0 for decay in decays):
            factors = [1 - lr * decay for lr, decay in zip(lrs, decays, strict=True)]
            internals.foreach_mul_(params, factors)
    elif decays[0] != 0:
        if maximize:  # `grads` is already a copy
            internals.foreach_add_(grads, params, alpha=decays[0])
        else:
            grads = internals.foreach_add(grads, params, alpha=decays[0])
    internals.foreach_lerp_(exp_avgs, grads, 1 - beta1)
    internals.foreach_mul_(exp_avg_sqs, beta2)
    internals.foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
    del grads
    counts = [step.item() for step in steps]
    step_sizes = [(lr / (1 - beta1**t)) * -1 for lr, t in zip(lrs, counts, strict=True)]
    bias_correction2_sqrt = [(1 - beta2**t) ** 0.5 for t in counts]
    if amsgrad:
        internals.foreach_maximum_(max_exp_avg_sqs, exp_avg_sqs)
        denominators = internals.foreach_sqrt(max_exp_avg_sqs)
    else:
        denominators = internals.foreach_sqrt(exp_avg_sqs)
    internals.foreach_div_(denominators, bias_correction2_sqrt)
    internals.foreach_add_(denominators, eps)
    internals.foreach_addcdiv_(params, exp_avgs, denominators, step_sizes)
