"""The results page: every section's numbers from ``--out``, the targets with
their verdicts, and where the numbers came from."""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import subprocess
from pathlib import Path
from typing import Any

import torch

from ._common import Settings, Target, markdown_table

SECTIONS = ("zoo", "fp8", "speed")
TITLES = {
    "zoo": "(a) zoo on the GPU against the CPU",
    "fp8": "(b) real FP8 accuracy and training",
    "speed": "(c) speed",
}
ROOT = Path(__file__).resolve().parents[2]


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _commit(given: str | None) -> str:
    if given:
        return given
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def environment(settings: Settings, commit: str | None) -> dict[str, Any]:
    """Date, device, versions and commit of this run."""
    if settings.device.type == "cuda":
        device = torch.cuda.get_device_name(settings.device)
        capability = ".".join(map(str, torch.cuda.get_device_capability()))
        device = f"{device} (compute capability {capability})"
    else:
        device = "CPU standing in for the GPU (--cpu-check, tiny shapes)"
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "device": device,
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "none",
        "torchao": _version("torchao"),
        "transformers": _version("transformers"),
        "diffusers": _version("diffusers"),
        "commit": _commit(commit),
        "cpu_check": settings.cpu_check,
    }


def _describe(env: dict[str, Any]) -> str:
    return (
        f"{env['date']} on {env['device']}, torch {env['torch']} (CUDA "
        f"{env['cuda']}), torchao {env['torchao']}, transformers "
        f"{env['transformers']}, diffusers {env['diffusers']}, at commit "
        f"{env['commit']}"
    )


def load(out: Path) -> dict[str, dict[str, Any]]:
    """Each section's JSON found in ``out``, by section."""
    found = {}
    for name in SECTIONS:
        path = out / f"{name}.json"
        if path.exists():
            found[name] = json.loads(path.read_text())
    return found


def targets_of(sections: dict[str, dict[str, Any]]) -> list[Target]:
    """Every section's targets, in section order."""
    return [Target(**t) for s in sections.values() for t in s["targets"]]


def compose(out: Path, env: dict[str, Any]) -> str:
    """The page, from the sections written to ``out``."""
    sections = load(out)
    lines = [
        "# On a GPU: CPU/CUDA agreement, real FP8 and speed",
        "",
        f"Written by `python -m benchmarks.gpu` (issue 26). Measured {_describe(env)}.",
        "",
        "## Targets",
        "",
    ]
    rows = [(t.name, t.goal, t.measured, t.verdict) for t in targets_of(sections)]
    rows += [
        (f"section {TITLES[name]}", "", "not run", "not measured")
        for name in SECTIONS
        if name not in sections
    ]
    lines += [markdown_table(("target", "goal", "measured", "verdict"), rows), ""]
    for name, section in sections.items():
        lines += [f"## {TITLES[name]}", ""]
        if section.get("environment") not in (None, env):
            lines += [f"Measured {_describe(section['environment'])}.", ""]
        lines += [f"{section['seconds']:.0f} s.", "", section["markdown"], ""]
    lines += [
        "## Regenerate",
        "",
        "On a machine with a CUDA GPU (FP8 needs compute capability 8.9 or newer), "
        "from the repository root, with torch, transformers and optionally "
        "diffusers and torchao installed:",
        "",
        "```",
        "PYTHONPATH=src python -m benchmarks.gpu --out out/gpu",
        "```",
        "",
        "It writes each section's JSON and markdown to `--out` as the section "
        "ends, this page to `docs/results/gpu.md` and to `--out`/gpu.md, and "
        "prints every target with its verdict (about 5 minutes; `--zoo`, "
        "`--fp8` or `--speed` run one section, into the same `--out`).",
    ]
    return "\n".join(lines) + "\n"
