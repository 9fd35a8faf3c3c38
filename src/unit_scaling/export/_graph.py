"""The ratio equations of a captured unit-scaled graph.

The plain model is the same graph read with plain ops: each unit-scaled op
``U.f`` computes, in the forward pass, a constant ``s`` times its torch
counterpart, possibly with an input multiplied by a temperature ``mult``; ops
that only ``unit_scale`` inserts (``calibrated_scale``, ``scale_bwd``,
``residual_split``) are the identity in the plain model. For every node the
graph runs on parameter-dependent data, :func:`graph_equations` measures ``s``
(the unit-scaled op against its counterpart, on the same inputs) and probes how
the counterpart scales with each input (:mod:`._probe`), giving equations over
``R = log(plain value / unit-scaled value)``. Attention and the residual add
have rules of their own: the query-key product is invariant to ``q * r, k / r``
(which no probe of one input finds), and a residual add weighs its two inputs
differently.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import operator
from collections.abc import Callable, Hashable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.fx import GraphModule, Node

from .. import functional as U
from .._fx_names import module_path, target_name
from ..functional._scaling import attention_scales
from ..scale import scale_bwd, scale_fwd
from ..transforms._capture.targets import (
    broadcast_gradient,
    calibrated_scale,
    low_rank_update,
    repeated_gradient,
    sum_branches,
)
from ._probe import (
    Unit,
    flatten_call,
    output_units,
    pick,
    probe,
    proportion,
    unflatten_call,
    with_stand_ins,
)
from ._solver import RatioSystem

__all__ = [
    "AttentionSite",
    "GraphRatios",
    "attention_ratios",
    "attention_scale_at",
    "attention_temperature",
    "graph_equations",
]

# Arguments of unit-scaled ops that their torch counterparts do not take.
_EXTRAS = frozenset({"constraint", "scale_power", "mult", "input_is_zero"})
# Ops whose forward pass is already the plain one.
_IDENTITY_FORWARD = frozenset({scale_bwd, U.residual_split})


def _sum(branches: tuple[Tensor, ...]) -> Tensor:
    total = branches[0]
    for b in branches[1:]:
        total = total + b
    return total


def _grouped_mm(
    mat_a: Tensor, mat_b: Tensor, offs: Tensor | None, **unsupported: Any
) -> Tensor:
    """``torch._grouped_mm`` on any device and dtype: with ``offs``, the loop
    over the groups that ``U.grouped_mm`` runs off CUDA (its registered
    ``unit_scaling::grouped_mm_loop``). It takes ``U.grouped_mm``'s other
    arguments (``bias``, ``out_dtype``) only at ``None``."""
    if any(value is not None for value in unsupported.values()):
        raise ValueError("grouped_mm with bias or out_dtype")
    if offs is None:
        return torch.bmm(mat_a, mat_b)
    out: Tensor = torch.ops.unit_scaling.grouped_mm_loop(mat_a, mat_b, offs)
    return out


# Torch counterparts whose arguments do not mirror the unit-scaled op's names,
# or that torch does not have; every other op in ``U.torch_map`` is called by
# its arguments' names. Each takes the op's arguments, ours removed.
_COUNTERPARTS: dict[Callable[..., Any], Callable[..., Any]] = {
    U.matmul: lambda left, right: torch.matmul(left, right),
    U.grouped_mm: _grouped_mm,
    U.einsum: lambda equation, operands: torch.einsum(equation, *operands),
    U.linear_readout: F.linear,
    U.silu_glu: lambda input, gate: input * F.silu(gate),
    U.softcap: lambda input, cap: cap * torch.tanh(input / cap),
    U.sum: torch.sum,
    U.mean: torch.mean,
    calibrated_scale: lambda input, factor: input,
    broadcast_gradient: lambda input, others: input,
    repeated_gradient: lambda output, source: output,
    low_rank_update: lambda output, update, scaling: output + update * scaling,
    U.step_mean: lambda loss, count, step_count: loss / step_count,
    U.micro_batch_loss: lambda loss, fraction: loss * fraction,
    scale_fwd: lambda input, scale: input,
    sum_branches: _sum,
}
_TORCH = {unit: plain for plain, unit in reversed(U.torch_map.items())}
# The argument a temperature ``mult`` multiplies, where it is not ``input``.
_TEMPERED = {U.silu_glu: "gate"}


def _counterpart(op: Callable[..., Any]) -> Callable[..., Any] | None:
    return _COUNTERPARTS.get(op) or _TORCH.get(op)


def _float64(x: Any) -> Any:
    return x.double() if isinstance(x, Tensor) and x.is_floating_point() else x


@dataclasses.dataclass(frozen=True)
class AttentionSite:
    """A unit-scaled attention: its output scale ``c`` depends on the key
    length (and the mask), so it is folded at the example's length only."""

    origin: str
    head_dim: int
    key_length: int
    mask: str  # "none", "full", "causal", "window" (causal, `window` keys), "other"
    is_causal: bool
    dropout_p: float
    scale: float | None
    mult: float
    window: int = 0


