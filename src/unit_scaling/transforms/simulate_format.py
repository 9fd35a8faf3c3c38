"""``simulate_format``, ``simulate_fp8``: matrix products on low-precision inputs."""

from __future__ import annotations

import fnmatch
import logging
import math
import operator
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.fx import Graph, GraphModule, Node

from .. import functional as U
from .._fx_names import module_path
from ..formats import (
    FP8_E4M3,
    FP8_E5M2,
    FPFormat,
    Product,
    Recipe,
    quantised_attention,
    quantised_conv,
    quantised_einsum,
    quantised_linear,
    quantised_matmul,
)
from ..functional._scaling import attention_scales
from ._capture.engine import (
    CaptureContext,
    CapturePass,
    GraphPass,
    M,
    Place,
    Transform,
    apply_transform,
)
from ._capture.graph import is_float_tensor_node, is_view_node
from ._capture.opaque import UNIT_SCALED_FUNCTIONS

__all__ = ["simulate_format", "simulate_fp8"]

logger = logging.getLogger(__name__)

# The ops that would run in the low-precision format on hardware.
_QUANTISED_FUNCTIONS = {
    F.linear,
    U.linear,
    U.linear_readout,
    torch.matmul,
    operator.matmul,
    U.matmul,
    torch.bmm,
    U.bmm,
    torch.addmm,
    torch.baddbmm,
    torch.einsum,
    U.einsum,
    F.scaled_dot_product_attention,
    U.scaled_dot_product_attention,
}
_QUANTISED_METHODS = {"matmul", "__matmul__", "bmm"}


def _quantiser(fwd: FPFormat, bwd: FPFormat) -> Callable[[Tensor], Tensor]:
    """A graph target quantising its input to ``fwd`` and its gradient to ``bwd``."""

    def quantise(x: Tensor) -> Tensor:
        return fwd.quantise_fwd(bwd.quantise_bwd(x))

    quantise.__name__ = quantise.__qualname__ = f"quantise_{fwd}_{bwd}".replace(
        "-", "_"
    )
    return quantise


def _quantise_inputs(
    graph: Graph, node: Node, quantise: Callable[[Tensor], Tensor]
) -> None:
    def wrap(arg: Any) -> Any:
        if not is_float_tensor_node(arg):
            return arg
        with graph.inserting_before(node):
            return graph.call_function(quantise, (arg,))

    node.args = tuple(wrap(a) for a in node.args)
    node.kwargs = {k: wrap(v) for k, v in node.kwargs.items()}


def _quantisation_pass(fwd: FPFormat, bwd: FPFormat) -> GraphPass:
    quantise = _quantiser(fwd, bwd)

    def run(gm: GraphModule) -> GraphModule:
        for node in list(gm.graph.nodes):
            if (node.op == "call_function" and node.target in _QUANTISED_FUNCTIONS) or (
                node.op == "call_method" and node.target in _QUANTISED_METHODS
            ):
                logger.info("quantising function: %s", node)
                _quantise_inputs(gm.graph, node, quantise)
        return gm

    return run


# The products a recipe quantises, by how their quantised form runs.
_LINEARS = {F.linear, U.linear, U.linear_readout}
_ADDMMS = {torch.addmm, torch.baddbmm}
_MATMULS = {torch.matmul, operator.matmul, U.matmul, torch.bmm, U.bmm}
_EINSUMS = {torch.einsum, U.einsum}
_ATTENTIONS = {F.scaled_dot_product_attention, U.scaled_dot_product_attention}
_METHODS = {"matmul": torch.matmul, "__matmul__": torch.matmul, "bmm": torch.bmm}
_CONVS = {
    F.conv1d,
    F.conv2d,
    F.conv3d,
    torch.conv1d,
    torch.conv2d,
    torch.conv3d,
    U.conv1d,
    U.conv2d,
    U.conv3d,
}
_CONV_TRANSPOSES = {
    F.conv_transpose1d,
    F.conv_transpose2d,
    F.conv_transpose3d,
    torch.conv_transpose1d,
    torch.conv_transpose2d,
    torch.conv_transpose3d,
    U.conv_transpose1d,
    U.conv_transpose2d,
    U.conv_transpose3d,
}
_GROUPS_INDEX = 6  # conv's and conv_transpose's positional ``groups``


