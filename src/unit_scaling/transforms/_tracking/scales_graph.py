"""``module.scales_graph()``: the tracking pass's records, read back to the host
and merged into one FX graph whose nodes carry :class:`Metrics` and names."""

from __future__ import annotations

import copy
import re
from typing import Any

import torch
from torch import Tensor, nn
from torch.fx import Graph, Node

from .._capture.engine import Capture, RunState
from .._capture.graph import example_value
from .graph_pass import Key, Record, TrackingPass, is_tracked_value
from .metrics import Metrics, finalize

__all__ = ["ScalesGraph"]


class ScalesGraph:
    """``module.scales_graph()``: bound to the module's own transform state."""

    def __init__(self, state: RunState) -> None:
        self._state = state

    def __call__(self) -> Graph:
        """The graph of the last forward pass, every tracked tensor annotated
        (an empty graph before the first forward pass)."""
        state = self._state
        if not state.graphs_run_in_call:
            return Graph()
        tracking = state.pass_of(TrackingPass)
        return _scales_graph(tracking, state.graphs_run_in_call, state.captures)

    def __deepcopy__(self, memo: dict[int, Any]) -> ScalesGraph:
        # The module's state is copied first (it is set before this attribute).
        return ScalesGraph(copy.deepcopy(self._state, memo))


def _clean_name(name: str) -> str:
    """``l_self_modules_h_modules_0_parameters_weight_`` -> ``h.0.weight``."""
    name = re.sub(r"^[lL]_+(self_+)?", "", name).strip("_")
    name = re.sub(r"(^|_)(modules|parameters|buffers)_", ".", name)
    return name.strip(".")


def _read_statistics(records: dict[Key, Record]) -> dict[Key, Metrics.Data]:
    """All recorded statistics, copied to the host in one transfer per device."""
    by_device: dict[torch.device, list[Tensor]] = {}
    for raw, _ in records.values():
        if raw is not None:
            by_device.setdefault(raw.device, []).append(raw)
    host = {
        device: iter(torch.stack(raws).cpu().tolist())
        for device, raws in by_device.items()
    }
    return {
        key: finalize(None if raw is None else next(host[raw.device]), numel)
        for key, (raw, numel) in records.items()
    }


def _scales_graph(
    recorder: TrackingPass, captures: list[Capture], all_captures: list[Capture]
) -> Graph:
    """One graph holding every tracked tensor of the last forward pass."""
    fwd, bwd = _read_statistics(recorder.fwd), _read_statistics(recorder.bwd)
    bwd.update(
        (key, bwd[source])
        for key, source in recorder.bwd_alias.items()
        if source in bwd
    )
    merged = Graph()
    outputs: list[Any] = []
    for capture in captures:
        capture_id = all_captures.index(capture)
        tracked = recorder.graphs[capture_id]
        value_map: dict[Node, Node] = {}
        out = merged.graph_copy(tracked.graph, value_map)
        outputs.append(out)
        for old, new in value_map.items():
            value = example_value(old)
            fwd_key = (capture_id, tracked.fwd_source.get(old.name, old.name))
            bwd_key = (capture_id, tracked.bwd_source.get(old.name, old.name))
            # Nodes without a recorded value were checked at run time.
            is_float = is_tracked_value(value) or (
                "example_value" not in old.meta and fwd_key in fwd
            )
            new.meta["clean_name"] = old.meta.get("source_name") or _clean_name(
                old.name
            )
            new.meta["outputs_float_tensor"] = is_float
            new.meta["requires_grad"] = (
                isinstance(value, nn.Parameter) and value.requires_grad
            )
            if is_float and fwd_key in fwd:
                new.meta["metrics"] = Metrics(fwd[fwd_key], bwd.get(bwd_key))
    output = merged.output(tuple(outputs) if len(outputs) != 1 else outputs[0])
    output.meta.update(
        clean_name="output", outputs_float_tensor=False, requires_grad=False
    )
    return merged
