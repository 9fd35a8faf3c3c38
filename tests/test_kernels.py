"""Tests for ``unit_scaling._kernels``: compiled kernels and native C++ kernels."""

from __future__ import annotations

import importlib
import io
import logging
import os
import shutil
import subprocess
import sys
import threading
import types
import warnings
from pathlib import Path

import pytest
import torch

from unit_scaling import _kernels as kernels
from unit_scaling._kernels import NativeKernel

_SCALE = r"""
#include <torch/csrc/inductor/cpp_prefix.h>
extern "C" void kernel(const float* x, float* out, int64_t n, int64_t factor) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * factor;
}
"""
_HAS_COMPILER = any(shutil.which(cc) for cc in ("g++", "c++", "clang++"))


@pytest.mark.skipif(not _HAS_COMPILER, reason="no C++ compiler")
def test_native_kernel_compiles_and_runs() -> None:
    """Fails loudly if a torch upgrade changes the Inductor C++ code cache API
    that NativeKernel relies on (track_scales would fall back, slower)."""
    kernel = NativeKernel(
        "test", _SCALE, ["const float*", "float*", "int64_t", "int64_t"]
    )
    run = kernel.get()
    assert run is not None, kernel.error
    x, out = torch.arange(5.0), torch.empty(5)
    run(x, out, 5, 3)
    assert torch.equal(out, 3 * x)
    assert kernel.get() is run  # compiled once


def test_native_kernel_failure_warns_once_and_gives_none() -> None:
    kernel = NativeKernel("test", "this is not C++", ["int64_t"])
    with pytest.warns(RuntimeWarning, match="could not compile its C\\+\\+ kernel"):
        assert kernel.get() is None
    assert kernel.error is not None
    assert kernel.get() is None  # no second attempt, no second warning


class _StderrHandler(logging.Handler):
    """A user's handler: writes each record to ``sys.stderr`` as it is then
    (torch's own handler holds the stderr of when torch was imported, which
    capfd does not see)."""

    def emit(self, record: logging.LogRecord) -> None:
        print(self.format(record), file=sys.stderr)


@pytest.fixture
def stderr_handler_on_torchs_logger(monkeypatch: pytest.MonkeyPatch) -> None:
    logger = logging.getLogger("torch")
    monkeypatch.setattr(logger, "handlers", [*logger.handlers, _StderrHandler()])


@pytest.mark.skipif(not _HAS_COMPILER, reason="no C++ compiler")
@pytest.mark.usefixtures("stderr_handler_on_torchs_logger")
def test_what_torch_logs_while_building_stays_off_stderr(
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """A CUDA build of torch on a machine without a GPU logs "No CUDA runtime is
    found" when the build first imports torch.utils.cpp_extension: made to
    happen here on any torch, with a fresh import of that module."""
    name = "torch.utils.cpp_extension"
    genuine = importlib.import_module(name)  # put back after the test
    monkeypatch.setattr(torch.utils, "cpp_extension", genuine)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "_is_compiled", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))

    monkeypatch.delitem(sys.modules, name)
    importlib.import_module(name)  # outside a build: on stderr
    assert "No CUDA runtime is found" in capfd.readouterr().err

    monkeypatch.delitem(sys.modules, name)
    kernel = NativeKernel(
        "test", _SCALE, ["const float*", "float*", "int64_t", "int64_t"]
    )
    assert kernel.get() is not None, kernel.error
    assert name in sys.modules, "the build no longer imports it: test another way"
    assert capfd.readouterr() == ("", "")


def _chatty_build(fails: bool) -> object:
    """A stand-in for Inductor's C++ code cache whose build logs on torch's
    logger, prints, writes to file descriptor 2 and runs a subprocess that
    writes to stderr, while another thread logs; then fails, or gives a
    function."""

    def load_pybinding(argtypes: list[str], source: str) -> object:
        logging.getLogger("torch.utils.cpp_extension").warning("a log record")
        print("printed to stdout")
        print("printed to stderr", file=sys.stderr)
        os.write(2, b"written to descriptor 2\n")
        code = "import sys; sys.stderr.write('written by a subprocess')"
        subprocess.run([sys.executable, "-c", code], check=True)
        other = logging.getLogger("torch.elsewhere")
        thread = threading.Thread(target=other.warning, args=["another thread's"])
        thread.start()
        thread.join()
        if fails:
            raise RuntimeError("the compiler failed")
        return print

    return types.SimpleNamespace(load_pybinding=load_pybinding)


@pytest.mark.usefixtures("stderr_handler_on_torchs_logger")
@pytest.mark.parametrize("fails", [False, True], ids=["builds", "fails"])
def test_build_output_is_shown_only_in_the_failure_warning(
    fails: bool, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kernels, "cpp_python_bindings", lambda: _chatty_build(fails))
    # A handler on a stream with no file descriptor (a notebook's output).
    notebook = io.StringIO()
    logger = logging.getLogger("torch")
    handlers = [*logger.handlers, logging.StreamHandler(notebook)]
    monkeypatch.setattr(logger, "handlers", handlers)
    kernel = NativeKernel("test", "", [])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert (kernel.get() is None) is fails
    assert capfd.readouterr() == ("", "")
    assert notebook.getvalue() == "another thread's\n"  # not the build's
    assert len(caught) == fails
    if fails:
        message = str(caught[0].message)
        assert "The error was: RuntimeError: the compiler failed" in message
        for said in (
            "WARNING torch.utils.cpp_extension: a log record",
            "printed to stdout",
            "printed to stderr",
            "written to descriptor 2",
            "written by a subprocess",
        ):
            assert said in message, message
