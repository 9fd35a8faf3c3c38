"""``unit_scale``: turn an existing ``nn.Module`` into a unit-scaled one."""

from __future__ import annotations

import inspect
import logging
import operator
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import Tensor, nn
from torch.fx import Graph, GraphModule, Node

from .. import functional as U
from ._dynamo import GraphPass, apply_transform, transform_state
from ._graph import (
    all_ancestors,
    ancestors_between,
    example_value,
    have_common_ancestor,
    is_add,
    is_float_tensor_node,
    node_index,
    retarget,
)
from ._library import (
    AttentionFunctions,
    TransposedLinear,
    opaque_library_functions,
    opaque_rewrite_functions,
    rewrite_library_modules,
)

__all__ = ["unit_scale"]

logger = logging.getLogger(__name__)
M = TypeVar("M", bound=nn.Module)

# Tensor methods with a unit-scaled equivalent taking the tensor first.
_METHOD_MAP: dict[str, Callable[..., Any]] = {
    "softmax": U.softmax,
    "matmul": U.matmul,
    "bmm": U.bmm,
    "relu": U.relu,
    "tanh": U.tanh,
    "sigmoid": U.sigmoid,
    "__matmul__": U.matmul,
}
# Ops whose presence in a residual branch marks it as self-attention (tau 0.01).
_ATTENTION = {U.scaled_dot_product_attention, U.softmax}
# Ops with a weight: a residual branch contains at least one of these (this keeps
# hand-written formulas such as `x + 0.044715 * x**3` from passing as residuals).
_WEIGHTED = {
    U.linear,
    U.linear_readout,
    U.matmul,
    U.bmm,
    U.einsum,
    U.conv1d,
    U.conv2d,
    U.scaled_dot_product_attention,
    U.embedding,
}
_ADD_TARGETS = {operator.add, operator.iadd, torch.add}

# Every unit-scaled function is kept opaque while tracing, so that the F.* calls
# inside it are not unit-scaled a second time. (residual_apply takes a function,
# which cannot be a graph argument; Dynamo traces it into its opaque parts.)
UNIT_SCALED_FUNCTIONS: tuple[Callable[..., Any], ...] = tuple(
    getattr(U, name)
    for name in U.__all__
    if callable(getattr(U, name)) and name != "residual_apply"
)


def _replace_functions(
    graph: Graph, replace: dict[Callable[..., Any], Any], found: set[Any]
) -> None:
    for node in graph.nodes:
        if node.op == "call_function" and node.target in replace:
            found.add(node.target)
            target = replace[node.target]
            logger.info(
                "replacing function: %s with %s",
                node,
                getattr(target, "__name__", target),
            )
            retarget(node, target)


def _replace_with_unit_scaled(graph: Graph) -> None:
    for node in graph.nodes:
        if is_add(node):
            continue  # adds are handled once residuals are known
        target: Callable[..., Any] | None = None
        if node.op == "call_function" and node.target in U.torch_map:
            target = U.torch_map[node.target]
        elif node.op == "call_method" and node.target in _METHOD_MAP:
            target = _METHOD_MAP[node.target]
        if target is not None:
            logger.info("unit scaling function: %s", node)
            retarget(node, target)
            if target is U.scaled_dot_product_attention:
                _keep_attention_temperature(node)
            if "inplace" in inspect.signature(target).parameters and _get_argument(
                node, "inplace"
            ):
                # Unit-scaled ops are out of place; the graph already uses the
                # returned value, which is what in-place activations return.
                _set_argument(node, "inplace", False)


def _keep_attention_temperature(node: Node) -> None:
    """Pass torch's default ``scale`` explicitly, so that the model keeps its own
    softmax temperature (see ``U.scaled_dot_product_attention``)."""
    if node.kwargs.get("scale") is not None or len(node.args) > 6:
        return
    query = example_value(node.args[0] if node.args else node.kwargs.get("query"))
    if isinstance(query, Tensor) and isinstance(query.shape[-1], int):
        node.kwargs = {**node.kwargs, "scale": query.shape[-1] ** -0.5}


def _branch_targets(branch: set[Node]) -> set[Any]:
    return {n.target for n in branch if n.op == "call_function"}


def _find_residual(add: Node, index: dict[Node, int]) -> tuple[int, set[Node]] | None:
    """``(skip_arg_position, branch_nodes)`` if ``add`` is a residual add."""
    if len(add.args) < 2 or add.kwargs.get("alpha", 1) != 1:
        return None
    left, right = add.args[:2]
    if not (is_float_tensor_node(left) and is_float_tensor_node(right)):
        return None
    assert isinstance(left, Node) and isinstance(right, Node)
    for skip_pos, (skip, residual) in enumerate(((left, right), (right, left))):
        branch = ancestors_between(residual, skip, index)
        if branch is not None and _branch_targets(branch) & _WEIGHTED:
            return skip_pos, branch
    return None


