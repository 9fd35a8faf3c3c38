"""``unit_scale``: turn an existing ``nn.Module`` into a unit-scaled one."""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

from .._torch_internals import pytree
from ..core.functional import transformer_residual_scaling_rule
from ..parameter import has_parameter_data
from ._capture.engine import (
    M,
    Place,
    Transform,
    apply_transform,
    transform_state,
)
from ._capture.library import LibraryRewrite
from ._capture.opaque import UNIT_SCALED_FUNCTIONS
from ._unit.checkpoint import KEY, decode, encode, record_in_config
from ._unit.graph_pass import UnitScalingPass
from ._unit.report import UnitScaleReport
from ._unit.setup import load_record, setup, unit_pass_of
from ._unit.tags import tag_added

__all__ = [
    "UNIT_SCALED_FUNCTIONS",
    "UnitScaleReport",
    "checkpoint_record",
    "load_checkpoint_record",
    "tag_added_parameters",
    "unit_scale",
    "unit_scale_report",
]

logger = logging.getLogger(__name__)


def unit_scale(
    module: M,
    replace: dict[Callable[..., Any], Any] | None = None,
    *,
    residual_scaling: str | Callable[[int, int], float] = "fixed",
    init_weights: bool | None = None,
) -> M:
    """Return a unit-scaled copy of ``module``.

    Traces ``module`` with TorchDynamo (recursing into submodules and functional
    calls) and rewrites each captured graph:

    #. **In-place ops** (``h += f(x)``, ``x.mul_(c)``, ``inplace=True``) become
       out-of-place, keeping torch's semantics (see ``transforms._unit.inplace``).
    #. **User replacements**: calls to each key of ``replace`` become calls to its
       value (keys are kept opaque while tracing, so they appear as single calls).
    #. **Analytic rules**: every op with an equivalent in
       :mod:`unit_scaling.functional` is replaced by it.
    #. **Residual adds**: found by dependency analysis, including parallel
       branches and projection shortcuts, and replaced by ``U.residual_split`` /
       ``U.residual_add`` (``tau = 0.01`` if a branch contains attention, else
       ``0.5``; or u-μP's depth-dependent rule, see ``residual_scaling``). Other
       adds of two independent activations become ``U.add``.
    #. **Parameters** whose role only the graph shows (expert weights used
       through ``F.linear``, layer-scale gains, position tables) are initialised
       for unit scale, once, at the first capture.
    #. **Calibration**: connected ops with no rule (soft-capping, rotary
       embeddings, hand-written activations, selective scans...) are run on
       unit-normal stand-ins and their outputs rescaled by the measured factor.
    #. **Unconstraining**: every op after the last residual add gets independent
       gradient scales (``constraint=None``).
    #. **Parameter gradients** of parameters used directly in activation ops are
       scaled by their broadcast expansion.

    ``Linear``, ``Embedding``, convolution and ``MultiheadAttention`` weights are
    rescaled to unit standard deviation and their biases zeroed when
    ``unit_scale`` is called — unless the weights were trained unit-scaled (see
    ``init_weights``).

    **Checkpoints.** The result's ``state_dict()`` carries a record of what
    ``unit_scale`` measured (calibrated scales, gradient corrections, which
    parameters it initialised) in its metadata, under ``"unit_scaling"``; a
    Hugging Face model also carries it in ``config.unit_scaling``, which
    ``save_pretrained`` writes to ``config.json``. Loading such a state dict into
    a ``unit_scale`` output (``load_state_dict``, or ``torch.load(...,
    weights_only=True)`` first: the metadata survives), or calling
    ``unit_scale`` on a model loaded by ``from_pretrained``, gives back the same
    function: the trained weights are kept and the recorded scales reused. For
    ``torch.distributed.checkpoint``, which keeps no metadata, save
    :func:`checkpoint_record` beside the tensors and give it to
    :func:`load_checkpoint_record` after loading them.

    Every parameter of the result carries **u-μP tags** (``mup_type``,
    ``mup_scaling_depth``), so ``uu.optim`` optimizers take its parameters as
    they take a native ``uu`` model's: from the layer that owns it (weights,
    biases, norm gains, embeddings, the readout after the repeated blocks; a
    depth for parameters inside them), else from its use in the graph at the
    first call, else by rank (matrix: weight, vector: bias), listed in
    ``unit_scale_report().tags`` (see ``unit_scaling.transforms._unit.tags``).

    Known library constructs are first rewritten into the torch functions they
    compute (Hugging Face's ``Conv1D``, tanh GELU and RMSNorm classes), validated
    numerically.

    What was done to every op and parameter is in ``model.unit_scale_report()``
    (a :class:`UnitScaleReport`); one WARNING names the ops left as they are.
    The input module is never modified; the result has independent parameters.
    Decisions are logged at INFO on this module's logger. Composes with the other
    transforms in any order (unit scaling always runs before quantisation), and
    the result also runs under plain ``torch.compile``.

    Args:
        module: the module to unit-scale.
        replace: functions to substitute, ``{original: replacement}``. A key may
            also be an ``nn.Module`` subclass, whose instances then call the
            replacement (with the module's forward arguments) instead.
        residual_scaling: the weight ``tau`` of each residual branch: ``"fixed"``
            (the default: 0.01 for attention branches, else 0.5), ``"u-μP"``
            (:func:`unit_scaling.transformer_residual_scaling_rule`'s
            depth-dependent weights) or a rule ``tau(index, branches)`` as
            :class:`unit_scaling.TransformerStack` takes. Branches are counted in
            each captured graph, in order.
        init_weights: whether to initialise the weights for unit scale.
            ``None`` (the default): yes, except for a model that records it was
            trained unit-scaled (a Hugging Face config with a ``unit_scaling``
            record: a checkpoint of a ``unit_scale`` output), whose weights and
            recorded scales are kept, and parameters that already carry u-μP tags
            (those of ``uu`` modules), which are unit-scaled by construction.
            ``True``: initialise every weight (a record's scales are ignored).
            ``False``: keep every weight as it is. The choice is logged.

    Example::

        >>> model = unit_scale(nn.Sequential(nn.Linear(64, 64), nn.GELU()))
        >>> model(torch.randn(8, 64)).shape
        torch.Size([8, 64])
    """
    replace = dict(replace or {})
    if not isinstance(module, nn.Module):
        raise TypeError(f"unit_scale expects an nn.Module, got {type(module).__name__}")
    rule = _residual_rule(residual_scaling)
    if init_weights is not None and not isinstance(init_weights, bool):
        raise TypeError(
            "unit_scale: init_weights must be None, True or False, got "
            f"{init_weights!r}"
        )
    found = record_in_config(module)
    where = f"{type(module).__name__}.config.{KEY}"
    record = (
        decode(found, where) if found is not None and init_weights is not True else None
    )
    for key, value in replace.items():
        if not callable(key) or not callable(value):
            raise TypeError(
                f"replace must map callables to callables, got {key!r}: {value!r}"
            )
    module_replacements = {
        k: v
        for k, v in replace.items()
        if isinstance(k, type) and issubclass(k, nn.Module)
    }
    function_replacements = {
        k: v for k, v in replace.items() if k not in module_replacements
    }

    def check_replacements(state: Any) -> None:
        unit_pass = state.pass_of(UnitScalingPass)
        for key in function_replacements.keys() - unit_pass.found:
            warnings.warn(
                f"unit_scale: replace key {getattr(key, '__qualname__', key)!r} was "
                "never called in the traced forward pass, so nothing was replaced "
                "(is it the function the model calls, e.g. the same object?)",
                UserWarning,
                stacklevel=2,
            )

    transform = Transform(
        name="unit_scale",
        label="unit scaling backend",
        place=Place.REWRITE,
        graph_pass=UnitScalingPass(
            function_replacements, rule, residual_name=_residual_name(residual_scaling)
        ),
        non_recurse=(*UNIT_SCALED_FUNCTIONS, *function_replacements),
        after_first_call=(
            check_replacements,
            lambda state: state.pass_of(UnitScalingPass).count_branches(state),
        ),
        after_call=(
            functools.partial(_watch_output_gradient, name=type(module).__name__),
            lambda state, output: state.pass_of(UnitScalingPass).check_shared_graphs(
                state, output
            ),
        ),
        attributes=(("unit_scale_report", _ReportOf),),
        rewrite=LibraryRewrite(tuple(module_replacements.items())),
        setup=functools.partial(
            setup,
            replaced=frozenset(module_replacements),
            record=record,
            where=where,
            init_weights=init_weights,
        ),
    )
    return apply_transform(module, transform)


