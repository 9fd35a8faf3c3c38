"""Small kernels compiled into one fused pass over memory, with an eager fallback.

Quantisation (``formats``) and scale statistics (``transforms.track_scales``) are
each a handful of elementwise ops and reductions over a whole tensor. Eagerly
that is one pass over memory per op; ``torch.compile`` fuses them into one. A
kernel is compiled once per input dtype (inputs are flattened and shapes kept
dynamic), only for tensors large enough to benefit, never while an outer
``torch.compile`` is tracing (which fuses the eager kernel itself), and if
compilation ever fails the owner warns once and runs eagerly from then on.

:class:`NativeKernel` is for the CPU kernels that ``torch.compile`` serves
poorly: scale statistics and round-to-nearest quantisation, run on hundreds of
tensors per training step, where a compiled call's fixed cost (~40-100 us) and
Inductor's code (eleven reductions; a float8 cast round trip that it does not
vectorise) dominate. It compiles a hand-written C++ function with Inductor's own
C++ toolchain. What torch logs or prints while building one (e.g. a CUDA
build of torch on a machine without a GPU says so) is held back, and shown
only in the warning if the build fails.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import IO, cast

import torch
from torch import Tensor

from ._torch_internals import cpp_python_bindings, is_functorch_wrapped_tensor

__all__ = ["CompiledKernels", "NativeKernel", "in_memory", "native_threads"]


def in_memory(t: Tensor) -> bool:
    """Whether ``t``'s elements are plain strided memory at ``t.data_ptr()`` (not
    a fake, meta, functorch-wrapped or dispatch-overriding tensor), outside any
    ``torch.compile`` trace: what a :class:`NativeKernel` may read."""
    # Asked first: under a trace, the other checks would break Dynamo's graph.
    return (
        not torch.compiler.is_compiling()
        and t.layout == torch.strided
        and not t.is_meta
        and type(t).__torch_dispatch__ is Tensor.__torch_dispatch__
        and not is_functorch_wrapped_tensor(t)
    )


def native_threads(numel: int, numel_per_thread: int) -> int:
    """Threads for a native kernel over ``numel`` elements: one per
    ``numel_per_thread``, at least one, at most torch's intra-op threads."""
    return max(1, min(torch.get_num_threads(), numel // numel_per_thread))


class CompiledKernels:
    """Compilation policy and cache for one owner's kernels.

    Args:
        owner: named in the warning if compilation fails.
        min_numel: smaller tensors run eagerly (compiling buys nothing there).
    """

    def __init__(self, owner: str, min_numel: int = 1 << 16) -> None:
        self.owner = owner
        self.min_numel = min_numel
        self.error: str | None = None
        self._cache: dict[Callable[..., Tensor], Callable[..., Tensor]] = {}

    def should_compile(self, flat: Tensor) -> bool:
        """Whether ``flat`` should take the compiled kernel."""
        # Fake tensors, tensor subclasses and traces other than Dynamo's take the
        # eager kernel, which they can trace; Dynamo traces it into its graph.
        return (
            self.error is None
            and flat.numel() >= self.min_numel
            and type(flat) is Tensor
            and flat.device.type in ("cpu", "cuda")
            and not torch.compiler.is_compiling()
        )

    def compiled(self, kernel: Callable[..., Tensor]) -> Callable[..., Tensor]:
        """``kernel`` compiled with dynamic shapes (cached)."""
        if kernel not in self._cache:
            self._cache[kernel] = cast(
                Callable[..., Tensor], torch.compile(kernel, dynamic=True)
            )
        return self._cache[kernel]

    def stop_compiling(self, error: Exception) -> None:
        """Record a compilation failure: warn once, run eagerly from now on."""
        self.error = f"{type(error).__name__}: {error}"
        warnings.warn(
            f"{self.owner}: torch.compile failed, so its kernels run eagerly "
            f"(correct, but several passes over memory). The error was: {self.error}",
            RuntimeWarning,
            stacklevel=4,
        )

    def run(
        self,
        compiled_kernel: Callable[..., Tensor],
        eager_kernel: Callable[..., Tensor],
        flat: Tensor,
        *args: object,
    ) -> Tensor:
        """``compiled_kernel(flat, *args)`` compiled if worthwhile, else
        ``eager_kernel(flat, *args)``. Runs under ``no_grad`` so that grad mode
        never splits the compiled kernel's cache."""
        if self.should_compile(flat):
            try:
                with torch.no_grad():
                    return self.compiled(compiled_kernel)(flat, *args)
            except Exception as error:  # e.g. no C++ compiler
                self.stop_compiling(error)
        return eager_kernel(flat, *args)


class NativeKernel:
    """A C++ function ``kernel(...)``, compiled on first use, callable from Python
    with tensors (passed as data pointers) and ints.

    Compilation goes through Inductor's C++ code cache (private API: the one use
    of it in this package, checked by ``tests/test_kernels.py``), so the
    compiler, flags, vector ISA (``at::vec``), OpenMP and on-disk cache are the
    ones ``torch.compile`` uses on this machine. If that fails (e.g. no C++
    compiler), the owner warns once and :meth:`get` returns ``None`` from then on:
    callers keep a fallback. What the build logs or prints stays off the
    user's stdout and stderr, and is shown in that warning.

    The arguments are not checked: pass contiguous CPU tensors of the declared
    element types, and pointers only to memory the kernel may touch.

    Args:
        owner: named in the warning if compilation fails.
        source: C++ source defining ``extern "C" void kernel(...)``; may use
            ``at::vec`` (``torch/csrc/inductor/cpp_prefix.h``).
        argtypes: the C types of ``kernel``'s arguments, e.g.
            ``["const float*", "double*", "int64_t"]``.
    """

    def __init__(self, owner: str, source: str, argtypes: list[str]) -> None:
        self.owner = owner
        self.source = source
        self.argtypes = argtypes
        self.error: str | None = None
        self._kernel: Callable[..., None] | None = None

    def get(self) -> Callable[..., None] | None:
        """The compiled function (compiling it if needed), or ``None``."""
        if self._kernel is None and self.error is None:
            output: list[str] = []
            try:
                with _captured_output(output):
                    self._kernel = cpp_python_bindings().load_pybinding(
                        self.argtypes, self.source
                    )
            except Exception as error:  # e.g. no C++ compiler, or a torch change
                self.error = f"{type(error).__name__}: {error}"
                held = "".join(f"\n{part}" for part in output)
                if held:
                    held = "\nWhat torch logged or printed while building it:" + held
                warnings.warn(
                    f"{self.owner}: could not compile its C++ kernel, so it uses a "
                    f"slower fallback. The error was: {self.error}{held}",
                    RuntimeWarning,
                    stacklevel=3,
                )
        return self._kernel


class _ThreadRecords(logging.Filter):
    """A log handlers' filter that holds back, and keeps as lines, the records
    logged by the thread that made it (every record, if records carry no
    thread); other threads' records pass."""

    def __init__(self) -> None:
        super().__init__()
        self.thread = threading.get_ident()
        self.lines: list[str] = []
        self._seen: set[int] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.thread not in (self.thread, None):
            return True
        if id(record) not in self._seen:  # one record meets several handlers
            self._seen.add(id(record))
            self.lines.append(
                f"{record.levelname} {record.name}: {record.getMessage()}"
            )
        return False


def _log_handlers() -> set[logging.Handler]:
    """Every handler a log record can reach: each logger's, and the handler of
    last resort (what prints a warning when no logger has a handler)."""
    loggers = [logging.root, *list(logging.root.manager.loggerDict.values())]
    handlers = {
        handler
        for logger in loggers
        if isinstance(logger, logging.Logger)
        for handler in logger.handlers
    }
    if logging.lastResort is not None:
        handlers.add(logging.lastResort)
    return handlers


@contextlib.contextmanager
def _descriptors_redirected(sink: IO[bytes]) -> Iterator[None]:
    """File descriptors 1 and 2 (stdout and stderr at the level where C++ code
    and subprocesses write) point to ``sink`` inside the block."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    saved: dict[int, int] = {}
    try:
        for fd in (1, 2):
            with contextlib.suppress(OSError):  # not open: nothing to redirect
                saved[fd] = os.dup(fd)
                os.dup2(sink.fileno(), fd)
        yield
    finally:
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)


@contextlib.contextmanager
def _captured_output(output: list[str]) -> Iterator[None]:
    """Hold back what the block logs (from this thread) or writes to stdout and
    stderr (``sys.stdout``/``sys.stderr`` and file descriptors 1 and 2: from any
    thread, C++ code and subprocesses too), and append it to ``output`` when
    the block ends, as up to three non-empty strings."""
    records = _ThreadRecords()
    handlers = _log_handlers()
    streams = io.StringIO()
    with tempfile.TemporaryFile() as sink:
        for handler in handlers:
            handler.addFilter(records)
        try:
            with (
                _descriptors_redirected(sink),
                contextlib.redirect_stdout(streams),
                contextlib.redirect_stderr(streams),
            ):
                yield
        finally:
            for handler in handlers:
                handler.removeFilter(records)
            sink.seek(0)
            written = sink.read().decode(errors="replace")
            parts = ("\n".join(records.lines), streams.getvalue(), written)
            output.extend(part.strip() for part in parts if part.strip())