def _unit_scale_residual(
    graph: Graph, add: Node, skip_pos: int, branch: set[Node]
) -> None:
    skip = add.args[skip_pos]
    residual = add.args[1 - skip_pos]
    assert isinstance(skip, Node) and isinstance(residual, Node)
    tau = 0.01 if _branch_targets(branch) & _ATTENTION else 0.5
    logger.info("unit scaling function: %s (residual-add, tau=%s)", add, tau)
    with graph.inserting_after(skip):
        split = graph.call_function(U.residual_split, (skip, tau))
    with graph.inserting_after(split):
        branch_input = graph.call_function(operator.getitem, (split, 0))
    with graph.inserting_after(branch_input):
        skip_output = graph.call_function(operator.getitem, (split, 1))
    for user in list(skip.users):
        if user in branch and user is not add:
            user.replace_input_with(skip, branch_input)
    retarget(add, U.residual_add, args=(residual, skip_output, tau), kwargs={})


def _carries_gradient(node: Any) -> bool:
    value = example_value(node)
    return isinstance(value, Tensor) and value.requires_grad


def _unit_scale_add(node: Node, index: dict[Node, int]) -> None:
    """Replace ``a + b`` by ``U.add`` when ``a`` and ``b`` are independent
    activations: ``U.add`` divides by ``sqrt 2``, which is right only then.

    Left alone: adding a constant (a mask, a position table) or a parameter (a
    bias), and adding two terms derived from a common activation, such as the
    ``q * cos + rotate(q) * sin`` of rotary embeddings, whose sum keeps the
    scale of ``q``.
    """
    left, right = node.args[:2]
    if not (_carries_gradient(left) and _carries_gradient(right)):
        return
    assert isinstance(left, Node) and isinstance(right, Node)
    if node.kwargs.get("alpha", 1) != 1 or any(
        isinstance(example_value(a), nn.Parameter) for a in (left, right)
    ):
        return
    if have_common_ancestor(left, right, index, _carries_gradient):
        logger.info("keeping add of correlated terms: %s", node)
        return
    logger.info("unit scaling function: %s", node)
    retarget(node, U.add, args=(left, right), kwargs={})


def _unconstrain_after_last_residual(graph: Graph) -> None:
    residual_adds = [n for n in graph.nodes if n.target is U.residual_add]
    before = all_ancestors(residual_adds)
    for node in graph.nodes:
        if node in before or node.op != "call_function":
            continue
        target = node.target
        if callable(target) and target in _CONSTRAINED:
            logger.info("unconstraining node: %s", node)
            _set_argument(node, "constraint", None)


def _get_argument(node: Node, name: str) -> Any:
    """Argument ``name`` of a call node (``None`` if not given)."""
    position = list(inspect.signature(node.target).parameters).index(name)  # type: ignore[arg-type]
    if position < len(node.args):
        return node.args[position]
    return node.kwargs.get(name)


def _set_argument(node: Node, name: str, value: Any) -> None:
    """Set argument ``name`` of a call node, wherever it was passed."""
    position = list(inspect.signature(node.target).parameters).index(name)  # type: ignore[arg-type]
    if position < len(node.args):
        node.args = (*node.args[:position], value, *node.args[position + 1 :])
    else:
        node.kwargs = {**node.kwargs, name: value}


_CONSTRAINED = {
    fn
    for fn in UNIT_SCALED_FUNCTIONS
    if "constraint" in inspect.signature(fn).parameters
}


def _unit_scaling_pass(
    replace: dict[Callable[..., Any], Any], found: set[Any]
) -> GraphPass:
    def run(gm: GraphModule) -> GraphModule:
        graph = gm.graph
        _replace_functions(graph, replace, found)
        _replace_with_unit_scaled(graph)
        index = node_index(graph)
        residuals = {}
        for node in graph.nodes:
            if is_add(node):
                residual = _find_residual(node, index)
                if residual is not None:
                    residuals[node] = residual
        for node in list(graph.nodes):
            if node in residuals:
                _unit_scale_residual(graph, node, *residuals[node])
            elif is_add(node):
                _unit_scale_add(node, index)
        _unconstrain_after_last_residual(graph)
        return gm

    return run


def _unit_init_weights(module: nn.Module) -> None:
    """Unit-scale weights of linear-like layers and zero their biases."""
    seen: set[int] = set()
    for name, sub in module.named_modules():
        weights = _weights_of(sub)
        for attr in weights:
            param = getattr(sub, attr, None)
            if (
                isinstance(param, Tensor)
                and id(param) not in seen
                and param.numel() > 1
            ):
                seen.add(id(param))
                logger.info("unit scaling weight: %s", _join(name, attr))
                with torch.no_grad():
                    param.div_(param.std())
        for attr in _biases_of(sub):
            param = getattr(sub, attr, None)
            if isinstance(param, Tensor) and id(param) not in seen:
                seen.add(id(param))
                logger.info("setting bias to zero: %s", _join(name, attr))
                with torch.no_grad():
                    param.zero_()