def checkpoint_record(module: nn.Module) -> dict[str, Any]:
    """What ``unit_scale`` measured for ``module``, as plain JSON data.

    ``module.state_dict()`` carries it in its metadata already (and a Hugging
    Face model in ``config.unit_scaling``); this is for checkpoints that keep
    no metadata, such as ``torch.distributed.checkpoint``: save it beside the
    state dict (as JSON text there: ``json.dumps(checkpoint_record(model))``,
    which DCP stores as one object) and give it to :func:`load_checkpoint_record`
    after loading.

    Example::

        >>> model = unit_scale(nn.Sequential(nn.Linear(16, 16), nn.GELU()))
        >>> _ = model(torch.randn(4, 16))
        >>> checkpoint_record(model)["format"]
        2
    """
    return encode(unit_pass_of(module, "checkpoint_record").record())


def load_checkpoint_record(module: nn.Module, record: dict[str, Any]) -> None:
    """Give ``module`` (a ``unit_scale`` output holding trained weights) the
    ``record`` :func:`checkpoint_record` made: its parameters are not
    initialised again and the recorded scales are reused, so it computes the
    function the checkpointed model computed. A model that has run already
    captures its graphs again at its next call.

    Raises:
        ValueError: if ``module`` is not a ``unit_scale`` output, if ``record``
            is not a record, or if it was made with another ``residual_scaling``.

    Example::

        >>> trained = unit_scale(nn.Sequential(nn.Linear(16, 16), nn.GELU()))
        >>> x = torch.randn(4, 16)
        >>> y = trained(x)
        >>> again = unit_scale(nn.Sequential(nn.Linear(16, 16), nn.GELU()))
        >>> _ = again.load_state_dict(dict(trained.state_dict()))  # no metadata
        >>> load_checkpoint_record(again, checkpoint_record(trained))
        >>> torch.equal(again(x), y)
        True
    """
    load_record(module, record, "load_checkpoint_record")


