"""The ``unit_scale`` graph pass: each captured graph goes through the stages
(analytic, residual, calibrated, gradient) in order, and the pass keeps what it
learns across captures (the report, initialised parameters, measured scales),
which is also what a checkpoint records."""

from __future__ import annotations

import dataclasses
import logging
import weakref
from collections import Counter
from collections.abc import Callable
from typing import Any

from torch import Tensor, nn
from torch.fx import Graph, GraphModule, Node

from ..._fx_names import module_path
from ..._torch_internals import fsdp_unsharded_parameters
from ...scale import scale_bwd
from .._capture.dynamo import functorch_sections, is_functorch_internal
from .._capture.engine import (
    CaptureContext,
    CapturePass,
)
from .._capture.fallbacks import collecting, fell_back
from .._capture.targets import broadcast_gradient, repeated_gradient
from .adapters import rewrite_low_rank_updates
from .analytic import (
    OURS,
    op_name,
    record_op,
    replace_functions,
    replace_with_unit_scaled,
    unconstrain_inputs,
    unit_scale_adds,
)
from .calibrated import calibrate_regions, capture_key
from .checkpoint import (
    Measured,
    Record,
    encode,
    key_to_text,
    write_to_config,
)
from .consistency import scale_broadcast_gradients, unconstrain_consistently
from .gradients import (
    CUT_TOLERANCE,
    PARAMETER_TOLERANCE,
    ZERO_GRADIENT,
    GradientCalibration,
    calibrate_gradients,
    compensate_parameters,
    cut_vertices,
    downstream_factor,
    rounded,
    scale_gradient,
)
from .inplace import functionalize_inplace
from .normalisation import recognise_step_means, unrecognised_normalisers
from .params import (
    graph_roles,
    initialise,
    scale_direct_parameter_gradients,
    weight_fan_ins,
)
from .patterns import rewrite_patterns
from .report import (
    ADDED_AFTER_SETUP,
    OpRecord,
    ParameterRecord,
    UnitScaleReport,
    name_pattern,
)
from .residuals import find_residuals, rewrite_residual
from .tags import TagRecord, tag_added, tag_from_graph
from .values import GraphValues, Kind, graph_values

__all__ = ["UnitScalingPass"]

# u-μP types whose learning rates follow one rule (bias and norm gains share one).
_LR_GROUP = {"weight": "weight", "output": "output", "bias": "vector", "norm": "vector"}

logger = logging.getLogger("unit_scaling.transforms.unit_scale")


