"""``unit-scaling report``: the tensor scales of a model before and after unit_scale.

A model is named ``package.module:factory`` (a callable returning an
``nn.Module``, or a ``(module, batch)`` pair), ``hf:<family>[:<size>]`` for a
Hugging Face language model built offline from its config with random weights,
or ``zoo:<name>`` for any architecture of :mod:`unit_scaling.zoo` (run on its own
example inputs, with a unit-normal gradient on its output).
The report is a scale plot for each version, a CSV of every tensor's statistics
(including the fractions FP8 E4M3/E5M2 would overflow or flush to zero) and a
markdown summary. A model with more than 120 tensors is plotted compactly, one
row per op of a layer and one column per layer (``--per-tensor`` keeps a row
per tensor).
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .._standins import normal_like, seeded

__all__ = ["HF_FAMILIES", "add_arguments", "load_model", "run"]


# Config keywords ``report`` adds to each family's zoo size.
_REPORT_CONFIG: dict[str, dict[str, Any]] = {
    "gpt2": dict(use_cache=False),
    "llama": dict(vocab_size=32000, use_cache=False),
    "bert": {},
}


def _hf_family(family: str) -> Callable[[str], nn.Module]:
    def build(size: str) -> nn.Module:
        from .. import zoo

        return zoo.hf_model(family, size, **_REPORT_CONFIG[family])  # type: ignore[arg-type]

    return build


HF_FAMILIES: dict[str, Callable[[str], nn.Module]] = {
    family: _hf_family(family) for family in _REPORT_CONFIG
}
"""Hugging Face families ``report`` builds from config (sizes ``tiny``, ``small``)."""
_SIZES = ("tiny", "small")


def _zoo_model(spec: str) -> Any:
    """The :class:`unit_scaling.zoo.ZooModel` named by ``zoo:<name>``, else None."""
    if not spec.startswith("zoo:"):
        return None
    from .. import zoo

    return zoo.get(spec[4:])


def load_model(spec: str) -> tuple[nn.Module, Tensor | None]:
    """The model named by ``spec`` and, if its factory gave one, its batch.

    Raises:
        ValueError: for a malformed or unknown name, with the accepted forms.
    """
    found = _zoo_model(spec)
    if found is not None:
        try:
            return found.make(), None
        except ImportError as error:
            raise ValueError(f"{spec}: {error}") from error
    if spec.startswith("hf:"):
        family, _, size = spec[3:].partition(":")
        size = size or "tiny"
        if family not in HF_FAMILIES or size not in _SIZES:
            raise ValueError(
                f"unknown Hugging Face model {spec!r}: expected hf:<family>[:<size>] "
                f"with family in {sorted(HF_FAMILIES)} and size in {list(_SIZES)}"
            )
        try:
            return HF_FAMILIES[family](size), None
        except ImportError as error:
            raise ValueError(
                f"{spec} needs Hugging Face transformers: "
                'pip install "torch-unit-scaling[hf]"'
            ) from error
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(
            f"cannot read model {spec!r}: expected package.module:factory (a "
            "callable returning an nn.Module or a (module, batch) pair) or "
            "hf:<family>[:<size>]"
        )
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except ImportError as error:
        raise ValueError(f"cannot import module {module_name!r}: {error}") from error
    except AttributeError as error:
        raise ValueError(f"module {module_name!r} has no {attr!r}") from error
    if not callable(factory):
        raise ValueError(f"{spec} is not callable")
    made = factory()
    model, batch = made if isinstance(made, tuple) else (made, None)
    if not isinstance(model, nn.Module):
        raise ValueError(
            f"{spec}() returned {type(model).__name__}; expected an nn.Module or a "
            "(module, batch) pair"
        )
    return model, batch


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the report's options to ``parser``."""
    parser.add_argument(
        "model",
        help="package.module:factory, hf:<family>[:<size>] (e.g. hf:gpt2:tiny) or "
        "zoo:<name> (e.g. zoo:mixtral; see unit_scaling.zoo.names())",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("out/report"),
        help="output folder (default: %(default)s)",
    )
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--per-tensor",
        action="store_true",
        help="plot one row per tensor even for a big model (default: above 120 "
        "tensors, a heatmap of each op of a layer by layer)",
    )


def _fraction_in_range(df: Any, low: float = 0.5, high: float = 2.0) -> float:
    """Share of activations, activation gradients and parameter gradients with
    RMS in ``[low, high]`` (parameter values and constant tensors left out)."""
    rms = (df["std"] ** 2 + df["abs_mean"] ** 2) ** 0.5
    counted = ~((df.direction == "fwd") & df.requires_grad) & (df.numel > 0)
    return float(((rms >= low) & (rms <= high))[counted].mean())


def run(args: argparse.Namespace) -> list[Path]:
    """Write the report for ``args.model``; return the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd  # type: ignore[import-untyped,unused-ignore]

    from ..analysis import example_batch, graph_to_dataframe, language_model_loss, plot
    from ..transforms import (
        prune_same_scale_tensors,
        track_scales,
        unit_scale,
        unit_scale_report,
    )

    torch.manual_seed(args.seed)
    model, batch = load_model(args.model)
    zoo_model = _zoo_model(args.model)
    if batch is None and zoo_model is None:
        batch = example_batch(args.batch_size, args.seq_len, seed=args.seed)

    def tracked_run(candidate: nn.Module) -> nn.Module:
        """``candidate`` tracked, after one forward and backward pass."""
        tracked = track_scales(candidate)
        if zoo_model is None:
            assert batch is not None
            loss = language_model_loss(tracked, batch)
            loss.backward()  # type: ignore[no-untyped-call]
        else:
            out = zoo_model.run(tracked, args.seed, 0)
            out.backward(normal_like(out, seeded(0)))
        return tracked

    args.out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    frames = []
    lines = [
        f"# Scale report: {args.model}\n",
        "| version | tensors | RMS in [0.5, 2] | any E4M3 overflow | "
        "any E5M2 underflow |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    runs = {"before": tracked_run(model), "after": tracked_run(unit_scale(model))}
    for version, tracked in runs.items():
        graph = prune_same_scale_tensors(tracked.scales_graph())  # type: ignore[operator]
        df = graph_to_dataframe(graph)
        df.insert(0, "version", version)
        frames.append(df)
        ax = plot(
            graph,
            title=f"{args.model}: {version} unit_scale",
            per_tensor=True if args.per_tensor else None,
        )
        path = args.out / f"scales_{version}.png"
        figure = ax.get_figure(root=True)
        assert figure is not None
        figure.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(figure)
        written.append(path)
        lines.append(
            f"| {version} | {df.node.nunique()} | {_fraction_in_range(df):.0%} | "
            f"{(df.e4m3_overflow > 0).mean():.0%} | "
            f"{(df.e5m2_underflow > 0).mean():.0%} |"
        )
    table = pd.concat(frames, ignore_index=True)
    csv = args.out / "scales.csv"
    table.to_csv(csv, index=False)
    lines += [
        "",
        "![before](scales_before.png)",
        "",
        "![after](scales_after.png)",
        "",
        f"Every tensor's statistics: [{csv.name}]({csv.name}).",
    ]
    summary = unit_scale_report(runs["after"])
    lines += ["", "## What unit_scale did", "", "```", str(summary), "```"]
    if summary.left_as_is:
        lines += [
            "",
            "Left as they are (no rule, no calibration): "
            + summary.warning_text(summary.left_as_is),
        ]
    report = args.out / "report.md"
    report.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[1 : lines.index("")]))
    print(summary)
    return [*written, csv, report]