def tag_added_parameters(module: nn.Module) -> list[str]:
    """Tag now the trainable parameters of ``module`` (a ``unit_scale`` output)
    that carry no u-μP tags, and return their names.

    Parameters that join a model after ``unit_scale`` (an adapter's, say
    ``get_peft_model(unit_scale(model), LoraConfig(...))``) are tagged at the
    model's next call, from the layer that owns them and their use in the
    graph. A :mod:`unit_scaling.optim` optimizer built before that call needs
    their tags first: this gives them as ``unit_scale`` would have had they
    been there (the next call may refine a tag its graph shows otherwise,
    with a warning to build the optimizer again). Parameters that carry tags
    are left alone.

    Raises:
        ValueError: if ``module`` was not made by ``unit_scale``.

    Example::

        >>> model = unit_scale(nn.Sequential(nn.Linear(8, 8), nn.GELU()))
        >>> model[0].register_parameter("extra", nn.Parameter(torch.randn(4, 8)))
        >>> tag_added_parameters(model)
        ['0.extra']
        >>> model[0].extra.mup_type
        'weight'
    """
    unit_pass = unit_pass_of(module, "tag_added_parameters")
    untagged: list[tuple[str, Tensor]] = [
        (name, p)
        for name, p in module.named_parameters()
        if p.requires_grad and not has_parameter_data(p)
    ]
    if untagged:
        unit_pass.report.tags.update(tag_added(module, untagged))
    return [name for name, _ in untagged]


def _residual_name(residual_scaling: str | Callable[[int, int], float]) -> str:
    """How a checkpoint's record names ``residual_scaling``."""
    if callable(residual_scaling):
        return "custom"
    return "u-μP" if residual_scaling == "u-muP" else residual_scaling


