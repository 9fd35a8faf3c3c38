"""Section (a): the zoo's transforms on the GPU against the CPU.

For each fast zoo model and each of ``unit_scale``, ``track_scales`` and
``simulate_fp8(unit_scale(·))``: one model built on the CPU from seed 0, a copy
moved to the device (the other :class:`~.agreement.Side`), the transform
applied to each, both fed the same inputs and backpropagated from the same
output gradient (drawn on the CPU), TF32 off. Compared by
:func:`~.agreement.compare_sides`, the CPU side as the reference:

* the forward output and every parameter gradient: ``‖cuda − cpu‖ / ‖cpu‖``
  (the largest over parameters, naming the worst; a gradient zero in exact
  arithmetic, as an attention key's bias's, against 1e-6 of the median
  gradient norm instead of its own), target ≤ 1e-4;
* the transform's report: ``unit_scale``'s op and parameter records and tags
  (calibrated gradient scales within 1e-4), ``track_scales``'s tracked tensors
  and their statistics (mean |x|, std, max |x| within 1e-4): equal;
* what each side wrote to stderr (file descriptor 2, so C++ and torch.fx's
  printed tracebacks count): empty. Our own log records and Python warnings
  are collected and counted, not printed.

Models run in parallel worker processes (``--jobs``), one model a task, until
the section's time budget ends: models not started by then are listed as not
measured.
"""

from __future__ import annotations

import copy
import math
import multiprocessing
import os
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ._common import (
    Deadline,
    SectionResult,
    Settings,
    Target,
    captured_stderr,
    collected_messages,
    markdown_table,
    seeded_randn,
    short,
    turn_off_tf32,
)
from .agreement import CPU, DeviceSide, Report, Side, SideResult, compare_sides

TOLERANCE = 1e-4
TRANSFORMS = ("unit_scale", "track_scales", "simulate_fp8")
# Zoo models for --cpu-check: quick to trace, with and without transformers.
CPU_CHECK_MODELS = ("mlp", "nanogpt")
_METRIC_FIELDS = ("mean_abs", "std", "abs_max")
# The slowest fast models, slowest first (both sides, the three transforms:
# 40-230 s on a loaded 2-core CPU, most others 5-30 s): handed to the workers
# first so that none of them is left running alone at the end.
SLOWEST = (
    "mobilenet-v2",
    "unet2d-condition",
    "unet2d",
    "speech-to-text",
    "bit",
    "mamba2",
    "olmoe",
    "whisper",
    "beit",
    "bart",
)


def _transform(name: str) -> Callable[[nn.Module], nn.Module]:
    from unit_scaling.transforms import simulate_fp8, track_scales, unit_scale

    return {
        "unit_scale": unit_scale,
        "track_scales": track_scales,
        "simulate_fp8": lambda m: simulate_fp8(unit_scale(m)),
    }[name]


def _report(transform: str, model: nn.Module) -> Report:
    """The transform's report as plain data."""
    if transform == "track_scales":
        graph = model.scales_graph()  # type: ignore[operator]
        entries, numbers = [], {}
        for node in graph.nodes:
            metrics = node.meta.get("metrics")
            if metrics is None:
                continue
            name = node.meta["clean_name"]
            entries.append((name, metrics.bwd is not None))
            for side in ("fwd", "bwd"):
                data = getattr(metrics, side)
                for field in _METRIC_FIELDS if data is not None else ():
                    numbers[f"{name}.{side}.{field}"] = float(getattr(data, field))
        return Report(entries, numbers)
    from unit_scaling.transforms import unit_scale_report

    report = unit_scale_report(model)
    return Report(
        [
            [repr(r) for r in report.ops],
            [(p.name, p.role, p.init) for p in report.parameters],
            sorted((name, repr(tag)) for name, tag in report.tags.items()),
        ],
        {p.name: p.grad_scale for p in report.parameters},
    )


def run_side(
    model_name: str, transform: str, base: nn.Module, side: Side
) -> SideResult:
    """The transform of a copy of ``base`` on ``side``: its output, parameter
    gradients, report, stderr and collected messages."""
    from unit_scaling import zoo

    entry = zoo.get(model_name)
    result = SideResult()
    with captured_stderr() as stderr, collected_messages() as messages:
        try:
            model = _transform(transform)(side.put_model(copy.deepcopy(base)))
            args, kwargs = side.put(entry.example(0, 0))
            output = entry.output(model(*args, **kwargs))
            grad = side.put(seeded_randn(*output.shape, seed=1, device=CPU.device))
            output.backward(grad.to(output.dtype))  # type: ignore[no-untyped-call]
            result.output = side.back(output)
            result.grads = {
                n: side.back(p.grad)
                for n, p in model.named_parameters()
                if p.grad is not None
            }
            result.report = _report(transform, model)
        except Exception as error:  # recorded in the table, not raised
            result.error = short(f"{type(error).__name__}: {error}", 300)
    result.stderr = stderr[0]
    result.messages = messages
    return result


def compare(model_name: str, transform: str, other: Side) -> dict[str, Any]:
    """One row: ``transform`` of ``model_name`` on ``other`` against the CPU."""
    from unit_scaling import zoo

    begin = time.perf_counter()
    # Building a model may import a package that prints (torchao through
    # transformers): reported apart, as the imports are.
    with captured_stderr() as building:
        base = zoo.get(model_name).make(0)
    reference = run_side(model_name, transform, base, CPU)
    result = run_side(model_name, transform, base, other)
    row: dict[str, Any] = {"model": model_name, "transform": transform}
    row.update(compare_sides(reference, result, other.name))
    row["build_stderr"] = building[0]
    row["seconds"] = time.perf_counter() - begin
    return row


def _failed_model(model_name: str, error: Exception) -> list[dict[str, Any]]:
    """Rows for a model whose task raised before any transform ran."""
    text = short(f"{type(error).__name__}: {error}", 300)
    return [
        {
            "model": model_name,
            "transform": t,
            "error": text,
            "error_side": "both",
            "stderr_cpu": "",
            "stderr_device": "",
            "messages_cpu": 0,
            "messages_device": 0,
            "first_messages": [],
            "build_stderr": "",
        }
        for t in TRANSFORMS
    ]


_STARTED = False


def _worker_setup(threads: int) -> str:
    """Once per worker: threads, TF32 off, the device started (what that
    prints is returned, reported apart from the rows, as what importing a
    model's packages prints while it is built)."""
    global _STARTED
    if _STARTED:
        return ""
    _STARTED = True
    torch.set_num_threads(threads)
    turn_off_tf32()
    with captured_stderr() as stderr:
        if torch.cuda.is_available():
            torch.zeros(1, device="cuda")
    return stderr[0]


def run_model(
    model_name: str, other: Side, threads: int
) -> tuple[list[dict[str, Any]], str]:
    """Every transform of one model (a worker's task); what importing printed."""
    noise = _worker_setup(threads)
    rows = [compare(model_name, t, other) for t in TRANSFORMS]
    return rows, noise


def _fmt(x: float | None) -> str:
    if x is None:
        return ""
    return "inf" if math.isinf(x) else f"{x:.1e}"


