"""Profiling-based Admin: set each omega from variances measured on a batch.

This is the initialisation of the original Admin method (Liu et al., 2020,
"Understanding the Difficulty of Training Transformers"). In a Post-LN stack,
residual ``i`` computes

.. math:: x_i = \\mathrm{LN}(x_{i-1} \\cdot \\omega_i + f_i(x_{i-1}))

A Pre-LN stack instead accumulates ``x_i = x_{i-1} + f_i(\\cdot)``, so the shortcut
entering branch ``i`` carries the variance of the input plus every branch before
it, and each new branch changes the output by an ever smaller fraction: that is
what makes Pre-LN easy to train. Admin gives Post-LN the same balance at
initialisation. Because ``x_{i-1}`` is a LayerNorm output (variance 1), the
shortcut ``x_{i-1} \\cdot \\omega_i`` has variance ``\\omega_i^2``, so

.. math::
    \\omega_i^2 = \\operatorname{Var}[x_0]
        + \\sum_{j=1}^{i-1} \\operatorname{Var}[f_j(x_{j-1})]

where ``x_0`` is the shortcut input of the first residual of the stack (the
embedding) and every variance is measured in one forward pass with all omegas at 1.
Counting ``x_0`` as the zeroth branch handles the first residual consistently:
``\\omega_1 = \\sqrt{\\operatorname{Var}[x_0]}``, which is 1 for a normalised
embedding (the first residual is left as it is), and never 0.

Branch outputs are measured with ``omega = 1`` everywhere: in Post-LN every branch
reads a LayerNorm output, so its output variance does not depend on the omegas
before it, and one pass suffices.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from .residual import OmegaResidual

__all__ = ["profile_init"]

logger = logging.getLogger(__name__)


@dataclass
class _Call:
    name: str
    module: OmegaResidual
    x_variance: float
    f_x_variance: float


def _variance(t: Tensor) -> float:
    # float64 and the population variance: the result must not depend on the
    # model's dtype, and the batch is the whole population being profiled.
    return float(t.detach().double().var(correction=0).item())


def _residual_inputs(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Tensor, Tensor]:
    # The hook runs after a successful call, so the (x, f_x) signature held.
    if len(args) >= 2:
        return args[0], args[1]
    if len(args) == 1:
        return args[0], kwargs["f_x"]
    return kwargs["x"], kwargs["f_x"]


def _stack_of_each(
    residuals: list[tuple[str, OmegaResidual]], stacks: Sequence[nn.Module]
) -> dict[OmegaResidual, int]:
    members: dict[OmegaResidual, int] = {}
    for index, stack in enumerate(stacks):
        if not isinstance(stack, nn.Module):
            raise TypeError(
                f"stacks[{index}] must be an nn.Module, got {type(stack).__name__}"
            )
        for module in stack.modules():
            if not isinstance(module, OmegaResidual):
                continue
            if module in members:
                raise ValueError(
                    f"stacks {members[module]} and {index} both contain the same "
                    "OmegaResidual; pass stacks that do not overlap, e.g. "
                    "[model.encoder, model.decoder]"
                )
            members[module] = index
    outside = [name for name, module in residuals if module not in members]
    if outside:
        raise ValueError(
            f"OmegaResidual modules {outside} are in none of the given stacks; "
            "every residual of the model must belong to exactly one stack"
        )
    return members


def _profile(
    model: nn.Module,
    residuals: list[tuple[str, OmegaResidual]],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> list[_Call]:
    """One forward pass with every omega at 1, recording each residual's inputs."""
    names = {module: name for name, module in residuals}
    calls: list[_Call] = []

    def record(
        module: nn.Module,
        call_args: tuple[Any, ...],
        call_kwargs: dict[str, Any],
        output: Any,
    ) -> None:
        assert isinstance(module, OmegaResidual)
        x, f_x = _residual_inputs(call_args, call_kwargs)
        calls.append(_Call(names[module], module, _variance(x), _variance(f_x)))

    handles = [m.register_forward_hook(record, with_kwargs=True) for _, m in residuals]
    training = {submodule: submodule.training for submodule in model.modules()}
    try:
        with torch.no_grad():
            for _, module in residuals:
                module.omega.fill_(1.0)
            model.eval()
            model(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
        for submodule, mode in training.items():
            submodule.training = mode
    return calls


def _check_calls(
    residuals: list[tuple[str, OmegaResidual]], calls: list[_Call]
) -> None:
    counts = {name: 0 for name, _ in residuals}
    for call in calls:
        counts[call.name] += 1
    repeated = [name for name, count in counts.items() if count > 1]
    if repeated:
        raise ValueError(
            f"OmegaResidual modules {repeated} ran more than once in the profiling "
            "forward pass; each residual branch needs its own omega, so create one "
            "OmegaResidual per branch (e.g. admin_torch.as_module(...) in every "
            "layer's __init__) instead of reusing one"
        )
    missed = [name for name, count in counts.items() if count == 0]
    if missed:
        raise ValueError(
            f"the profiling batch did not reach OmegaResidual modules {missed}; "
            "pass inputs whose forward pass runs every residual (e.g. both the "
            "source and target of an encoder-decoder)"
        )
    bad = [
        c.name
        for c in calls
        if not (math.isfinite(c.x_variance) and math.isfinite(c.f_x_variance))
    ]
    if bad:
        raise ValueError(
            f"non-finite values reached the residuals {bad} during profiling; "
            "check the model and the batch for NaN or inf"
        )


def profile_init(
    model: nn.Module,
    args: Any = (),
    kwargs: dict[str, Any] | None = None,
    *,
    stacks: Sequence[nn.Module] | None = None,
) -> dict[str, float]:
    """Set every ``OmegaResidual``'s omega from branch variances on a batch.

    Runs ``model(*args, **kwargs)`` once in eval mode under ``torch.no_grad()``
    with every omega at 1, records the variance of the shortcut input ``x`` and
    of the branch output ``f_x`` at each :class:`OmegaResidual` in the order the
    forward pass calls them, then sets, within each stack,

    .. math::
        \\omega_i = \\sqrt{\\operatorname{Var}[x_0]
            + \\textstyle\\sum_{j<i} \\operatorname{Var}[f_j(x_{j-1})]}

    where ``x_0`` is the shortcut input of the stack's first residual. Variances are
    population variances over every element of the tensor, in float64. A trainable
    (vector) omega has every entry set to the same value.

    Only the omegas change: no other parameter or buffer is touched (the pass runs
    in eval mode, so e.g. batch-norm statistics are not updated), and each
    submodule's training mode is restored. The result is deterministic for a
    deterministic model. If anything fails, the omegas are restored too.

    Call it once, after building the model and before wrapping it with
    ``torch.compile`` or DDP; with several processes, profile on the same batch on
    every rank (or broadcast the model afterwards) so the omegas agree.

    Args:
        model: the network whose residual connections are ``OmegaResidual``
            modules (e.g. from :func:`admin_torch.as_module`; omegas registered with
            ``as_buffer``/``as_parameter`` are plain tensors and cannot be found).
        args: positional inputs of ``model.forward``; a single tensor may be passed
            without a tuple.
        kwargs: keyword inputs of ``model.forward``.
        stacks: submodules whose residuals accumulate variance separately, e.g.
            ``[model.encoder, model.decoder]`` for an encoder-decoder; every
            ``OmegaResidual`` must be in exactly one. Default: the whole model is one
            stack.

    Returns:
        The omega set on each ``OmegaResidual``, keyed by its name in
        ``model.named_modules()``, in forward execution order (also logged at INFO
        on the ``admin_torch.profiling`` logger).

    Raises:
        TypeError: ``model`` (or a stack) is not an ``nn.Module``.
        ValueError: the model has no ``OmegaResidual``; the batch does not reach
            every residual; a residual runs more than once per forward pass; stacks
            overlap or miss a residual; a variance is not finite or is zero.

    Example::

        >>> import torch
        >>> from torch import nn
        >>> import admin_torch
        >>> class PostLNBlock(nn.Module):
        ...     def __init__(self, dim, num_res_layers):
        ...         super().__init__()
        ...         self.ffn = nn.Linear(dim, dim)
        ...         self.residual = admin_torch.as_module(num_res_layers)
        ...         self.norm = nn.LayerNorm(dim)
        ...
        ...     def forward(self, x):
        ...         return self.norm(self.residual(x, self.ffn(x)))
        >>> _ = torch.manual_seed(0)
        >>> model = nn.Sequential(*[PostLNBlock(16, 3) for _ in range(3)])
        >>> omegas = admin_torch.profile_init(model, torch.randn(64, 16))
        >>> list(omegas)
        ['0.residual', '1.residual', '2.residual']
        >>> round(omegas["0.residual"], 1)  # sqrt(Var[x_0]) for a unit-normal batch
        1.0
        >>> bool(omegas["2.residual"] > omegas["1.residual"] > omegas["0.residual"])
        True
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    residuals = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, OmegaResidual)
    ]
    if not residuals:
        raise ValueError(
            f"{type(model).__name__} has no OmegaResidual modules to profile; build "
            "its residual connections with admin_torch.as_module(...) and call them "
            "as residual(x, f_x)"
        )
    stack_of = _stack_of_each(residuals, [model] if stacks is None else stacks)
    if kwargs is None:
        kwargs = {}
    if not isinstance(args, tuple):
        args = (args,)

    originals = {module: module.omega.detach().clone() for _, module in residuals}
    try:
        calls = _profile(model, residuals, args, kwargs)
        _check_calls(residuals, calls)
        omegas = _assign(calls, stack_of)
    except BaseException:
        with torch.no_grad():
            for module, omega in originals.items():
                module.omega.copy_(omega)
        raise
    return omegas


def _assign(calls: list[_Call], stack_of: dict[OmegaResidual, int]) -> dict[str, float]:
    accumulated: dict[int, float] = {}
    omegas: dict[str, float] = {}
    for call in calls:
        stack = stack_of[call.module]
        # the first residual of a stack counts its input x_0 as branch zero
        total = accumulated.get(stack, call.x_variance)
        if not total > 0:
            raise ValueError(
                f"the accumulated variance before {call.name!r} is {total}; the "
                "stack's input has zero variance, so omega would be zero: profile "
                "with a real batch, not zeros"
            )
        omegas[call.name] = math.sqrt(total)
        accumulated[stack] = total + call.f_x_variance
        logger.info(
            "admin profiling: %s Var[x]=%.4g Var[f_x]=%.4g omega=%.4g",
            call.name,
            call.x_variance,
            call.f_x_variance,
            omegas[call.name],
        )
    with torch.no_grad():
        for call in calls:
            call.module.omega.fill_(omegas[call.name])
    return omegas