def _join(prefix: str, attr: str) -> str:
    return f"{prefix}.{attr}" if prefix else attr


def _is_hf_conv1d(module: nn.Module) -> bool:
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf")


def _weights_of(module: nn.Module) -> tuple[str, ...]:
    if isinstance(
        module,
        (
            nn.Linear,
            nn.Embedding,
            nn.modules.conv._ConvNd,
            nn.Bilinear,
            TransposedLinear,
        ),
    ) or _is_hf_conv1d(module):
        return ("weight",)
    if isinstance(module, (nn.MultiheadAttention, AttentionFunctions)):
        return ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight")
    return ()


def _biases_of(module: nn.Module) -> tuple[str, ...]:
    if isinstance(
        module, (nn.Linear, nn.modules.conv._ConvNd, nn.Bilinear, TransposedLinear)
    ) or _is_hf_conv1d(module):
        return ("bias",)
    if isinstance(module, (nn.MultiheadAttention, AttentionFunctions)):
        return ("in_proj_bias", "bias_k", "bias_v")
    return ()


_PASS_PRIORITY = {"unit_scale": 0, "simulate_format": 1, "track_scales": 2}


def _order_transforms(passes: list[tuple[str, GraphPass]]) -> None:
    """Unit scaling runs before quantisation, and scale tracking runs last."""
    names = [name for name, _ in passes]
    passes.sort(key=lambda p: _PASS_PRIORITY.get(p[0], 1))
    if [name for name, _ in passes] != names:
        logger.info(
            "reordering transforms: %s -> %s", names, [name for name, _ in passes]
        )


def unit_scale(module: M, replace: dict[Callable[..., Any], Any] | None = None) -> M:
    """Return a unit-scaled copy of ``module``.

    Traces ``module`` with TorchDynamo (recursing into submodules and functional
    calls) and rewrites the captured graph in five stages:

    #. **User replacements**: calls to each key of ``replace`` become calls to its
       value (keys are kept opaque while tracing, so they appear as single calls).
    #. **Unit-scaled functions**: every function with an equivalent in
       :mod:`unit_scaling.functional` is replaced by it.
    #. **Residual adds**: an add ``x + f(x)`` whose branch ``f`` depends on ``x``
       and contains a weighted op is replaced by ``U.residual_split`` /
       ``U.residual_add`` (``tau = 0.01`` if the branch contains attention or
       softmax, else ``0.5``). Other adds of two gradient-carrying activations
       become ``U.add``; adds of constants (masks, biases) are left alone.
    #. **Unconstraining**: every op after the last residual add is
       unconstrained (``constraint=None``), which is valid there and gives
       better scaling.
    #. **Weights**: weights of ``Linear``, ``Embedding``, convolution,
       ``MultiheadAttention`` and Hugging Face ``Conv1D`` layers are rescaled to
       unit standard deviation and their biases zeroed.

    Known library constructs are first rewritten into the torch functions they
    compute (for example Hugging Face's tanh-approximated GELU and RMSNorm
    classes), so that stage 2 recognises them.

    The input module is never modified; the result has independent parameters.
    Decisions are logged at INFO on this module's logger. Composes with the other
    transforms in any order (unit scaling always runs before quantisation), and
    the result also runs under plain ``torch.compile``.

    Args:
        module: the module to unit-scale.
        replace: functions to substitute, ``{original: replacement}``. A key may
            also be an ``nn.Module`` subclass, whose instances then call the
            replacement (with the module's forward arguments) instead.

    Example::

        >>> model = unit_scale(nn.Sequential(nn.Linear(64, 64), nn.GELU()))
        >>> model(torch.randn(8, 64)).shape
        torch.Size([8, 64])
    """
    replace = dict(replace or {})
    if not isinstance(module, nn.Module):
        raise TypeError(f"unit_scale expects an nn.Module, got {type(module).__name__}")
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
    found: set[Any] = set()
    result = apply_transform(
        module,
        "unit_scale",
        _unit_scaling_pass(function_replacements, found),
        non_recurse=(
            *UNIT_SCALED_FUNCTIONS,
            *function_replacements,
            *opaque_library_functions(module),
            *opaque_rewrite_functions(),
        ),
        order=_order_transforms,
    )
    state = transform_state(result)
    assert state is not None

    def check_replacements(state: Any) -> None:
        for key in function_replacements.keys() - found:
            warnings.warn(
                f"unit_scale: replace key {getattr(key, '__qualname__', key)!r} was "
                "never called in the traced forward pass, so nothing was replaced "
                "(is it the function the model calls, e.g. the same object?)",
                UserWarning,
                stacklevel=2,
            )

    state.after_first_call.append(check_replacements)
    matched = rewrite_library_modules(result, module_replacements)
    for cls in module_replacements.keys() - matched:
        warnings.warn(
            f"unit_scale: replace key {cls.__qualname__} matched no submodule",
            UserWarning,
            stacklevel=2,
        )
    _unit_init_weights(result)
    return result