def attention_scale_at(site: AttentionSite, length: int) -> float | None:
    """``c`` of ``site`` for ``length`` keys (queries as many), with the mask
    of the same pattern; ``None`` for a mask of another pattern (padding)."""
    if site.mask == "other":
        return None
    # (a probe of the scale rule, not of the model's values: on the CPU)
    q = torch.zeros(1, 1, length, site.head_dim, device="cpu")
    mask = None
    if site.mask != "none":
        mask = _pattern(site.mask, length, site.window, torch.device("cpu"))
    _, c = attention_scales(
        "export",
        q,
        q,
        q,
        mask,
        site.dropout_p,
        site.is_causal,
        site.scale,
        False,
        site.mult,
    )
    return float(c)


def attention_temperature(site: AttentionSite) -> float:
    """The softmax temperature of the unit-scaled attention ``site``."""
    q = torch.zeros(1, 1, 1, site.head_dim, device="cpu")
    temperature, _ = attention_scales(
        "export", q, q, q, None, 0.0, site.is_causal, site.scale, False, site.mult
    )
    return temperature


def attention_ratios(
    sites: list[AttentionSite | None], seq_len: int
) -> dict[int, float]:
    """For a few lengths ``L`` around ``seq_len``: ``c(L) / c(seq_len)`` of the
    site whose ratio is farthest from 1 (sites of another mask left out)."""
    table = {}
    for length in sorted({seq_len // 4, seq_len // 2, 2 * seq_len, 4 * seq_len}):
        if length in (0, seq_len):
            continue
        found = []
        for site in filter(None, sites):
            now, there = (
                attention_scale_at(site, length),
                attention_scale_at(site, seq_len),
            )
            if now is not None and there is not None:
                found.append(now / there)
        if found:
            table[length] = max(found, key=lambda r: abs(math.log(r)))
    return table


def _pattern(kind: str, n: int, window: int, device: torch.device) -> Tensor:
    """The ``n x n`` boolean mask of a pattern (``True`` attends)."""
    mask = torch.ones(n, n, dtype=torch.bool, device=device)
    if kind == "full":
        return mask
    return mask.tril() & (mask.triu(1 - window) if kind == "window" else mask)


def _mask_pattern(mask: Any) -> tuple[str, int]:
    """The pattern of an attention mask, and its window (0 if none)."""
    if mask is None:
        return "none", 0
    allowed = (
        mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    )
    n, m = allowed.shape[-2:]
    window = int(allowed[..., -1, :].sum(-1).flatten()[0]) if n else 0
    for kind in ("full", "causal", "window"):
        expected = _pattern(kind, n, window, mask.device)
        if n == m and torch.equal(allowed, expected.expand_as(allowed)):
            return kind, window if kind == "window" else 0
    return "other", 0


@dataclasses.dataclass
class GraphRatios:
    """The equations of one graph, and what they could not express."""

    system: RatioSystem
    # variable -> parameter name ("" for a value computed from parameters only)
    parameters: dict[Hashable, str]
    activations: set[Hashable] = dataclasses.field(default_factory=set)
    anchored: list[str] = dataclasses.field(default_factory=list)
    unfolded: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    attention: list[AttentionSite | None] = dataclasses.field(default_factory=list)
    # gains ``c + w`` of a parameter ``w`` (Gemma's norms): node -> (name, c)
    shifted: dict[Node, tuple[str, float]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, eq=False)
class _OpSite:
    """One node of the graph being read, with what every rule reads and writes:
    the values of the run (``env``), the nodes computed from parameters
    (``data``), the op's name in the report (``origin``), and the equations
    found so far."""

    node: Node
    env: dict[Node, Any]
    data: set[Node]
    origin: str
    found: GraphRatios

    @property
    def system(self) -> RatioSystem:
        return self.found.system

    def units(self, leaves: list[Any]) -> dict[Unit, Hashable]:
        """The ratio variables of the data among the call's ``leaves``."""
        units: dict[Unit, Hashable] = {}
        for i, leaf in enumerate(leaves):
            if isinstance(leaf, Node) and leaf in self.data:
                for j, var in _vars(leaf, self.env[leaf]).items():
                    units[(i, j)] = var
        return units

    def probe(
        self,
        call: Callable[[list[Any]], Any],
        values: list[Any],
        units: dict[Unit, Hashable],
        outputs: dict[int | None, Hashable],
        offsets: dict[int | None, float],
    ) -> None:
        """:func:`._probe.probe` at this op, which is reported as anchored if
        some input had to be."""
        if probe(self.system, call, values, units, outputs, offsets, self.origin):
            self.found.anchored.append(self.origin)


def graph_equations(
    gm: GraphModule,
    env: dict[Node, Any],
    parameters: dict[Node, str],
    call_inputs: set[Node],
    temperatures: list[float | None],
    system: RatioSystem,
) -> GraphRatios:
    """Equations relating the ratios of ``gm``'s nodes, from the values ``env``
    of one run; ``parameters`` names the placeholders that are parameters,
    ``call_inputs`` are those the caller passed, ``temperatures`` the ``scale=``
    of each attention call of the plain model, in order (``unit_scale`` sets
    its own)."""
    found = GraphRatios(system, {n: name for n, name in parameters.items()})
    data: set[Node] = set(parameters)
    fed = set(call_inputs)  # what the call's inputs reach
    for node in gm.graph.nodes:
        if node.op == "output":
            for leaf in flatten_call(node.args, {})[0]:
                if isinstance(leaf, Node) and leaf in data:
                    for var in _vars(leaf, env[leaf]).values():
                        system.anchor(var, 0.0, "graph output", at_input=True)
            continue
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        inputs = [a for a in node.all_input_nodes if a in data]
        if not inputs:
            continue  # computed from inputs and constants: the same in both
        data.add(node)
        outputs = _vars(node, env[node])
        if any(a in fed for a in node.all_input_nodes):
            fed.add(node)
        if node not in fed:  # a parameter transformed (transposed, rescaled)
            found.parameters.update((v, "") for v in outputs.values())
        else:
            found.activations.update(outputs.values())
        origin = f"{target_name(node)} at {module_path(node) or '<root>'}"
        attention_sites = len(found.attention)
        site = _OpSite(node, env, data, origin, found)
        try:
            _node_equations(gm, site, fed, parameters, temperatures)
        except Exception as error:
            # Both models must then agree on the op's inputs and outputs: right
            # for a plain op that cannot run again on its own (one traced under
            # vmap, whose inputs are no longer valid), not for a unit-scaled one.
            if isinstance(error, _NotFolded):
                found.unfolded.append((origin, str(error)))
            elif _is_unit_scaled(node.target):
                found.unfolded.append((origin, f"could not be run: {error!r:.200}"))
            else:
                found.anchored.append(origin)
            for a in node.all_input_nodes:
                if a in data:
                    for var in _vars(a, env[a]).values():
                        system.anchor(var, 0.0, origin, at_input=True)
            for var in outputs.values():
                system.anchor(var, 0.0, origin)
            if node.target is U.scaled_dot_product_attention:
                del found.attention[attention_sites:]
                found.attention.append(None)
    return found


class _NotFolded(Exception):
    """A unit-scaled op whose scale this export cannot measure."""


def _node_equations(
    gm: GraphModule,
    site: _OpSite,
    fed: set[Node],
    parameters: dict[Node, str],
    temperatures: list[float | None],
) -> None:
    node, env, found = site.node, site.env, site.found
    source = node.args[0] if node.args else None
    if (
        node.target is operator.getitem
        and isinstance(source, Node)
        and isinstance(env[source], (tuple, list))
        and isinstance(node.args[1], int)
    ):
        for var in _vars(node, env[node]).values():
            site.system.equal(var, (node.args[0], node.args[1]), 0.0, site.origin)
    elif node not in fed and (shift := _shifted(node, env, parameters)):
        found.shifted[node] = shift  # its ratio is realised on the parameter
    elif node.target is U.scaled_dot_product_attention:
        _attention(site, temperatures[len(found.attention)])
    elif node.target is U.residual_add:
        _residual_add(site)
    elif node.op == "call_function" and _is_unit_scaled(node.target):
        _unit_scaled_op(site)
    else:
        _plain_op(gm, site)


_SHIFTS: dict[Callable[..., Any], float] = {
    operator.add: 1.0,
    torch.add: 1.0,
    operator.sub: -1.0,
    torch.sub: -1.0,
}


def _shifted(
    node: Node, env: dict[Node, Any], parameters: dict[Node, str]
) -> tuple[str, float] | None:
    """``(name, c)`` if ``node`` is ``c + w`` for a parameter ``w`` used nowhere
    else (through value-preserving ops such as ``w.float()``): a gain the plain
    model scales by ``r`` with ``w <- r (c + w) - c``, which no multiple of
    ``w`` can do."""
    target = node.target
    sign = _SHIFTS.get(target) if callable(target) else None
    if sign is None or node.kwargs or len(node.args) != 2:
        return None
    a, b = node.args
    if isinstance(a, Node) and isinstance(b, (int, float)):
        x, c = a, sign * b
    elif isinstance(b, Node) and isinstance(a, (int, float)) and sign > 0:
        x, c = b, a
    else:
        return None
    while x not in parameters:  # back through single-use, single-input ops
        if len(x.users) != 1 or len(x.all_input_nodes) != 1:
            return None
        x = x.all_input_nodes[0]
    if len(x.users) != 1:
        return None
    w, gain = env[x].double(), env[node].double()
    if w.shape != gain.shape or not torch.allclose(gain - c, w, rtol=0, atol=1e-5):
        return None  # the chain changed the values: not c + w
    return parameters[x], float(c)


def _is_unit_scaled(target: Any) -> bool:
    if target in _IDENTITY_FORWARD:
        return False
    return target in _COUNTERPARTS or str(getattr(target, "__module__", "")).startswith(
        "unit_scaling"
    )


def _vars(node: Node, value: Any) -> dict[int | None, Hashable]:
    """The ratio variables of a node's float tensors: itself, or its elements."""
    return {
        j: node if j is None else (node, j)
        for j, v in output_units(value)
        if v.is_floating_point()
    }


def _leaf_values(leaves: list[Any], env: dict[Node, Any]) -> list[Any]:
    return [env[x] if isinstance(x, Node) else x for x in leaves]


def _run(gm: GraphModule, node: Node, args: Any, kwargs: Any) -> Any:
    if node.op == "call_method":
        return getattr(args[0], str(node.target))(*args[1:], **kwargs)
    if node.op == "call_module":
        return gm.get_submodule(str(node.target))(*args, **kwargs)
    assert callable(node.target)
    return node.target(*args, **kwargs)


def _in_float64(
    call: Callable[[list[Any]], Any], values: list[Any], units: dict[Unit, Hashable]
) -> list[Any]:
    """``values`` with the data among them (``units``) in float64 if ``call``
    runs on them, so that measured scales are exact to float64 rounding, else
    as they are. Constants keep their dtype: a mask below ``finfo.min / 2`` of
    float32 is not one in float64."""
    wide = list(values)
    for i, j in units:
        if j is None:
            wide[i] = _float64(wide[i])
        else:
            wide[i] = type(wide[i])(
                _float64(x) if k == j else x for k, x in enumerate(wide[i])
            )
    try:
        call(wide)
    except Exception:  # an op that needs its dtype (a kernel, an index)
        return values
    return wide


def _plain_op(gm: GraphModule, site: _OpSite) -> None:
    node, env = site.node, site.env
    leaves, spec = flatten_call(node.args, node.kwargs)

    def call(values: list[Any]) -> Any:
        return _run(gm, node, *unflatten_call(values, spec))

    units = site.units(leaves)
    values = _in_float64(call, _leaf_values(leaves, env), units)
    outputs = _vars(node, env[node])
    non_float = {j: None for j, v in output_units(env[node]) if j not in outputs}
    site.probe(call, values, units, {**non_float, **outputs}, {})


def _unit_scaled_op(site: _OpSite) -> None:
    node, env, system, origin = site.node, site.env, site.system, site.origin
    op = node.target
    assert callable(op)
    plain_op = _counterpart(op)
    if plain_op is None:
        raise _NotFolded("no plain counterpart known to export")
    leaves, spec = flatten_call(node.args, node.kwargs)
    units = site.units(leaves)
    outputs = _vars(node, env[node])
    signature = inspect.signature(op)
    named = signature.bind(*node.args, **node.kwargs).arguments
    mult = named.get("mult", 1.0)
    tempered = _TEMPERED.get(op, "input") if "mult" in signature.parameters else None
    bias = named.get("bias") if "bias" in signature.parameters else None

    def plain(values: list[Any], with_bias: bool = True) -> Any:
        args, kwargs = unflatten_call(values, spec)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = {k: v for k, v in bound.arguments.items() if k not in _EXTRAS}
        if tempered is not None and mult != 1:
            arguments[tempered] = arguments[tempered] * mult
        if not with_bias:
            arguments["bias"] = None
        return plain_op(**arguments)

    def unit(values: list[Any]) -> Any:
        args, kwargs = unflatten_call(values, spec)
        return op(*args, **kwargs)

    values = _in_float64(
        lambda vs: (unit(vs), plain(vs)), _leaf_values(leaves, env), units
    )
    values = with_stand_ins(values, list(units))
    try:
        unit_out, plain_out = unit(values), plain(values)
    except Exception as error:  # arguments our counterpart does not take
        raise _NotFolded(f"its torch counterpart failed: {error}") from error
    offsets = {}
    for j in outputs:
        s = proportion(pick(unit_out, j), pick(plain_out, j))
        if s is None:
            raise _NotFolded("not a constant multiple of its torch counterpart here")
        offsets[j] = -math.log(s)
    for (i, j), var in list(units.items()):
        leaf = leaves[i]
        if bias is not None and leaf is bias:
            # y = s (f(x, W) + b): the bias takes the output's ratio times s
            del units[(i, j)]
            for out, offset in offsets.items():
                system.equal(var, outputs[out], -offset, origin)
        elif tempered is not None and mult != 1 and leaf is named.get(tempered):
            # the plain op sees mult * x: a variable of its own, R - log(mult)
            virtual = ("tempered", node, var)
            system.equal(virtual, var, -math.log(mult), origin)
            units[(i, j)] = virtual
    if bias is not None and not (isinstance(bias, Node) and bias in site.data):
        for out, offset in offsets.items():
            system.anchor(outputs[out], offset, origin)
    site.probe(
        lambda vs: plain(vs, with_bias=bias is None),
        values,
        units,
        dict(outputs),
        offsets,
    )


def _attention(site: _OpSite, own_scale: float | None) -> None:
    """``U.sdpa = c * F.sdpa`` at the temperature ``t_u``; the plain model runs
    its own ``t_p`` (``own_scale``, else ``d^-1/2``): the query and key ratios
    must make up ``t_u / t_p``, and ``c`` folds into the values."""
    node, system, origin = site.node, site.system, site.origin
    op = U.scaled_dot_product_attention
    bound = inspect.signature(op).bind(*node.args, **node.kwargs)
    bound.apply_defaults()
    nodes = bound.arguments
    # in the model's dtype: the mask's threshold (finfo.min / 2) depends on it
    a = {k: site.env[v] if isinstance(v, Node) else v for k, v in nodes.items()}
    q, k, v, mask = a["query"], a["key"], a["value"], a["attn_mask"]
    rest = (a["dropout_p"], a["is_causal"], a["scale"], a["enable_gqa"], a["mult"])
    temperature, _ = attention_scales("export", q, k, v, mask, *rest)
    own = own_scale if own_scale is not None else q.shape[-1] ** -0.5
    plain = F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=mask,
        dropout_p=a["dropout_p"],
        is_causal=a["is_causal"],
        scale=temperature,
        enable_gqa=a["enable_gqa"],
    )
    c = proportion(op(q, k, v, mask, *rest), plain)
    is_data = {
        n: isinstance(x, Node) and x in site.data
        for n, x in nodes.items()
        if n in ("query", "key", "value", "attn_mask")
    }
    if c is None:
        raise _NotFolded("not a constant multiple of torch's attention here")
    pattern, window = _mask_pattern(mask)
    site.found.attention.append(
        AttentionSite(
            origin,
            q.shape[-1],
            k.shape[-2],
            pattern,
            a["is_causal"],
            a["dropout_p"],
            a["scale"],
            a["mult"],
            window,
        )
    )
    qk: dict[Hashable, float] = {}
    for n in ("query", "key"):
        if is_data[n]:
            qk[nodes[n]] = qk.get(nodes[n], 0.0) + 1.0
    system.relate(qk, math.log(temperature / own), origin, at_input=True)
    if is_data["value"]:
        system.equal(node, nodes["value"], -math.log(c), origin)
    else:
        system.anchor(node, -math.log(c), origin)
    if is_data["attn_mask"]:
        system.anchor(nodes["attn_mask"], 0.0, origin, at_input=True)


def _residual_add(site: _OpSite) -> None:
    """``U.residual_add(r, s) = a r + b s``; the plain model adds ``r + s``."""
    node, env, system, origin = site.node, site.env, site.system, site.origin
    named = inspect.signature(U.residual_add).bind(*node.args, **node.kwargs)
    named.apply_defaults()
    r, s, tau = (named.arguments[n] for n in ("residual", "skip", "tau"))
    rv, sv = _float64(env[r]), _float64(env[s])
    a = proportion(U.residual_add(rv, torch.zeros_like(sv), tau), rv.expand_as(sv))
    b = proportion(U.residual_add(torch.zeros_like(rv), sv, tau), sv)
    assert a is not None and b is not None, "residual_add is a weighted sum"
    for x, w in ((r, a), (s, b)):
        if isinstance(x, Node) and x in site.data:
            system.equal(x, node, math.log(w), origin, at_input=True)
        else:
            system.anchor(node, -math.log(w), origin)
