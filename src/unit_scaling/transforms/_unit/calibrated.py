"""The calibrated stage of ``unit_scale``: every region of ops that no rule
covers (see ``regions``) is recognised as a known op, or measured on stand-in
inputs and given the scales that make its outputs and input gradients unit;
each region's measurement is kept for later captures of the same region."""

from __future__ import annotations

import logging
import operator
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx import GraphModule, Node

from ... import functional as U
from ..._fx_names import module_path
from .._capture.graph import retarget
from .analytic import OURS, rebind, record_op
from .checkpoint import Measured
from .recognise import recognise, recognise_within, replace_region
from .regions import (
    Calibration,
    Region,
    apply_input_gradient_scales,
    apply_output_scales,
    calibrate,
    find_regions,
)
from .report import OpRecord, UnitScaleReport
from .rules import (
    ELEMENTWISE,
    rule_for,
)
from .values import GraphValues, Kind

__all__ = ["calibrate_regions", "capture_key"]

logger = logging.getLogger("unit_scaling.transforms.unit_scale")

# Unit-scaled ops whose outputs are far from a zero-mean normal for normal inputs
# (probabilities, non-negative values): calibration runs them in front of the ops
# they feed, rather than feeding those ops unit-normal stand-ins.
_SHAPING = frozenset({U.softmax, U.relu, U.gelu, U.silu, U.sigmoid, U.silu_glu})


def _shapes_output(node: Node) -> bool:
    return node.op == "call_function" and node.target in _SHAPING


def _zero_padding(node: Node) -> bool:
    """``F.pad`` with zeros: a border around the data, like a convolution's own
    padding, which unit scaling does not count (calibrating it would count the
    zeros, and scale the data up by as much as the border is wide)."""
    if node.target not in (F.pad, torch.constant_pad_nd):
        return False
    mode = node.kwargs.get("mode", node.args[2] if len(node.args) > 2 else "constant")
    value = node.kwargs.get("value", node.args[3] if len(node.args) > 3 else None)
    return mode == "constant" and not value


# Products no rule covers; like any op with a weight, each is calibrated alone.
_UNCOVERED_PRODUCTS = frozenset(
    {torch.mm, torch.addmm, torch.baddbmm, torch.addbmm, "mm", "addmm", "baddbmm"}
)


def _stands_alone(values: GraphValues) -> Callable[[Node], bool]:
    def alone(node: Node) -> bool:
        if node.target in _UNCOVERED_PRODUCTS:
            return True
        inputs = node.all_input_nodes
        weight = any(
            values.kind(a) is Kind.PARAM
            and (info := values.tensor(a)) is not None
            and sum(size > 1 for size in info.shape) >= 2
            for a in inputs
        )
        return (
            weight
            and any(values.is_data(a) for a in inputs)
            and node.target not in _ELEMENTWISE_ARITHMETIC
        )

    return alone


_ELEMENTWISE_ARITHMETIC = frozenset(
    {
        operator.mul,
        operator.truediv,
        operator.add,
        operator.sub,
        torch.mul,
        torch.div,
        torch.add,
        torch.sub,
        torch.cat,
        "mul",
        "div",
        "add",
        "sub",
    }
)


def _calibrate_once(
    gm: GraphModule,
    region: Region,
    values: GraphValues,
    key: tuple[Any, ...],
    measured: dict[tuple[Any, ...], Measured],
) -> Calibration | str:
    """``calibrate(region)``, measured at the first capture of the region and
    taken again by later captures with the same ``key`` (see
    :func:`capture_key`): one function whatever the batch, instead of
    stand-in draws that differ by a few percent from one batch size to another."""
    inputs = _keyed_inputs(region, values)
    known = measured.get(key)
    if known is not None and len(known[0]) == len(region.outputs):
        rms, grads = known
        if all(i < len(inputs) for i in grads):
            return Calibration(list(rms), {inputs[i]: g for i, g in grads.items()})
    result = calibrate(gm, region, values, _shapes_output)
    if isinstance(result, Calibration):
        position = {node: i for i, node in enumerate(inputs)}
        measured[key] = (
            list(result.output_rms),
            {position[n]: g for n, g in result.input_grad_rms.items() if n in position},
        )
    return result


def _keyed_inputs(region: Region, values: GraphValues) -> list[Node]:
    """``region``'s inputs but its sizes (Python numbers): a capture with
    dynamic shapes passes as inputs the sizes (the batch of a ``repeat_kv``'s
    ``expand``) that a static capture writes into its code, and the region must
    have one key and one input order in both."""
    return [
        n for n in region.inputs if not isinstance(values.infos.get(n), (int, float))
    ]


