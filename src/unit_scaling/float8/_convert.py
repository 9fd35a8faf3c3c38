"""The entry point: :func:`convert_to_float8_training`, which swaps a model's
unit-scaled layers for their FP8 modules, or retargets the graph of a
``unit_scale`` output to the FP8 functions."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from torch import Tensor, nn
from torch.fx import GraphModule

from .. import functional as U
from .._fx_names import module_path
from ..modules import MHSA, Linear, LinearReadout
from ..transforms._capture.engine import (
    M,
    Place,
    Transform,
    extend_in_place,
    transform_state,
)
from ..transforms._capture.graph import example_value
from ..transforms._capture.opaque import UNIT_SCALED_FUNCTIONS
from . import _gemm
from ._attention import scaled_dot_product_attention
from ._config import Float8Config, check_config
from ._linear import linear, linear_readout
from ._modules import Float8Layer, Float8Linear, Float8LinearReadout, Float8MHSA

# One logger for the whole package, whichever of its modules warns.
logger = logging.getLogger("unit_scaling.float8")

Filter = Callable[[nn.Module, str], bool]


def _warn_kept(kept: list[str]) -> None:
    if kept:
        logger.warning(
            "convert_to_float8_training: %d layer(s) have sizes that are not "
            "multiples of 16 and stay in high precision: %s (pass "
            'Float8Config(unsupported_shapes="pad") to pad them instead)',
            len(kept),
            ", ".join(kept),
        )


def _bound(
    fn: Callable[..., Tensor], config: Float8Config, exact: Callable[..., Tensor]
) -> Callable[..., Tensor]:
    """``fn`` with ``config`` bound, as a graph target (a graph's code prints
    its arguments, and a config is not a literal). Its ``high_precision``
    attribute is ``exact``, the unit-scaled function it computes in FP8 (what
    :func:`unit_scaling.export.to_plain` folds)."""

    def run(*args: Any, **kwargs: Any) -> Tensor:
        return fn(*args, **kwargs, config=config)

    run.__name__ = run.__qualname__ = f"float8_{fn.__name__}"
    run.high_precision = exact  # type: ignore[attr-defined]
    return run


def _float8_pass(config: Float8Config, keep: Filter | None, root: nn.Module) -> Any:
    """Retarget the captured graph's ``U.linear`` and ``U.linear_readout`` calls
    to their FP8 versions (those ``keep`` accepts, by their module)."""
    targets: dict[Callable[..., Tensor], Callable[..., Tensor]] = {
        U.linear: _bound(linear, config, U.linear),
        U.linear_readout: _bound(linear_readout, config, U.linear_readout),
    }
    if config.attention:
        targets[U.scaled_dot_product_attention] = _bound(
            scaled_dot_product_attention, config, U.scaled_dot_product_attention
        )

    def run(gm: GraphModule) -> GraphModule:
        kept: list[str] = []
        for node in gm.graph.nodes:
            if node.op != "call_function" or node.target not in targets:
                continue
            path = module_path(node)
            if keep is not None:
                try:
                    owner = root.get_submodule(path)
                except AttributeError:
                    owner = root
                if not keep(owner, path):
                    continue
            is_attention = node.target is U.scaled_dot_product_attention
            node.target = targets[node.target]
            if is_attention:
                continue
            weight = node.args[1] if len(node.args) > 1 else node.kwargs.get("weight")
            shape = getattr(example_value(weight), "shape", None)
            keeps = config.unsupported_shapes == "keep"
            if shape is not None and keeps and not _gemm.fits(shape[1], shape[0]):
                kept.append(f"{path or node.name} ({shape[1]} -> {shape[0]})")
        _warn_kept(kept)
        return gm

    return run


def convert_to_float8_training(
    module: M,
    *,
    config: Float8Config | None = None,
    module_filter_fn: Filter | None = None,
) -> M:
    """Run ``module``'s unit-scaled linear layers in real FP8, **in place**.

    A module conversion (as torchao's of the same name), not a graph transform:
    each :class:`unit_scaling.Linear` (and ``LinearReadout``) becomes a
    :class:`Float8Linear` (``Float8LinearReadout``) that keeps its parameters,
    tags and hooks; in a model made by :func:`unit_scaling.transforms.unit_scale`
    the graph's ``U.linear`` calls run in FP8 from the next call on (after
    ``unit_scale``, before ``track_scales``; do not combine it with
    ``simulate_fp8``). Attention's matrix products stay in high precision
    unless ``config.attention`` asks for FP8: then each :class:`unit_scaling.MHSA`
    becomes a :class:`Float8MHSA`, and the graph's unit-scaled attention calls
    run :func:`scaled_dot_product_attention`. Convert before ``fully_shard``.
    A layer whose sizes are not multiples of 16 is kept in high precision (or
    padded, see :class:`Float8Config`) and named in a warning.

    Args:
        module: the model (changed in place).
        config: the FP8 formats and GEMMs (default :class:`Float8Config`).
        module_filter_fn: ``fn(layer, fqn) -> bool``; only layers (and
            attention modules) it accepts are converted.

    Returns:
        ``module``.

    Example::

        >>> model = convert_to_float8_training(nn.Sequential(uu.Linear(64, 64)))
        >>> model(torch.randn(4, 64)).shape
        torch.Size([4, 64])
    """
    if not isinstance(module, nn.Module):
        raise TypeError(
            "convert_to_float8_training: module must be an nn.Module, got "
            f"{type(module).__name__}"
        )
    config = check_config("convert_to_float8_training", config)
    from torch.distributed.fsdp import FSDPModule

    if any(isinstance(m, FSDPModule) for m in module.modules()):
        raise ValueError(
            "convert_to_float8_training: module is already sharded by fully_shard; "
            "convert it first, then shard"
        )
    if transform_state(module) is not None:
        extend_in_place(
            module,
            Transform(
                name="float8",
                place=Place.QUANTISE,
                graph_pass=_float8_pass(config, module_filter_fn, module),
                non_recurse=UNIT_SCALED_FUNCTIONS,
            ),
        )
        return module
    kept = []
    for fqn, sub in module.named_modules():
        if module_filter_fn is not None and not module_filter_fn(sub, fqn):
            continue
        if config.attention and type(sub) is MHSA:
            sub.__class__ = Float8MHSA
            object.__setattr__(sub, "float8_config", config)
        if not isinstance(sub, Linear) or isinstance(sub, Float8Layer):
            continue
        keeps = config.unsupported_shapes == "keep"
        if keeps and not _gemm.fits(sub.in_features, sub.out_features):
            kept.append(f"{fqn} ({sub.in_features} -> {sub.out_features})")
        sub.__class__ = (
            Float8LinearReadout if isinstance(sub, LinearReadout) else Float8Linear
        )
        object.__setattr__(sub, "float8_config", config)
    _warn_kept(kept)
    return module
