"""The model-zoo table of the results pages: how ``unit_scale`` does on every
architecture of ``unit_scaling.zoo``.

For each model: the fraction of parameter gradients and of tracked tensors at
unit scale (RMS in [0.5, 2]) at the traced shapes and at a second set of shapes,
the time to the first output of ``unit_scale(model)`` (tracing, rewriting and
calibrating included), and how many ops got an analytic rule, a calibrated scale,
or neither. Each model runs in a fresh process (so timings are not warmed by the
previous model), one at a time.

    python experiments/zoo_table.py            # every model (about 20 minutes)
    python experiments/zoo_table.py gpt2 t5    # some

Writes ``docs/results/zoo.md``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def measure(name: str) -> dict[str, Any]:
    """Everything the table shows for one model (run in a child process)."""
    import logging

    import torch

    from unit_scaling import zoo
    from unit_scaling.analysis.coverage import unit_scale_coverage
    from unit_scaling.transforms import unit_scale

    warnings.filterwarnings("ignore")
    logging.getLogger("unit_scaling").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    model = zoo.get(name)
    start = time.perf_counter()
    scaled = unit_scale(model.make(0))
    model.run(scaled, 0, 0)
    first = time.perf_counter() - start
    counts = scaled.unit_scale_report().counts()  # type: ignore[operator]
    traced, second = unit_scale_coverage(
        model.make(0), model.example(0, 0), model.example(0, 1), output=model.output
    )
    return {
        "name": name,
        "family": model.family,
        "features": ", ".join(model.features),
        "params": [traced.parameter_fraction, second.parameter_fraction],
        "tensors": [traced.tensor_fraction, second.tensor_fraction],
        "counted": len(traced.tensors),
        "first_output_s": first,
        "analytic": counts.get("analytic", 0) + counts.get("residual", 0),
        "calibrated": counts.get("calibrated", 0) + counts.get("unit already", 0),
        "left": counts.get("left as is", 0),
        "failing": traced.describe(limit=6),
    }


def _row(r: dict[str, Any]) -> str:
    def pct(pair: list[float]) -> str:
        return " / ".join(f"{v:.0%}" for v in pair)

    return (
        f"| {r['name']} | {r['family']} | {pct(r['params'])} | {pct(r['tensors'])} "
        f"| {r['counted']} | {r['first_output_s']:.1f} | {r['analytic']} "
        f"| {r['calibrated']} | {r['left']} |"
    )


def table(results: list[dict[str, Any]]) -> str:
    header = (
        "| model | family | parameter gradients | tensors | counted | "
        "first output (s) | analytic | calibrated | left as is |\n"
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    )
    return "\n".join([header, *(_row(r) for r in results)])


def write(results: list[dict[str, Any]]) -> None:
    below = [r["name"] for r in results if min(*r["params"], *r["tensors"]) < 0.9]
    text = table(results)
    note = (
        f"{len(results)} models; at unit scale = RMS in [0.5, 2]; each cell "
        "'traced shapes / second shapes'. Below 90% somewhere: "
        + (", ".join(below) or "none")
        + "."
    )
    docs = ROOT / "docs" / "results" / "zoo.md"
    details = "\n".join(
        f"- **{r['name']}** ({r['features']}): {r['failing']}" for r in results
    )
    docs.write_text(
        "# `unit_scale` on the model zoo\n\n"
        "Written by `python experiments/zoo_table.py` "
        "(see its docstring for what each column measures).\n\n"
        f"{text}\n\n{note}\n\n## What each model leaves off unit scale\n\n"
        f"{details}\n"
    )


def main() -> None:
    from unit_scaling import zoo

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", help="zoo names (default: all)")
    parser.add_argument("--json", type=Path, help="also save the raw results here")
    args = parser.parse_args()
    names = args.models or [n for n in zoo.names() if zoo.get(n).available()]
    results = []
    context = multiprocessing.get_context("spawn")
    for name in names:
        with context.Pool(1) as pool:
            result = pool.apply(measure, (name,))
        results.append(result)
        print(_row(result), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if not args.models:
        write(results)


if __name__ == "__main__":
    main()