def _linear_target(
    target: Callable[..., Tensor], recipe: Recipe
) -> Callable[..., Tensor]:
    def run(
        input: Tensor, weight: Tensor, bias: Any = None, *a: Any, **k: Any
    ) -> Tensor:
        def linear(x: Tensor, w: Tensor, b: Any) -> Tensor:
            return target(x, w, b, *a, **k)

        return quantised_linear(input, weight, bias, recipe=recipe, linear=linear)

    return run


def _addmm_target(
    target: Callable[..., Tensor], recipe: Recipe
) -> Callable[..., Tensor]:
    def run(input: Tensor, left: Tensor, right: Tensor, **k: Any) -> Tensor:
        def addmm(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
            return target(b, x, w, **k)

        return quantised_matmul(left, right, input, recipe=recipe, matmul=addmm)

    return run


def _matmul_target(
    target: Callable[..., Tensor], recipe: Recipe
) -> Callable[..., Tensor]:
    def run(left: Tensor, right: Tensor, *a: Any, **k: Any) -> Tensor:
        def matmul(x: Tensor, w: Tensor) -> Tensor:
            return target(x, w, *a, **k)

        return quantised_matmul(left, right, recipe=recipe, matmul=matmul)

    return run


def _einsum_target(
    target: Callable[..., Tensor], recipe: Recipe
) -> Callable[..., Tensor]:
    def run(equation: str, left: Tensor, right: Tensor, **k: Any) -> Tensor:
        def einsum(e: str, x: Tensor, w: Tensor) -> Tensor:
            return target(e, x, w, **k)

        return quantised_einsum(equation, left, right, recipe=recipe, einsum=einsum)

    return run


def _conv_target(
    target: Callable[..., Tensor], recipe: Recipe, transposed: bool
) -> Callable[..., Tensor]:
    def run(
        input: Tensor, weight: Tensor, bias: Any = None, *a: Any, **k: Any
    ) -> Tensor:
        groups = k.get("groups", a[_GROUPS_INDEX - 3] if len(a) > 3 else 1)

        def conv(x: Tensor, w: Tensor, b: Any, *args: Any) -> Tensor:
            return target(x, w, b, *args, **k)

        return quantised_conv(
            input,
            weight,
            bias,
            *a,
            recipe=recipe,
            conv=conv,
            transposed=transposed,
            groups=groups,
        )

    return run


def _attention_target(target: Callable[..., Any], recipe: Recipe) -> Callable[..., Any]:
    def run(
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attn_mask: Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
        mult: float = 1.0,
    ) -> Tensor:
        args = (query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        if target is F.scaled_dot_product_attention:
            return quantised_attention(*args, recipe=recipe)
        if attn_mask is not None and attn_mask.requires_grad:
            # A learned mask's gradient scale is U's own; keep the whole op,
            # and say so (once per call site, Python's default).
            warnings.warn(
                "simulate_format: an attention whose mask is learned (needs a "
                "gradient) stays in high precision: its two products are not "
                "quantised by the recipe",
                UserWarning,
                stacklevel=2,
            )
            exact: Tensor = target(*args, mult=mult)
            return exact
        temperature, c = attention_scales("U.scaled_dot_product_attention", *args, mult)
        out = quantised_attention(*args[:6], temperature, enable_gqa, recipe=recipe)
        scaled: Tensor = out if isinstance(c, float) and c == 1 else out * c
        return scaled

    return run


def _is_parameter(node: Any, context: CaptureContext, inputs: dict[Node, Any]) -> bool:
    """Whether ``node`` is a parameter of the module, or a view of one."""
    while isinstance(node, Node) and node.op != "placeholder":
        if node.op == "get_attr":
            return True
        if not (is_view_node(node) or node.target in ("t", torch.t)):
            return False
        node = node.args[0]
    return isinstance(node, Node) and id(inputs.get(node)) in context.parameter_names


def _product_kind(
    node: Node, context: CaptureContext, inputs: dict[Node, Any]
) -> Product | None:
    """The kind of product ``node`` is under a recipe; ``None`` for nodes a
    recipe does not quantise."""
    target: Any = node.target
    if node.op == "call_method":
        if target not in _METHODS:
            return None
        target = _METHODS[str(target)]
    elif node.op != "call_function":
        return None
    if target is U.linear_readout:
        return "readout"
    if target in _LINEARS:
        return "linear"
    if target in _ATTENTIONS:
        return "attention"
    if target in _CONVS or target in _CONV_TRANSPOSES:
        return "conv"
    if target in _EINSUMS:
        equation, *operands = node.args
        if len(operands) == 1 and isinstance(operands[0], list | tuple):
            operands = list(operands[0])
        if len(operands) > 2 and isinstance(equation, str):
            warnings.warn(
                f"simulate_format: an einsum of {len(operands)} operands "
                f"({equation!r}) is not quantised by the recipe (it is not one "
                "GEMM); write it as a chain of two-operand einsums to quantise it",
                UserWarning,
                stacklevel=2,
            )
            return None
        if len(operands) != 2 or not isinstance(equation, str):
            return None
        terms = equation.replace(" ", "").replace("...", "").split("->")[0]
        if any(len(set(t)) != len(t) for t in terms.split(",")):
            return None  # a diagonal, not a GEMM
    elif target not in _ADDMMS and target not in _MATMULS:
        return None
    operands = [a for a in node.args if isinstance(a, Node)]
    if target in _ADDMMS:
        operands = operands[1:]
    if any(_is_parameter(a, context, inputs) for a in operands):
        return "linear"
    return "matmul"


class _RecipePass(CapturePass):
    """Each product a recipe quantises becomes its quantised form; the
    products of the modules it keeps in high precision stay as they are."""

    def __init__(self, recipe: Recipe, kept: tuple[str, ...]) -> None:
        self.recipe = recipe
        self.kept = kept
        self.targets: dict[Any, Callable[..., Any]] = {}

    def fresh(self) -> _RecipePass:
        return _RecipePass(self.recipe, self.kept)

    def _target(self, target: Callable[..., Tensor]) -> Callable[..., Tensor]:
        """``target`` computed on block-quantised operands, as a named function
        (FX names a graph's functions by their ``__name__``)."""
        for group, make in (
            (_LINEARS, _linear_target),
            (_ADDMMS, _addmm_target),
            (_MATMULS, _matmul_target),
            (_EINSUMS, _einsum_target),
            (_ATTENTIONS, _attention_target),
        ):
            if target in group:
                run = make(target, self.recipe)
        if target in _CONVS or target in _CONV_TRANSPOSES:
            run = _conv_target(target, self.recipe, target in _CONV_TRANSPOSES)
        name = getattr(target, "__name__", "product")
        run.__name__ = run.__qualname__ = f"block_quantised_{name}"
        return run

    def _kept(self, node: Node) -> bool:
        parts = module_path(node).split(".")
        prefixes = [".".join(parts[: i + 1]) for i in range(len(parts))]
        return any(fnmatch.fnmatchcase(p, k) for p in prefixes for k in self.kept)

    def __call__(self, gm: GraphModule, context: CaptureContext) -> GraphModule:
        placeholders = gm.graph.find_nodes(op="placeholder")
        inputs = dict(zip(placeholders, context.example_inputs, strict=False))
        for node in list(gm.graph.nodes):
            kind = _product_kind(node, context, inputs)
            if kind is None:
                continue
            if kind not in self.recipe.products or self._kept(node):
                logger.info("keeping %s product in high precision: %s", kind, node)
                continue
            logger.info("quantising %s product: %s", kind, node)
            target: Any = node.target
            if node.op == "call_method":
                target = _METHODS[str(target)]
                node.op = "call_function"
            if target not in self.targets:
                self.targets[target] = self._target(target)
            node.target = self.targets[target]
        gm.recompile()
        return gm


def _last_blocks(module: nn.Module, fraction: float) -> tuple[str, ...]:
    """The paths of the last ``fraction`` (rounded up) of ``module``'s blocks,
    the items of its longest ``nn.ModuleList``."""
    lists = [
        (name, m) for name, m in module.named_modules() if isinstance(m, nn.ModuleList)
    ]
    if fraction == 0 or not lists:
        return ()
    name, blocks = max(lists, key=lambda item: len(item[1]))
    count = math.ceil(fraction * len(blocks))
    prefix = f"{name}." if name else ""
    return tuple(f"{prefix}{i}" for i in range(len(blocks) - count, len(blocks)))


def _output_head(module: nn.Module) -> tuple[str, ...]:
    """The path of ``module``'s output head: the module its
    ``get_output_embeddings()`` returns (Hugging Face models), else its last
    ``nn.Linear``; none if it has neither."""
    getter = getattr(module, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    linears = [n for n, m in module.named_modules() if isinstance(m, nn.Linear)]
    for name, found in module.named_modules():
        if head is not None and found is head:
            return (name,)
    return tuple(linears[-1:])


def simulate_format(
    module: M, fwd_format: FPFormat | Recipe, bwd_format: FPFormat | None = None
) -> M:
    """Return a copy of ``module`` whose matrix products see quantised inputs.

    With two :class:`~unit_scaling.formats.FPFormat` formats: the inputs of every
    linear layer, matmul and attention (plain torch ones and the unit-scaled
    ones) are rounded to ``fwd_format`` in the forward pass, and the gradients
    flowing back into those inputs to ``bwd_format``, simulating hardware that
    runs these ops in a low-precision format.

    With a :class:`~unit_scaling.formats.Recipe` (block-scaled formats): each of
    a product's three GEMMs quantises its two operands along its own
    contraction, the incoming gradient included, as the recipe says; biases and
    masks keep their precision, and so do the products of the kinds and modules
    the recipe leaves out. Linear layers, ``addmm``/``baddbmm``, matmul/bmm,
    two-operand einsums, ``scaled_dot_product_attention`` (run as explicit
    products, :func:`~unit_scaling.formats.quantised_attention`) and
    convolutions and their transposes (1-3-D, plain and unit-scaled:
    :func:`~unit_scaling.formats.quantised_conv`) are quantised.

    Everything else keeps its precision. Composes with the other transforms;
    unit scaling always runs first.

    Args:
        module: the module to transform (never modified).
        fwd_format: format of the forward-pass inputs, or a recipe.
        bwd_format: format of the gradients (with an ``FPFormat`` only).

    Example::

        >>> from unit_scaling.formats import FPFormat, MXFP4_RECIPE
        >>> model = simulate_format(nn.Linear(16, 16), FPFormat(4, 3, "nearest"),
        ...                         FPFormat(5, 2, "nearest"))
        >>> model(torch.randn(2, 16)).shape
        torch.Size([2, 16])
        >>> simulate_format(nn.Linear(64, 8), MXFP4_RECIPE)(torch.randn(2, 64)).shape
        torch.Size([2, 8])
    """
    if isinstance(fwd_format, Recipe):
        if bwd_format is not None:
            raise TypeError(
                "bwd_format must be None with a Recipe: the recipe names the "
                f"gradients' formats; got {bwd_format}"
            )
        kept = fwd_format.high_precision + _last_blocks(
            module, fwd_format.high_precision_last
        )
        if fwd_format.high_precision_head:
            kept += _output_head(module)
        graph_pass: GraphPass = _RecipePass(fwd_format, kept)
    else:
        for name, fmt in (("fwd_format", fwd_format), ("bwd_format", bwd_format)):
            if not isinstance(fmt, FPFormat):
                raise TypeError(
                    f"{name} must be an FPFormat (or fwd_format a Recipe), got "
                    f"{type(fmt).__name__}"
                )
        assert bwd_format is not None
        graph_pass = _quantisation_pass(fwd_format, bwd_format)
    transform = Transform(
        name="simulate_format",
        label="quantisation backend",
        place=Place.QUANTISE,
        graph_pass=graph_pass,
        non_recurse=UNIT_SCALED_FUNCTIONS,
    )
    return apply_transform(module, transform)


def simulate_fp8(module: M) -> M:
    """:func:`simulate_format` with the OCP FP8 formats hardware uses.

    Forward inputs in E4M3 (``torch.float8_e4m3fn``, max 448), gradients in E5M2
    (``torch.float8_e5m2``, max 57344), both rounded to nearest and saturating.
    No loss scaling is applied: a unit-scaled model needs none.

    Example::

        >>> model = simulate_fp8(nn.Linear(16, 16))
        >>> model(torch.randn(2, 16)).shape
        torch.Size([2, 16])
    """
    return simulate_format(module, FP8_E4M3, FP8_E5M2)