class UnitScalingPass(CapturePass):
    """The ``unit_scale`` graph pass, with what it learns across captures: the
    report, and which parameters have been initialised (by name, so that copies
    of a transformed module keep their parameters' values, and by identity, so
    that a wrapper renaming one does not) or joined the module after setup."""

    def __init__(
        self,
        replace: dict[Callable[..., Any], Any],
        residual_scaling: Callable[[int, int], float] | None = None,
        initialised: set[str] | None = None,
        grad_scales: dict[str, float] | None = None,
        tags: dict[str, TagRecord] | None = None,
        branches: int | None = None,
        measured: dict[tuple[Any, ...], Measured] | None = None,
        cut_scales: dict[str, float] | None = None,
        residual_name: str = "fixed",
        setup_shapes: dict[str, tuple[int, ...]] | None = None,
        added: set[str] | None = None,
    ) -> None:
        self.replace = replace
        self.residual_scaling = residual_scaling
        self.residual_name = residual_name
        self.found: set[Any] = set()
        self.initialised: set[str] = set(initialised or ())
        # The parameters the module held at setup: by identity (this module's
        # own, with their names then), and the shape of each name (for its
        # copies, whose parameters are other objects); and the names of those
        # that joined it since, kept as they are.
        self._at_setup: dict[int, tuple[weakref.ref[Tensor], tuple[str, ...]]] = {}
        self.setup_shapes: dict[str, tuple[int, ...]] = dict(setup_shapes or {})
        self.added: set[str] = set(added or ())
        # Calibrated parameter-gradient scales, by parameter name and the
        # shapes of its graph's inputs beyond the batch dimension (as a cut
        # vertex's): measured at the first capture of each and reused.
        self.grad_scales: dict[str, float] = dict(grad_scales or {})
        # u-μP tags by parameter name (every alias of a tied parameter).
        self.report = UnitScaleReport(tags=dict(tags or {}))
        # The residual branches of the whole forward, counted over the graphs of
        # the first call (graph breaks split it); until then, those seen so far.
        self.branches = branches
        # Per captured graph (by id): its residual branches, and the positions
        # of its outputs that are constants (rotary tables, masks), so that a
        # graph captured after it in the same call keeps them constants.
        self.residual_counts: dict[int, int] = {}
        # Region calibrations by what identifies them across captures.
        self.measured: dict[tuple[Any, ...], Measured] = dict(measured or {})
        # Gradient corrections at cut vertices, by what identifies a vertex
        # across captures (as a region's calibration): measured once, so that a
        # capture after a reload (or of another batch size) runs the same
        # backward pass.
        self.cut_scales: dict[str, float] = dict(cut_scales or {})

        self.constant_outputs: dict[int, frozenset[int]] = {}
        self.warned_normalisation = False

    def fresh(self) -> UnitScalingPass:
        return UnitScalingPass(
            self.replace,
            self.residual_scaling,
            self.initialised,
            self.grad_scales,
            self.report.tags,
            self.branches,
            self.measured,
            self.cut_scales,
            self.residual_name,
            self.setup_shapes,
            self.added,
        )

    def record(self) -> Record:
        """What this pass learned, as a checkpoint keeps it."""
        return Record(
            residual_scaling=self.residual_name,
            initialised=set(self.initialised),
            grad_scales=dict(self.grad_scales),
            measured=dict(self.measured),
            cut_scales=dict(self.cut_scales),
        )

    def restore(self, record: Record, where: str) -> None:
        """Take ``record`` (of the weights the model now holds): every parameter
        counts as initialised, and measured scales are reused, not measured."""
        if record.residual_scaling != self.residual_name:
            raise ValueError(
                f"{where} was trained with unit_scale(residual_scaling="
                f"{record.residual_scaling!r}), but this model was made with "
                f"residual_scaling={self.residual_name!r}: the residual weights, "
                "and so the function, would differ. Pass the same residual_scaling"
            )
        self.initialised.update(record.initialised)
        self.grad_scales.update(record.grad_scales)
        self.measured.update(record.measured)
        self.cut_scales.update(record.cut_scales)

    def count_branches(self, state: Any) -> None:
        """After the first call: the residual branches of every graph it ran."""
        self.branches = sum(
            self.residual_counts.get(id(c.graph_module), 0)
            for c in state.graphs_run_in_call
        )

    def check_shared_graphs(self, state: Any, output: Any) -> None:
        """After each call: u-μP's residual weights depend on a branch's depth,
        so a graph with residual branches must not run for several blocks (as
        TorchDynamo shares one graph between the identical blocks of a model
        that graph breaks split, e.g. at FSDP2's hooks)."""
        if self.residual_scaling is None:
            return
        runs = Counter(
            id(c.graph_module)
            for c in state.graphs_run_in_call
            if self.residual_counts.get(id(c.graph_module))
        )
        if any(n > 1 for n in runs.values()):
            raise RuntimeError(
                "unit_scale(residual_scaling=...): TorchDynamo ran one captured "
                "graph for several blocks of this model (it shares a graph "
                "between identical blocks when graph breaks, such as FSDP2's "
                "hooks, split the forward at block boundaries), but the "
                "depth-dependent residual weights differ from block to block. Use "
                'residual_scaling="fixed" for a model split like this'
            )

    def _constants_before(self, context: CaptureContext) -> set[int]:
        """Ids of the constants that earlier graphs of this call passed on."""
        found = set()
        for gm, outputs in context.graphs_before:
            for i in self.constant_outputs.get(id(gm), ()):
                if i < len(outputs) and outputs[i] is not None:
                    found.add(id(outputs[i]))
        return found

    def _calibrate_gradients(
        self,
        gm: GraphModule,
        values: GraphValues,
        context: CaptureContext,
        readable: dict[Node, str],
    ) -> None:
        """Bring gradients to unit scale where the rules leave their scale free
        (see ``gradients``) at cut vertices and parameters, measured at the
        first capture for the shapes of the call's inputs beyond their batch
        dimension and reused by later ones: one function at any input, whatever
        shapes came first."""
        graph = gm.graph
        # A gradient depends on what is summed downstream of it (the tokens of
        # a sequence or an image of another size, of a broadcast conditioning
        # vector): each scale is keyed by the distinct shapes, beyond the batch
        # dimension, of the tensors the caller passed (token ids, images; not
        # which of them: a mask or a count passed or not keeps the key), and a
        # cut vertex's also by this graph's activations. A parameter's key is
        # the call's alone: a model captured whole and then in pieces (FSDP2's
        # blocks) keeps the scales it measured.
        inputs = [
            n for n in graph.find_nodes(op="placeholder") if values.kind(n) is Kind.DATA
        ]
        called = context.call_shapes
        named = {
            node: key_to_text((name, "parameter", called, 1))
            for node, name in readable.items()
        }
        for node, key in named.items():
            factor = self.grad_scales.get(key, 1.0)
            if factor != 1:
                scale_gradient(graph, node, factor)
        new = [n for n in readable if named[n] not in self.grad_scales]

        def scales() -> dict[str, float]:
            return {readable[n]: self.grad_scales.get(k, 1.0) for n, k in named.items()}

        cuts, ancestors = cut_vertices(graph, values)
        # Only where an op with a rule or a calibrated region hands over a tensor:
        # inside a region, a correction would fight the region's own scale.
        cuts = [
            n
            for n in cuts
            if n.op == "call_function"
            and n.target in OURS
            and n.target not in (scale_bwd, broadcast_gradient, repeated_gradient)
        ]
        seen: Counter[Any] = Counter()
        keys = {
            vertex: key_to_text(
                _with_call_shapes(
                    capture_key(
                        module_path(vertex),
                        op_name(vertex),
                        [vertex, *inputs],
                        values,
                        seen,
                    ),
                    called,
                )
            )
            for vertex in cuts
        }
        if not new and all(key in self.cut_scales for key in keys.values()):
            # All measured at an earlier capture (or read from a checkpoint).
            known = {
                v: factor for v in cuts if (factor := self.cut_scales[keys[v]]) != 1
            }
            self._correct_cuts(graph, values, known)
            self._report_grad_scales(scales())
            return
        measured = calibrate_gradients(gm, context, values, cuts)
        if isinstance(measured, str):
            fell_back("gradient calibration", type(context.module).__name__, measured)
            self.grad_scales.update((named[n], 1.0) for n in new)
            return
        position = {n: i for i, n in enumerate(graph.nodes)}
        _drop_non_finite(measured, readable)
        corrections: dict[Node, float] = {}
        for vertex in reversed(cuts):
            stored = self.cut_scales.get(keys[vertex])
            if stored is not None:
                if stored != 1:
                    corrections[vertex] = stored
                continue
            size = measured.vertices.get(vertex)
            if size is None:
                continue
            # (judged after the corrections downstream: a gradient zero by
            # construction is tiny next to the unit-scaled ones around it)
            size *= downstream_factor(corrections, ancestors, position[vertex])
            if size.rms < ZERO_GRADIENT:
                continue
            if (correction := size.correction(CUT_TOLERANCE)) != 1:
                corrections[vertex] = rounded(correction)
        for vertex in cuts:
            self.cut_scales.setdefault(keys[vertex], corrections.get(vertex, 1.0))
        self._correct_cuts(graph, values, corrections)
        carried = compensate_parameters(
            graph, list(readable), corrections, ancestors, position
        )
        for node in new:
            factor = 1.0
            size = measured.parameters.get(node)
            if size is not None:
                size *= carried.get(node, 1.0)
            if (
                size is not None
                and size.rms > ZERO_GRADIENT
                and (correction := size.correction(PARAMETER_TOLERANCE)) != 1
            ):
                factor = rounded(correction)
                scale_gradient(graph, node, factor)
                logger.info(
                    "unit scaling parameter gradient: %s (calibrated: x%g)",
                    readable[node],
                    factor,
                )
            self.grad_scales[named[node]] = factor
        self._report_grad_scales(scales())

    def _report_grad_scales(self, scales: dict[str, float]) -> None:
        """Give each parameter's latest record (this capture's) its scale."""
        records, left = self.report.parameters, dict(scales)
        for i in reversed(range(len(records))):
            if not left:
                break
            if (factor := left.pop(records[i].name, None)) is not None:
                records[i] = dataclasses.replace(records[i], grad_scale=factor)

    def _correct_cuts(
        self, graph: Graph, values: GraphValues, corrections: dict[Node, float]
    ) -> None:
        for vertex, factor in corrections.items():
            values.record_like(scale_gradient(graph, vertex, factor), vertex)
            logger.info(
                "unit scaling gradient: %s (calibrated at a cut vertex: x%g)",
                vertex,
                factor,
            )
            self.report.ops.append(
                OpRecord("gradient", "calibrated", module_path(vertex), f"x{factor:g}")
            )

    def remember_setup(self, params: list[tuple[str, nn.Parameter]]) -> None:
        """Note the parameters the module holds when ``unit_scale`` sets it up
        (by identity, and by name and shape for its copies): any other one
        joined it later and is kept as it is (see ``_initialise_parameters``)."""
        for name, p in params:
            known = self._at_setup.get(id(p))
            names = known[1] if known is not None else ()
            self._at_setup[id(p)] = (weakref.ref(p), (*names, name))
            self.setup_shapes[name] = tuple(p.shape)

    def _names_at_setup(self, param: nn.Parameter) -> tuple[str, ...]:
        """The names ``param`` had at setup, if this module held it then (a
        wrapper, an adapter's, may have renamed it since)."""
        known = self._at_setup.get(id(param))
        return known[1] if known is not None and known[0]() is param else ()

    def _joined_after_setup(self, param: nn.Parameter, names: list[str]) -> bool:
        """Whether ``param`` was not part of the module at setup as it is now:
        neither it (this module's own, renamed or not) nor a parameter of one
        of its names (in a copy of the module, or sharded by FSDP2 since) had
        its shape then. (Hugging Face's ``resize_token_embeddings`` gives the
        table new data of another shape.)"""
        if any(name in self.added for name in names):
            return True
        shape = tuple(param.shape)
        return not any(
            self.setup_shapes.get(name) == shape
            for name in (*self._names_at_setup(param), *names)
        )

    def _initialise_parameters(
        self, graph: Graph, values: GraphValues, context: CaptureContext
    ) -> dict[Node, str]:
        """Initialise each parameter of the graph for its role, once, and tag it
        from its use. Kept as they are: a parameter initialised before (at
        setup, at an earlier capture, in the module a copy was made of, or as a
        checkpoint records), and one that joined the module after setup (an
        adapter's zero ``lora_B``, a resized embedding: deliberate values).
        Returns each parameter placeholder's readable name."""
        names = context.parameter_names
        stand_ins = fsdp_unsharded_parameters(context.module)
        placeholders = list(graph.find_nodes(op="placeholder"))
        params = {
            node: value
            for node, value in zip(placeholders, context.example_inputs, strict=False)
            if isinstance(value, nn.Parameter)
        }
        readable = {
            node: (names.get(id(p)) or [node.meta.get("source_name", node.name)])[0]
            for node, p in params.items()
        }
        roles = graph_roles(graph, values, readable)
        fan_ins = weight_fan_ins(graph, values, roles)
        # Each parameter's names now, and at setup where a wrapper renamed it.
        aliases = {
            node: names.get(id(params[node]), [readable[node]]) for node in roles
        }
        module_params = {
            node: stand_ins.get(id(params[node]), params[node]) for node in roles
        }
        every = {
            node: list(dict.fromkeys([*aliases[node], *self._names_at_setup(p)]))
            for node, p in module_params.items()
        }
        joined = [
            node
            for node in roles
            if self._joined_after_setup(module_params[node], aliases[node])
        ]
        added = [n for n in joined if not any(a in self.added for a in aliases[n])]
        if added:
            tagged = tag_added(
                context.module, [(aliases[n][0], module_params[n]) for n in added]
            )
            for node in added:
                tags = tagged[aliases[node][0]]
                self.report.tags.update(dict.fromkeys(aliases[node], tags))
                self.added.update(aliases[node])
        retagged = []
        for node, role in roles.items():
            param = module_params[node]
            known = every[node]
            record = next(
                (self.report.tags[a] for a in known if a in self.report.tags), None
            )
            if record is not None:
                new = tag_from_graph(param, record, role, fan_ins.get(node))
                if node in added:
                    pass  # untagged until now: no optimizer could take it before
                elif _LR_GROUP[new.mup_type] != _LR_GROUP[record.mup_type]:
                    retagged.append(f"{new.name} ({new.mup_type})")
                elif new.mup_fan_in != record.mup_fan_in:
                    retagged.append(f"{new.name} (fan-in {new.mup_fan_in})")
                self.report.tags.update(dict.fromkeys(known, new))
            if node in joined:
                done = ADDED_AFTER_SETUP
            elif any(a in self.initialised for a in known):
                done = "initialised before"
            elif param is not params[node]:
                raise RuntimeError(
                    f"unit_scale initialises {known[0]} at the model's first call, "
                    "but FSDP2 (fully_shard) sharded it before that call: what "
                    "the first call would write lands in a gathered copy and is "
                    "lost. Call the transformed model once on an example batch, "
                    "then shard it"
                )
            else:
                done = initialise(params[node], role)
                if done != "kept":
                    logger.info(
                        "initialising parameter: %s (%s, %s)",
                        readable[node],
                        role,
                        done,
                    )
            # Under every name, so that a copy or a checkpoint of the module as
            # it is now (its parameters renamed) keeps them too.
            self.initialised.update(known)
            if node not in joined:
                shape = tuple(param.shape)
                self.setup_shapes.update(dict.fromkeys(known, shape))
            self.report.parameters.append(ParameterRecord(readable[node], role, done))
        if added:
            logger.warning(
                "unit_scale: %d parameter(s) joined %s after unit_scale was "
                "called (an adapter's, a resized embedding): kept as they are, not "
                "initialised for unit scale: %s. They take u-μP tags from their "
                "layer or their use in the graph: build a unit_scaling.optim "
                "optimizer after this call",
                len(added),
                type(context.module).__name__,
                ", ".join(dict.fromkeys(name_pattern(readable[n]) for n in added)),
            )
        if retagged:
            logger.warning(
                "unit_scale: the first call showed the u-μP type or fan-in of %d "
                "parameters no layer declares: %s. An optimizer built before this "
                "call gave them the learning rate their shape suggested; build it "
                "again",
                len(retagged),
                ", ".join(retagged),
            )
        return readable

    def _warn_unrecognised(
        self,
        graph: Graph,
        values: GraphValues,
        passed: set[Node],
        context: CaptureContext,
    ) -> None:
        """One warning per module for a loss normalised by an argument of the
        call in a way ``recognise_step_means`` does not know."""
        names = unrecognised_normalisers(graph, values, passed)
        if not names or self.warned_normalisation:
            return
        self.warned_normalisation = True
        logger.warning(
            "unit_scale: the loss of %s depends on %s, passed in by the caller, "
            "through ops that unit_scale does not recognise as a normalisation, so "
            "its gradient is not unit-scaled whatever that value is. Divide a "
            "sum-reduced loss by it (loss_sum / count: recognised as "
            "unit_scaling.functional.step_mean), or compute the loss from the "
            "model's output with U.cross_entropy and U.step_mean",
            type(context.module).__name__,
            ", ".join(names),
        )

    def _freeze_functorch_sections(
        self, graph: Graph, values: GraphValues
    ) -> set[Node]:
        """Code traced under ``vmap`` is left exactly as it is (its tensors carry
        batch levels a rewrite would break): its nodes become constants to every
        later stage, and the section is reported. Returns its nodes."""
        frozen: set[Node] = set()
        for section in functorch_sections(graph):
            frozen.update(section)
            ops = [n for n in section if not is_functorch_internal(n.target)]
            names = "+".join(dict.fromkeys(op_name(n) for n in ops)) or "vmap"
            for node in section:
                values.kinds[node] = Kind.CONST
            anchor = ops[-1] if ops else section[-1]
            self.report.ops.append(
                OpRecord(
                    names,
                    "left as is",
                    module_path(anchor),
                    "code traced under vmap (e.g. associative_scan) is not rewritten",
                )
            )
        return frozen

    def __call__(self, gm: GraphModule, context: CaptureContext) -> GraphModule:
        with collecting() as fallbacks:
            try:
                return self._transform(gm, context)
            finally:
                self.report.fallbacks.extend(fallbacks)

    def _transform(self, gm: GraphModule, context: CaptureContext) -> GraphModule:
        graph = gm.graph
        report = self.report
        before = len(report.ops)
        functionalize_inplace(graph)
        replace_functions(graph, self.replace, self.found)
        values = graph_values(
            gm,
            context.example_inputs,
            set(context.buffers) | self._constants_before(context),
        )
        frozen = self._freeze_functorch_sections(graph, values)
        for rule, node in rewrite_patterns(graph, values):
            record_op(report, node, "analytic", f"recognised: {rule}")
        replace_with_unit_scaled(graph, values, report)
        placeholders = zip(
            graph.find_nodes(op="placeholder"), context.example_inputs, strict=False
        )
        passed = {
            node for node, value in placeholders if id(value) in context.call_inputs
        }
        recognise_step_means(graph, values, report, passed, context.call_numbers)
        self._warn_unrecognised(graph, values, passed, context)
        model_inputs = {node for node in passed if values.is_data(node)}
        rewrite_low_rank_updates(graph, values, report)
        residuals = find_residuals(graph, values)
        self.residual_counts[id(gm)] = len(residuals)
        if self.residual_scaling is not None:
            # Branch i of this graph is branch ``before + i`` of the forward.
            before = sum(
                self.residual_counts.get(id(g), 0) for g, _ in context.graphs_before
            )
            total = max(self.branches or 0, before + len(residuals))
            tau = self.residual_scaling
            residuals = [
                dataclasses.replace(r, tau=tau(before + i, total))
                for i, r in enumerate(residuals)
            ]
        for residual in residuals:
            rewrite_residual(graph, residual, values)
            record_op(report, residual.root, "residual", f"tau={residual.tau}")
        unit_scale_adds(graph, values, report)
        readable = self._initialise_parameters(graph, values, context)
        scale_broadcast_gradients(graph, values)
        calibrate_regions(gm, values, report, frozen, self.measured)
        unconstrain_consistently(graph, values)
        unconstrain_inputs(graph, model_inputs)
        scale_direct_parameter_gradients(graph, values)
        self._calibrate_gradients(gm, values, context, readable)
        self.constant_outputs[id(gm)] = _constant_outputs(graph, values)
        write_to_config(context.module, encode(self.record()))
        left = [r for r in report.ops[before:] if r.how == "left as is"]
        if left:
            logger.warning(
                "unit_scale left %d op(s) of %s as they are, with neither a "
                "unit-scaling rule nor a calibrated scale: %s. Pass "
                "replace={op: unit_scaled_op} for these, or see "
                "model.unit_scale_report().",
                len(left),
                type(context.module).__name__,
                report.warning_text(left),
            )
        return gm


def _drop_non_finite(measured: GradientCalibration, readable: dict[Node, str]) -> None:
    """Leave out (and report) the gradients measured as NaN or infinite on
    stand-ins: no scale can be read from them."""
    for sizes in (measured.vertices, measured.parameters):
        for node, size in list(sizes.items()):
            if not size.finite:
                del sizes[node]
                name = readable.get(node, node.name)
                fell_back("gradient calibration", name, f"gradient RMS {size.rms}")


def _constant_outputs(graph: Graph, values: GraphValues) -> frozenset[int]:
    """Positions of the graph's outputs that are floating-point constants."""
    output = next(iter(graph.find_nodes(op="output")))
    returned = output.args[0] if isinstance(output.args[0], (tuple, list)) else ()
    return frozenset(
        i
        for i, node in enumerate(returned)
        if isinstance(node, Node)
        and values.kind(node) is Kind.CONST
        and (info := values.tensor(node)) is not None
        and info.is_float
    )


def _with_call_shapes(
    key: tuple[Any, ...], called: tuple[tuple[int, ...], ...]
) -> tuple[Any, ...]:
    """A capture key whose shapes also hold the call's input shapes."""
    where, op, shapes, occurrence = key
    return (where, op, (*shapes, *called), occurrence)
