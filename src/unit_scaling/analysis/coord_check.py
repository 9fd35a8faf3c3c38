"""Coordinate checks: do activation scales stay put as a model grows wider?

μP's promise is that the size of every activation, and of its change during
training, is independent of width. A *coordinate check* tests this directly: build
the model at several widths, train each for a few steps on the same batches, and
record the RMS of every layer's output. Under a good parametrisation the curves
of RMS against width are flat; under the standard parametrisation they spread.

With ``updates=True`` it also records what μP theory is stated in: how much each
optimizer step changes a layer's own weights relative to their size
(``‖ΔW‖/‖W‖``) and how much that change alone moves the layer's output on the
same input (``‖ΔW·x‖/‖W·x‖`` for a linear layer; any module with parameters is
simply run again). Under μP the second is independent of width for every layer;
a layer whose output update shrinks as the model widens stops learning there.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from .._torch_internals import pytree
from ._corpus import analysis_corpus
from ._optional import require_plot_extra
from .visualiser import LossFn, language_model_loss

if TYPE_CHECKING:  # pandas and matplotlib are imported when a function runs
    import pandas as pd  # type: ignore[import-untyped,unused-ignore]
    from matplotlib.figure import Figure

__all__ = ["coord_check", "coord_check_spread", "plot_coord_check"]

ModelFactory = Callable[[int], tuple[nn.Module, torch.optim.Optimizer]]
ModuleFilter = Callable[[str, nn.Module], bool]

_COLUMNS = ["label", "width", "step", "module", "group", "type", "rms", "loss"]
_UPDATE_COLUMNS = ["weight_update", "output_update"]
_VALUES = {
    "rms": "activation RMS",
    "weight_update": "‖ΔW‖ / ‖W‖",
    "output_update": "‖Δy‖ / ‖y‖",
}


def _layers(name: str, module: nn.Module, parent: nn.Module | None) -> bool:
    """The default selection: leaf modules and the blocks of a layer list."""
    if not name:
        return False
    is_leaf = next(module.children(), None) is None
    return is_leaf or isinstance(parent, (nn.ModuleList, nn.Sequential))


def _group(name: str) -> str:
    """``layers.3.mlp.linear_1`` -> ``layers.*.mlp.linear_1``."""
    return re.sub(r"(^|\.)\d+(?=\.|$)", r"\1*", name)


def _first_float_tensor(output: Any) -> Tensor | None:
    for leaf in pytree.tree_leaves(output):
        if isinstance(leaf, Tensor) and leaf.is_floating_point():
            return leaf
    return None


def _selected_modules(
    model: nn.Module, include: ModuleFilter | None
) -> list[tuple[str, nn.Module]]:
    parents = {
        f"{name}.{child_name}" if name else child_name: parent
        for name, parent in model.named_modules()
        for child_name, _ in parent.named_children()
    }
    return [
        (name, module)
        for name, module in model.named_modules()
        if (
            include(name, module)
            if include is not None
            else _layers(name, module, parents.get(name))
        )
    ]


class _Call:
    """One module call kept for replay: its inputs, output and own parameters."""

    def __init__(self, args: Any, kwargs: dict[str, Any], output: Tensor) -> None:
        self.args = pytree.tree_map(_detached, args)
        self.kwargs = pytree.tree_map(_detached, kwargs)
        self.output = output.detach()


def _detached(x: Any) -> Any:
    return x.detach() if isinstance(x, Tensor) else x


def _rms(x: Tensor) -> Tensor:
    return x.detach().float().pow(2).mean().sqrt()


def _record_step(
    model: nn.Module,
    modules: list[tuple[str, nn.Module]],
    loss_fn: LossFn,
    batch: Tensor,
    keep_calls: bool = False,
) -> tuple[dict[str, float], Tensor, dict[str, _Call]]:
    """Run ``loss_fn`` once, returning each selected module's output RMS (and,
    with ``keep_calls``, the call of each module that has parameters of its own)."""
    outputs: dict[str, Tensor] = {}
    calls: dict[str, _Call] = {}

    def hook(name: str, owns_parameters: bool) -> Callable[..., None]:
        def record(
            module: nn.Module, args: Any, kwargs: dict[str, Any], output: Any
        ) -> None:
            tensor = _first_float_tensor(output)
            leaves = pytree.tree_leaves((args, kwargs))
            # Identity-like modules (dropout with p=0) would only repeat a row.
            if tensor is None or any(tensor is x for x in leaves):
                return
            outputs[name] = _rms(tensor)
            if keep_calls and owns_parameters and name not in calls:
                calls[name] = _Call(args, kwargs, tensor)

        return record

    handles = [
        m.register_forward_hook(
            hook(name, next(m.parameters(recurse=False), None) is not None),
            with_kwargs=True,
        )
        for name, m in modules
    ]
    try:
        loss = loss_fn(model, batch)
    finally:
        for handle in handles:
            handle.remove()
    if not outputs:
        return {}, loss, calls
    values = torch.stack(list(outputs.values())).tolist()  # one host transfer
    return dict(zip(outputs, values, strict=True)), loss, calls


def _own_parameters(module: nn.Module) -> list[Tensor]:
    return [p for p in module.parameters(recurse=False) if p.is_floating_point()]


def _updates(
    modules: dict[str, nn.Module],
    calls: dict[str, _Call],
    before: dict[str, list[Tensor]],
) -> dict[str, tuple[float, float]]:
    """``(‖ΔW‖/‖W‖, ‖Δy‖/‖y‖)`` of each called module after an optimizer step:
    the step's change of the module's own parameters relative to their size, and
    the change of its output on the same input that this alone causes (the input
    is replayed; upstream layers' updates do not enter)."""
    ratios: list[Tensor] = []
    names = []
    with torch.no_grad():
        for name, call in calls.items():
            module = modules[name]
            old = before[name]
            new = _own_parameters(module)
            change = torch.stack(
                [(n - o).float().pow(2).sum() for n, o in zip(new, old, strict=True)]
            ).sum()
            size = torch.stack([o.float().pow(2).sum() for o in old]).sum()
            # The replay is a measurement: buffers it updates (a batch norm's
            # running statistics) get their values back.
            buffers = [(b, b.clone()) for b in module.buffers(recurse=False)]
            replayed = _first_float_tensor(module(*call.args, **call.kwargs))
            for buffer, value in buffers:
                buffer.copy_(value)
            if replayed is None or replayed.shape != call.output.shape:
                continue
            ratios.append((change / size).sqrt())
            ratios.append(_rms(replayed - call.output) / _rms(call.output))
            names.append(name)
    if not names:
        return {}
    values = torch.stack(ratios).tolist()  # one host transfer
    return {name: (values[2 * i], values[2 * i + 1]) for i, name in enumerate(names)}


def coord_check(
    make_model: ModelFactory,
    widths: Sequence[int],
    *,
    steps: int = 4,
    batch_size: int = 8,
    seq_len: int = 64,
    seed: int = 0,
    loss_fn: LossFn | None = None,
    include: ModuleFilter | None = None,
    label: str = "model",
    device: torch.device | str | None = None,
    updates: bool = False,
) -> pd.DataFrame:
    """Train a model at several widths and record every layer's output RMS.

    For each width: seed torch with ``seed``, build ``(model, optimizer) =
    make_model(width)``, then take ``steps`` optimizer steps on batches of the
    built-in corpus (the same batches for every width). Before each step and
    after the last, forward hooks record the RMS of the output of every selected
    module.

    Args:
        make_model: ``width -> (model, optimizer)``, the model on ``device``.
        widths: the widths to compare, e.g. ``[64, 128, 256, 512]``.
        steps: number of optimizer steps (``steps + 1`` measurements, the first
            at initialisation).
        batch_size, seq_len: of each training batch (byte tokens).
        seed: seeds the model's initialisation and the batches.
        loss_fn: ``loss_fn(model, batch) -> scalar``. Default:
            :func:`language_model_loss` (``model.loss`` or next-token
            cross-entropy).
        include: ``include(name, module) -> bool`` selects the recorded modules.
            Default: every leaf module, plus each block of an ``nn.ModuleList``
            or ``nn.Sequential`` (e.g. transformer layers). A module whose output
            is its input (dropout with ``p=0``) is skipped.
        label: the value of the ``label`` column, to tell models apart after
            ``pd.concat``.
        device: where batches go. Default: the device of the model's first
            parameter.
        updates: also record, for every selected module with parameters of its
            own, the size of each optimizer step: ``weight_update``,
            ``‖ΔW‖/‖W‖`` over the module's own parameters, and ``output_update``,
            ``‖Δy‖/‖y‖``, the change of the module's output when it is run again
            on the same input after the step (so only its own update counts).
            μP asks the second to be independent of width.

    Returns:
        A long :class:`pandas.DataFrame` with one row per width, step and module:
        ``label``, ``width``, ``step`` (optimizer steps taken before the
        measurement), ``module`` (qualified name), ``group`` (the name with layer
        indices replaced by ``*``, e.g. ``layers.*.mlp.linear_1``), ``type``
        (class name), ``rms`` and ``loss`` (the loss at that step). With
        ``updates``, also ``weight_update`` and ``output_update``: those of the
        step taken right after the measurement (NaN at the last measurement and
        for modules without parameters of their own).

    Example::

        >>> def make(width):
        ...     model = uu.TransformerDecoder(width, 256, layers=2, heads=width // 32)
        ...     return model, uu.optim.AdamW(model.parameters(), lr=2**-3)
        >>> df = coord_check(make, [64, 128, 256], steps=3, label="u-μP",
        ...                  updates=True)
        >>> plot_coord_check(df).savefig("coord_check.png")
        >>> plot_coord_check(df, value="output_update").savefig("updates.png")
    """
    require_plot_extra()
    import pandas as pd

    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    if not widths or any(int(w) != w or w < 1 for w in widths):
        raise ValueError(
            f"widths must be a non-empty list of positive ints, got {widths}"
        )
    loss_fn = loss_fn or language_model_loss
    corpus = analysis_corpus()
    rows: list[dict[str, Any]] = []
    for width in widths:
        torch.manual_seed(seed)
        model, optimizer = make_model(int(width))
        parameter = next(model.parameters(), None)
        target = device or (parameter.device if parameter is not None else "cpu")
        stream = corpus.batches("train", batch_size, seq_len, seed, device=target)
        modules = _selected_modules(model, include)
        if not modules:
            raise ValueError(
                "coord_check: no module selected to record; check `include`"
            )
        types = {name: type(module).__name__ for name, module in modules}
        by_name = dict(modules)
        model.train()
        for step in range(steps + 1):
            batch = next(stream)
            keep = updates and step < steps
            rms, loss, calls = _record_step(model, modules, loss_fn, batch, keep)
            loss_value = float(loss.detach())
            first = len(rows)
            rows += [
                {
                    "label": label,
                    "width": int(width),
                    "step": step,
                    "module": name,
                    "group": _group(name),
                    "type": types[name],
                    "rms": value,
                    "loss": loss_value,
                }
                for name, value in rms.items()
            ]
            if step < steps:
                before = {
                    name: [p.detach().clone() for p in _own_parameters(by_name[name])]
                    for name in calls
                }
                optimizer.zero_grad(set_to_none=True)
                loss.backward()  # type: ignore[no-untyped-call]
                optimizer.step()
                measured = _updates(by_name, calls, before)
                for row in rows[first:]:
                    ratios = measured.get(row["module"])
                    if ratios is not None:
                        row["weight_update"], row["output_update"] = ratios
    columns = _COLUMNS + (_UPDATE_COLUMNS if updates else [])
    return pd.DataFrame(rows, columns=columns)


def _mean_over_layers(df: pd.DataFrame, by: str, value: str = "rms") -> pd.DataFrame:
    """Geometric mean of ``value`` over the modules of each (label, by, step,
    width), as ``log2_<value>``. An update column's NaN (no step measured) is
    left out; a NaN RMS (a diverged run) stays visible as NaN."""
    if value != "rms":
        df = df[df[value].notna()]
    logged = df.assign(log2_value=df[value].map(_log2))
    return (
        logged.groupby(["label", by, "step", "width"], sort=False)["log2_value"]
        .mean()
        .reset_index()
    )


def _check_value(df: pd.DataFrame, value: str, caller: str) -> None:
    if value not in _VALUES:
        raise ValueError(
            f"{caller}: value must be one of {sorted(_VALUES)}, got {value!r}"
        )
    if value not in df.columns:
        raise ValueError(
            f"{caller}: df has no {value!r} column; run coord_check(..., "
            "updates=True) to record the update sizes"
        )


def _log2(x: float) -> float:
    if math.isnan(x):  # a diverged run: keep it visible as NaN, not as a number
        return math.nan
    return math.log2(x) if x > 0 else -math.inf


def coord_check_spread(
    df: pd.DataFrame, by: str = "group", value: str = "rms"
) -> pd.DataFrame:
    """How much each layer's RMS (or ``value``) changes across width, per step.

    Layers of one ``by`` value (e.g. all ``layers.*.mlp.linear_1``) are averaged
    (geometric mean) first. ``value`` is the column measured: ``"rms"``
    (default), or ``"weight_update"`` / ``"output_update"`` from
    ``coord_check(..., updates=True)``.

    Returns:
        One row per ``label``, ``by`` value and ``step`` with ``spread`` (log₂ of
        the largest over the smallest RMS across widths: 0 is perfectly flat, 1
        a factor of two) and ``slope`` (least-squares slope of log₂ RMS against
        log₂ width: 0 is flat, ½ grows like ``sqrt(width)``).

    Raises:
        ValueError: an unknown ``value``, or one ``df`` does not have.

    Example::

        >>> import pandas as pd
        >>> df = pd.DataFrame({"label": "u-μP", "group": "embedding", "step": 0,
        ...                    "width": [64, 128, 256], "rms": [1.0, 1.1, 1.0]})
        >>> row = coord_check_spread(df).iloc[0]
        >>> round(float(row["spread"]), 3), round(float(row["slope"]), 3)
        (0.138, 0.0)
    """
    require_plot_extra()
    import pandas as pd

    _check_value(df, value, "coord_check_spread")
    means = _mean_over_layers(df, by, value)
    rows = []
    for (label, key, step), part in means.groupby(["label", by, "step"], sort=False):
        x = [math.log2(w) for w in part["width"]]
        y = list(part["log2_value"])
        x_mean, y_mean = sum(x) / len(x), sum(y) / len(y)
        var = sum((a - x_mean) ** 2 for a in x)
        slope = (
            sum((a - x_mean) * (b - y_mean) for a, b in zip(x, y, strict=True)) / var
            if var > 0
            else 0.0
        )
        rows.append(
            {
                "label": label,
                by: key,
                "step": step,
                "spread": max(y) - min(y),
                "slope": slope,
            }
        )
    return pd.DataFrame(rows, columns=["label", by, "step", "spread", "slope"])


def _layout(
    panels: list[str], labels: list[str]
) -> tuple[int, int, list[tuple[str, str]]]:
    """Grid shape and the (panel, label) of each cell, row-major.

    Several labels: a row per panel and a column per label, so each
    parametrisation is compared with the other on the same y scale. One label:
    the panels wrap into up to four columns.
    """
    if len(labels) > 1:
        cells = [(panel, label) for panel in panels for label in labels]
        return len(panels), len(labels), cells
    ncols = min(4, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    return nrows, ncols, [(panel, labels[0]) for panel in panels]


def plot_coord_check(
    df: pd.DataFrame,
    by: str = "group",
    panels: Sequence[str] | None = None,
    *,
    title: str = "",
    panel_size: tuple[float, float] = (3.2, 1.9),
    value: str = "rms",
) -> Figure:
    """Plot a :func:`coord_check`: activation RMS (or an update size) against
    width, a line per step.

    One panel per value of ``by`` (layers of one value averaged, geometric mean).
    With several ``label`` values (e.g. u-μP and the standard parametrisation,
    after ``pd.concat``) each panel becomes a row with one column per label,
    sharing the y axis so the two compare directly. Both axes are log₂; lines go
    from dark (initialisation) to light (the last step). Flat lines mean the
    parametrisation keeps that layer's scale independent of width.

    Args:
        df: the output of :func:`coord_check` (or several, concatenated).
        by: the column that defines a panel: ``"group"`` (default), ``"type"``,
            ``"module"`` or a column you added.
        panels: the values of ``by`` to show, in order. Default: all that have
            ``value`` (an update column has none for modules without parameters
            of their own), in order of first appearance.
        title: the figure title.
        panel_size: width and height of one panel in inches.
        value: what to plot: ``"rms"`` (default), ``"weight_update"``
            (``‖ΔW‖/‖W‖`` of each step) or ``"output_update"`` (the change of the
            layer's output that its own step causes, ``‖Δy‖/‖y‖``); the update
            columns come from ``coord_check(..., updates=True)``.

    Returns:
        The :class:`matplotlib.figure.Figure`.

    Raises:
        ValueError: ``df`` lacks a column, is empty, has no such panel, or does
            not have ``value``.

    Example::

        >>> import pandas as pd
        >>> rows = {"group": "embedding", "step": 0, "width": [64, 128, 256]}
        >>> umup = pd.DataFrame({**rows, "label": "u-μP", "rms": [1.0, 1.0, 1.0]})
        >>> sp = pd.DataFrame({**rows, "label": "SP", "rms": [1.0, 1.4, 2.0]})
        >>> fig = plot_coord_check(pd.concat([umup, sp]), panels=["embedding"])
        >>> fig.savefig("coord_check.png", dpi=150)
    """
    require_plot_extra()
    import matplotlib.pyplot as plt

    missing = {"label", "width", "step", by} - set(df.columns)
    if missing:
        raise ValueError(
            f"plot_coord_check: df lacks the columns {sorted(missing)}; pass the "
            "output of coord_check (or a concatenation of several)"
        )
    if df.empty:
        raise ValueError("plot_coord_check: df is empty")
    _check_value(df, value, "plot_coord_check")
    available = list(dict.fromkeys(df[by]))
    # An update column has values only for modules with parameters of their own.
    measured = (
        available if value == "rms" else list(dict.fromkeys(df[df[value].notna()][by]))
    )
    panels = list(panels) if panels is not None else measured
    unknown = [p for p in panels if p not in available]
    if unknown:
        raise ValueError(
            f"plot_coord_check: no {by!r} named {unknown}; available: {available}"
        )
    labels = list(dict.fromkeys(df["label"]))
    means = _mean_over_layers(df[df[by].isin(panels)], by, value)
    steps = sorted(means["step"].unique())
    colours = plt.get_cmap("viridis")
    widths = sorted(df["width"].unique())
    compare = len(labels) > 1

    nrows, ncols, cells = _layout(panels, labels)
    fig, axes = plt.subplots(
        nrows,
        ncols,
        figsize=(panel_size[0] * ncols + 1.2, panel_size[1] * nrows + 0.8),
        squeeze=False,
        sharex=True,
        sharey="row" if compare else False,
        layout="constrained",
    )
    for ax in axes.flat[len(cells) :]:
        ax.set_axis_off()
    for ax, (panel, label) in zip(axes.flat, cells, strict=False):
        part = means[(means["label"] == label) & (means[by] == panel)]
        for step in steps:
            line = part[part["step"] == step].sort_values("width")
            ax.plot(
                line["width"],
                [2.0**v for v in line["log2_value"]],
                marker="o",
                ms=3,
                lw=1.3,
                color=colours(0.85 * step / max(1, steps[-1])),
                label=f"step {step}",
            )
        ax.set_xscale("log", base=2)
        if not part.empty:  # (an empty log axis cannot place its ticks)
            ax.set_yscale("log", base=2)
        ax.set_xticks(widths, [str(w) for w in widths])
        ax.minorticks_off()
        ax.grid(color="#dddddd", lw=0.5)
        ax.tick_params(labelsize=8)
        if not compare:
            ax.set_title(str(panel), fontsize=9)
            ax.set_ylabel(_VALUES[value], fontsize=8)
        if part.empty:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center")
    if compare:
        for c, label in enumerate(labels):
            axes[0][c].set_title(str(label), fontsize=10, fontweight="bold")
        for r, panel in enumerate(panels):
            short = "RMS" if value == "rms" else _VALUES[value]
            axes[r][0].set_ylabel(f"{panel}\n{short}", fontsize=9)
    for ax in axes[-1]:
        ax.set_xlabel("width", fontsize=9)
    handles, names = next(
        (ax.get_legend_handles_labels() for ax in axes.flat if ax.lines), ([], [])
    )
    fig.legend(handles, names, loc="outside right center", fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig
