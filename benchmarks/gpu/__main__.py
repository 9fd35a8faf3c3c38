"""``python -m benchmarks.gpu``: see the package's docstring."""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from . import __doc__ as DOC
from . import fp8, page, speed, zoo
from ._common import Deadline, SectionResult, Settings, short, write_section

RUNS: dict[str, Callable[[Settings, Deadline], SectionResult]] = {
    "zoo": zoo.run,
    "fp8": fp8.run,
    "speed": speed.run,
}
# Each section's share of the budget; what one leaves unused goes to the next.
SHARES = {"zoo": 0.35, "fp8": 0.1, "speed": 0.55}
DEFAULT_PAGE = page.ROOT / "docs" / "results" / "gpu.md"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu",
        description=(DOC or "").split("\n")[0],
    )
    for name in page.SECTIONS:
        parser.add_argument(
            f"--{name}", action="store_true", help=f"run the {name} section"
        )
    parser.add_argument("--out", type=Path, default=Path("out/gpu"))
    parser.add_argument(
        "--page",
        type=Path,
        default=None,
        help="where to write the results page (default: docs/results/gpu.md on "
        "a GPU, none with --cpu-check; it is always written to OUT/gpu.md too)",
    )
    parser.add_argument("--budget", type=float, default=270.0, help="seconds")
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="zoo worker processes (default: the cores less two, at most 12)",
    )
    parser.add_argument("--models", nargs="+", help="zoo models (default: fast ones)")
    parser.add_argument("--commit", help="the commit measured, where git is absent")
    parser.add_argument(
        "--cpu-check",
        action="store_true",
        help="run everything on tiny shapes, the CPU standing in for the GPU",
    )
    args = parser.parse_args(argv)
    if args.budget <= 0:
        parser.error(f"--budget must be positive, got {args.budget}")
    if args.jobs is not None and args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    return args


def _failed(name: str, error: BaseException) -> SectionResult:
    text = "".join(traceback.format_exception(error))
    markdown = f"Failed: `{short(f'{type(error).__name__}: {error}', 300)}`"
    return SectionResult(name, {"error": text}, markdown, [])


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if not args.cpu_check and not torch.cuda.is_available():
        print(
            "benchmarks.gpu needs a CUDA GPU: torch.cuda.is_available() is False "
            f"(torch {torch.__version__}). Nothing was measured. "
            "(--cpu-check runs its logic on the CPU, on tiny shapes.)"
        )
        return 0
    begin = time.monotonic()
    # Zoo workers: tracing is single-threaded Python; keep two cores spare.
    cores = os.cpu_count() or 1
    jobs = args.jobs or (1 if args.cpu_check else max(1, min(12, cores - 2)))
    settings = Settings(
        device=torch.device("cpu" if args.cpu_check else "cuda"),
        out=args.out,
        cpu_check=args.cpu_check,
        jobs=jobs,
        models=tuple(args.models) if args.models else None,
    )
    env = page.environment(settings, args.commit)
    chosen = [n for n in page.SECTIONS if getattr(args, n)] or list(page.SECTIONS)
    print(f"benchmarks.gpu: {page._describe(env)}", flush=True)
    for i, name in enumerate(chosen):
        left = args.budget - (time.monotonic() - begin)
        share = SHARES[name] / sum(SHARES[n] for n in chosen[i:])
        deadline = Deadline(max(left, 0.0) * share)
        print(f"== {name}: budget {deadline.left():.0f} s", flush=True)
        start = time.monotonic()
        try:
            result = RUNS[name](settings, deadline)
        except Exception as error:  # the other sections still run
            result = _failed(name, error)
            print(f"   {name} failed: {short(str(error))}", flush=True)
        result.seconds = time.monotonic() - start
        write_section(settings, result, env)
        print(f"   {name}: {result.seconds:.0f} s", flush=True)
    text = page.compose(settings.out, env)
    (settings.out / "gpu.md").write_text(text)
    destination = args.page or (None if args.cpu_check else DEFAULT_PAGE)
    if destination is not None:
        destination.write_text(text)
        print(f"wrote {destination}")
    print("\nTargets:")
    for target in page.targets_of(page.load(settings.out)):
        print(f"  {target.verdict:>12}  {target.name} {target.goal}: {target.measured}")
    print(f"\n{time.monotonic() - begin:.0f} s in all; results in {settings.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