def _residual_rule(
    residual_scaling: str | Callable[[int, int], float],
) -> Callable[[int, int], float] | None:
    """The ``tau(index, branches)`` rule of ``residual_scaling``; ``None`` for
    the fixed weights."""
    if callable(residual_scaling):
        return residual_scaling
    if residual_scaling == "fixed":
        return None
    if residual_scaling in ("u-μP", "u-muP"):
        return transformer_residual_scaling_rule()
    raise ValueError(
        "unit_scale: residual_scaling must be 'fixed', 'u-μP' or a function "
        f"tau(index, branches), got {residual_scaling!r}"
    )


# How far from unit RMS the gradient arriving at the model's output may be
# before unit_scale warns (see _watch_output_gradient).
OUTPUT_GRADIENT_TOLERANCE = 8.0


def _watch_output_gradient(state: Any, output: Any, name: str = "model") -> None:
    """Check, once, the gradient that reaches the model's output in the first
    backward pass: a unit-scaled model assumes it is unit-scaled too. The usual
    culprit is a loss computed outside the model: a mean-reduced cross-entropy
    over N tokens divides every gradient by about N, pushing the whole backward
    pass below FP8's range. One check, one host sync, on the first gradient
    that arrives."""
    if state.flags.get("output_gradient_watched"):
        return
    tensors = [
        t
        for t in pytree.tree_leaves(output)
        if isinstance(t, Tensor) and t.is_floating_point() and t.requires_grad
    ]
    if not tensors:
        return
    state.flags["output_gradient_watched"] = True
    handles: list[Any] = []

    def check(grad: Tensor) -> None:
        if state.flags.get("output_gradient_checked"):
            return
        state.flags["output_gradient_checked"] = True
        for handle in handles:
            handle.remove()
        rms = float(grad.detach().float().square().mean().sqrt())
        if (
            rms == 0
            or 1 / OUTPUT_GRADIENT_TOLERANCE <= rms <= OUTPUT_GRADIENT_TOLERANCE
        ):
            return
        factor, where = (1 / rms, "below") if rms < 1 else (rms, "above")
        logger.warning(
            "The gradient reaching the output of the unit-scaled %s in its first "
            "backward pass has RMS %.3g, %.3gx %s unit scale, and every gradient "
            "inside the model inherits that factor (far enough off, they leave FP8's "
            "range). A loss computed outside the model is the usual cause: a "
            "mean-reduced cross-entropy over N tokens divides the gradient by about "
            "N. Compute the loss inside the model (for a Hugging Face model, pass "
            "labels=...), or use the unit-scaled loss "
            "unit_scaling.functional.cross_entropy(logits, targets), whose gradient "
            "is unit-scaled.",
            name,
            rms,
            factor,
            where,
        )

    handles.extend(
        t.register_hook(check)  # type: ignore[no-untyped-call]
        for t in tensors
    )


class _ReportOf:
    """``module.unit_scale_report()``: bound to the module's own transform state."""

    def __init__(self, state: Any) -> None:
        self._state = state

    def __call__(self) -> UnitScaleReport:
        """What ``unit_scale`` did to each op and parameter of the graphs captured
        so far (empty before the first call)."""
        unit_pass = self._state.pass_of(UnitScalingPass)
        assert unit_pass is not None
        report: UnitScaleReport = unit_pass.report
        return report

    def __deepcopy__(self, memo: dict[int, Any]) -> _ReportOf:
        import copy

        return _ReportOf(copy.deepcopy(self._state, memo))


def unit_scale_report(module: nn.Module) -> UnitScaleReport:
    """The :class:`UnitScaleReport` of a module returned by :func:`unit_scale`.

    Raises:
        TypeError: if ``module`` was not transformed by :func:`unit_scale`.

    Example::

        >>> model = unit_scale(nn.Linear(8, 8))
        >>> _ = model(torch.randn(2, 8))
        >>> unit_scale_report(model).counts()
        {'analytic': 1}
    """
    state = transform_state(module) if isinstance(module, nn.Module) else None
    unit_pass = state.pass_of(UnitScalingPass) if state is not None else None
    if unit_pass is None:
        raise TypeError(
            "unit_scale_report expects a module returned by unit_scale(...), got "
            f"{type(module).__name__}"
        )
    report: UnitScaleReport = unit_pass.report
    return report