def run(
    settings: Settings, deadline: Deadline, other: Side | None = None
) -> SectionResult:
    """Every fast zoo model, in ``settings.jobs`` worker processes, on
    ``other`` (by default ``settings.device``) against the CPU."""
    from unit_scaling import zoo

    if other is None:
        other = DeviceSide(settings.device)

    names = list(settings.models or zoo.names(include_slow=False))
    if settings.cpu_check and settings.models is None:
        names = list(CPU_CHECK_MODELS)
    missing = {n: zoo.get(n).requires for n in names if not zoo.get(n).available()}
    names = [n for n in names if n not in missing]
    order = {name: i for i, name in enumerate(names)}
    first = [n for n in SLOWEST if n in order]
    queue = first + [n for n in names if n not in first]
    threads = max(1, (os.cpu_count() or 1) // max(settings.jobs, 1))
    context = multiprocessing.get_context("spawn")
    rows: list[dict[str, Any]] = []
    noise: list[str] = []
    with context.Pool(settings.jobs) as pool:
        pending = {
            name: pool.apply_async(run_model, (name, other, threads)) for name in queue
        }
        while pending and deadline.left() > 0:
            for name in [n for n, r in pending.items() if r.ready()]:
                try:
                    got, printed = pending.pop(name).get()
                except Exception as error:  # building the model failed, say
                    got, printed = _failed_model(name, error), ""
                rows += got
                for text in (printed, *(r["build_stderr"] for r in got)):
                    if text.strip():
                        noise.append(short(text, 400))
                print(f"    zoo: {name} done ({len(pending)} to go)", flush=True)
            time.sleep(0.2)
        pool.terminate()  # models not finished by the deadline: not measured
    rows.sort(key=lambda r: (order[r["model"]], TRANSFORMS.index(r["transform"])))
    unmeasured = sorted(pending, key=order.__getitem__)
    return _result(other.name, rows, unmeasured, missing, noise)


def _result(
    device: str,
    rows: list[dict[str, Any]],
    unmeasured: list[str],
    missing: dict[str, tuple[str, ...]],
    noise: list[str],
) -> SectionResult:
    measured = [r for r in rows if r["error"] is None]
    worst = max((max(r["output"], r["grads"]) for r in measured), default=None)
    quiet = [r for r in rows if not (r["stderr_cpu"] or r["stderr_device"])]
    equal = [
        r
        for r in measured
        if r["report_entries_equal"] and r["report_numbers"] <= TOLERANCE
    ]
    complete = bool(rows) and not unmeasured
    targets = [
        Target(
            f"zoo: forward output and every parameter gradient, {device} vs CPU "
            "(TF32 off), largest relative difference",
            f"≤ {TOLERANCE:g}",
            *_verdict_number(worst, len(measured), len(rows), complete),
        ),
        Target(
            "zoo: transform reports equal on both devices",
            "all",
            f"{len(equal)} of {len(rows)} runs",
            (len(equal) == len(rows)) if complete else None,
        ),
        Target(
            "zoo: nothing printed to stderr (either side)",
            "all",
            f"{len(quiet)} of {len(rows)} runs",
            (len(quiet) == len(rows)) if complete else None,
        ),
    ]
    table_rows = []
    for r in rows:
        if r["error"] is not None:
            cells = ["failed", "", "", "", short(f"{r['error_side']}: {r['error']}")]
        else:
            report = "equal" if r["report_entries_equal"] else "entries differ"
            cells = [
                _fmt(r["output"]),
                _fmt(r["grads"]),
                r["worst_param"] if r["grads"] > 0 else "",
                f"{report}; numbers {_fmt(r['report_numbers'])}",
                "",
            ]
        printed = " / ".join(
            short(r[k], 120) or "-" for k in ("stderr_cpu", "stderr_device")
        )
        messages = f"{r['messages_cpu']} / {r['messages_device']}"
        table_rows.append((r["model"], r["transform"], *cells, printed, messages))
    headers = (
        "model",
        "transform",
        "output rel. diff.",
        "largest gradient rel. diff.",
        "its parameter",
        "report",
        "error",
        "stderr (cpu / device)",
        "warnings (cpu / device)",
    )
    lines = [
        f"{len(rows)} runs ({len({r['model'] for r in rows})} models × "
        f"{len(TRANSFORMS)} transforms), relative differences "
        "‖device − cpu‖ / ‖cpu‖, TF32 off.",
        "",
        markdown_table(headers, table_rows),
    ]
    if unmeasured:
        lines += ["", f"Not measured (time budget): {', '.join(unmeasured)}."]
    if missing:
        lines += [
            "",
            "Not available here: "
            + ", ".join(f"{n} (needs {', '.join(p)})" for n, p in missing.items())
            + ".",
        ]
    if noise:
        lines += [
            "",
            "Printed while importing packages or building the models, before "
            "any transform (not counted):",
        ]
        lines += [f"- {n}" for n in sorted(set(noise))]
    data = {
        "rows": rows,
        "not_measured": unmeasured,
        "not_available": {n: list(p) for n, p in missing.items()},
        "import_output": noise,
    }
    return SectionResult("zoo", data, "\n".join(lines), targets)


def _verdict_number(
    worst: float | None, measured: int, total: int, complete: bool
) -> tuple[str, bool | None]:
    if worst is None:
        return "not measured", None
    text = f"{_fmt(worst)} ({measured} of {total} runs without error)"
    if not complete:
        return text, None
    return text, measured == total and worst <= TOLERANCE
