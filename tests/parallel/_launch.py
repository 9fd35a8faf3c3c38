"""Run a function on a few processes joined by a gloo process group on loopback.

The test process hosts the rendezvous store on an OS-chosen port (no race for a
free port), spawns the workers, and gets back what each rank returned. A worker
that raises, hangs or dies fails the test with its rank and traceback.
:func:`once_per_session` keeps pytest-xdist from repeating a launch.
"""

from __future__ import annotations

import os
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from filelock import FileLock  # a dependency of torch

T = TypeVar("T")
HOST = "127.0.0.1"
EXIT_GRACE = 20.0  # seconds a worker may take to exit once every rank has a result


def _save(outcome: dict[str, Any], path: Path) -> None:
    """Write ``outcome`` so that ``path`` appears only once complete."""
    partial = path.with_suffix(".partial")
    torch.save(outcome, partial)
    partial.replace(path)


def _worker(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    port: int,
    out: str,
    args: tuple[Any, ...],
) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only
    torch.set_num_threads(1)  # two workers share a two-core machine
    path = Path(out, f"rank{rank}.pt")
    try:
        store = dist.TCPStore(HOST, port, is_master=False, timeout=timedelta(60))
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=world_size, timeout=timedelta(60)
        )
        try:
            _save({"result": fn(rank, world_size, *args)}, path)
            # torch 2.13 + gloo: destroying the group while a gloo thread still
            # frees the last collective's tensors deadlocks (the destructor joins
            # that thread holding the GIL the thread needs). Let it finish.
            dist.barrier()
            time.sleep(0.1)
        finally:
            dist.destroy_process_group()
    except BaseException:
        _save({"error": traceback.format_exc()}, path)
        raise


def run_distributed(
    fn: Callable[..., Any],
    *args: Any,
    world_size: int = 2,
    timeout: float = 240.0,
) -> list[Any]:
    """``[fn(rank, world_size, *args) for each rank]``, each in its own process.

    ``fn`` must be a module-level function (it is pickled by name) and return
    something ``torch.save`` handles (tensors, numbers, strings, containers).
    """
    context = mp.get_context("spawn")
    store = dist.TCPStore(HOST, 0, is_master=True, wait_for_workers=False)
    with tempfile.TemporaryDirectory() as out:
        paths = [Path(out, f"rank{rank}.pt") for rank in range(world_size)]
        processes = [
            context.Process(
                target=_worker,
                args=(fn, rank, world_size, store.port, out, args),
                daemon=True,
            )
            for rank in range(world_size)
        ]
        for process in processes:
            process.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(p.is_alive() for p in processes):
            if all(path.exists() for path in paths):
                deadline = min(deadline, time.monotonic() + EXIT_GRACE)
            time.sleep(0.05)
        hung = [rank for rank, p in enumerate(processes) if p.is_alive()]
        for rank in hung:
            processes[rank].kill()
            processes[rank].join()
        outcomes = [
            torch.load(path, weights_only=False) if path.exists() else {}
            for path in paths
        ]
    errors = [
        f"rank {rank}:\n{outcome['error']}"
        for rank, outcome in enumerate(outcomes)
        if "error" in outcome
    ]
    if errors:
        raise AssertionError("a worker failed\n" + "\n".join(errors))
    missing = [rank for rank, outcome in enumerate(outcomes) if "result" not in outcome]
    if missing and hung:
        raise AssertionError(f"ranks {hung} did not finish within {timeout:.0f} s")
    if missing:
        codes = [processes[rank].exitcode for rank in missing]
        raise AssertionError(f"ranks {missing} died without a result (exit {codes})")
    if hung:
        warnings.warn(
            f"ranks {hung} had returned their results but did not exit; killed them",
            stacklevel=2,
        )
    return [outcome["result"] for outcome in outcomes]


def once_per_session(
    request: pytest.FixtureRequest, name: str, compute: Callable[[], T]
) -> T:
    """``compute()``, run once per test session even under pytest-xdist.

    xdist may spread one module's tests over several workers, and each would
    run the module's fixture again: the first computes and caches the result in
    the session's shared temporary directory, the others wait and read it.
    """
    if not hasattr(request.config, "workerinput"):  # not an xdist worker
        return compute()
    factory: pytest.TempPathFactory = request.getfixturevalue("tmp_path_factory")
    shared = factory.getbasetemp().parent
    with FileLock(str(shared / f"{name}.lock")):
        cache = shared / f"{name}.pt"
        if cache.exists():
            cached: T = torch.load(cache, weights_only=False)
            return cached
        result = compute()
        torch.save(result, cache)
        return result