def capture_key(
    where: str, op: str, nodes: list[Node], values: GraphValues, seen: Counter[Any]
) -> tuple[Any, ...]:
    """What identifies a calibrated region across captures: its module, its
    ops, the shapes of its inputs ``nodes`` beyond the leading (batch) dimension,
    which data parallelism and evaluation change, and which occurrence of all
    that in this capture it is. (A region's scales depend on its inputs alone:
    it is measured on stand-ins with unit output gradients.)"""
    shapes = tuple(
        info.shape[1:] if (info := values.tensor(n)) is not None else None
        for n in nodes
    )
    base = (where, op, shapes)
    seen[base] += 1
    return (*base, seen[base])


def calibrate_regions(
    gm: GraphModule,
    values: GraphValues,
    report: UnitScaleReport,
    frozen: set[Node],
    measured: dict[tuple[Any, ...], Measured],
) -> list[Region]:
    """Calibrate every region of ops no rule covers (see ``regions``). Outputs
    that feed frozen code keep their scale: there, the value itself may matter
    (a scan's decay factor). ``measured`` holds earlier captures' calibrations."""
    graph = gm.graph
    seen: Counter[Any] = Counter()

    def covered(node: Node) -> bool:
        if node in frozen or node.op != "call_function":
            return node in frozen
        if _zero_padding(node):
            return True  # keeps its input's scale (borders are not data)
        if node.target is operator.getitem and isinstance(node.args[0], Node):
            return covered(node.args[0])  # an output of U.residual_split, say
        return node.target in OURS

    regions = find_regions(graph, values, covered, _stands_alone(values))
    keep = {p for node in frozen for p in node.all_input_nodes if p not in frozen}
    for region in regions:
        if region.rearranges_only:
            continue
        value_ops = [n for n in region.nodes if values.kind(n) is Kind.DATA]
        if len(region.nodes) == 1:
            node = region.nodes[0]
            target = rule_for(node)
            if target in ELEMENTWISE:
                assert target is not None
                logger.info("unit scaling function: %s", node)
                record_op(report, node, "analytic")
                if node.op == "call_function":
                    rebind(node, node.target, target)
                else:
                    retarget(node, target)
                continue
        anchor = value_ops[-1] if value_ops else region.nodes[-1]
        names = region.op_names()
        op = "+".join(
            names if len(names) <= 4 else [*names[:3], f"{len(names) - 3} more"]
        )
        found = recognise(gm, region, values)
        if found is not None:
            replaced = region.outputs[0]
            new = replace_region(graph, region, found)
            values.record_like(new, replaced)
            logger.info("recognised %s as %s: %s", op, found.name, new)
            report.ops.append(
                OpRecord(
                    found.name, "analytic", module_path(anchor), f"recognised: {op}"
                )
            )
            continue
        while (part := recognise_within(gm, region, values)) is not None:
            # recognise that part; calibrate the rest
            sub, found = part
            sub_names = sub.op_names()
            replaced = sub.outputs[0]
            where = module_path(replaced)
            new = replace_region(graph, sub, found)
            values.record_like(new, replaced)  # what the rest sees
            done = set(sub.nodes)
            logger.info("recognised %s as %s: %s", "+".join(sub_names), found.name, new)
            report.ops.append(
                OpRecord(
                    found.name,
                    "analytic",
                    where,
                    f"recognised: {'+'.join(sub_names)}",
                )
            )
            region.nodes = [n for n in region.nodes if n not in done]
            if not region.nodes or region.rearranges_only:
                break
            value_ops = [n for n in region.nodes if values.kind(n) is Kind.DATA]
            anchor = value_ops[-1] if value_ops else region.nodes[-1]
            names = region.op_names()
            op = "+".join(
                names if len(names) <= 4 else [*names[:3], f"{len(names) - 3} more"]
            )
        if not region.nodes or region.rearranges_only:
            continue
        inputs = _keyed_inputs(region, values)
        key = capture_key(module_path(anchor), op, inputs, values, seen)
        result = _calibrate_once(gm, region, values, key, measured)
        if isinstance(result, str):
            region.skipped = result
            logger.info("leaving ops as is: %s (%s): %s", anchor, op, result)
            report.ops.append(OpRecord(op, "left as is", module_path(anchor), result))
            continue
        region.calibration = result
        applied = apply_output_scales(graph, region, values, keep)
        for source, factor in apply_input_gradient_scales(graph, region, values, keep):
            logger.info(
                "unit scaling gradient: %s -> %s (calibrated: x%g)",
                anchor,
                source,
                factor,
            )
        if applied:
            factors = ", ".join(f"{n.name} x{f:g}" for n, f in applied)
            # (the name alone on its line, as users grep for it; the factors
            # are in the report's detail)
            logger.info("unit scaling function: %s", anchor)
            logger.debug("calibrated output scales of %s: %s", anchor, factors)
            detail = ", ".join(f"x{f:g}" for _, f in applied)
            report.ops.append(OpRecord(op, "calibrated", module_path(anchor), detail))
        else:
            report.ops.append(OpRecord(op, "unit already", module_path(anchor)))
    return regions
