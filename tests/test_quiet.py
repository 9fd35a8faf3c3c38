"""Nothing on stderr from the library's entry points on the zoo's models.

A transform that catches an error falls back and reports it (see
``transforms._capture.fallbacks``); it never lets torch print a traceback. On the CPU
the paths that failed on CUDA run cleanly, so this also guards against noise of
any other kind: a stray print, a torch.fx traceback, a C++ warning. (Python
warnings and log records are captured by pytest, not written to stderr.)
``tests/transforms/test_zoo.py`` checks ``track_scales``, ``unit_scale`` and
``simulate_fp8`` on every fast zoo model the same way.
"""

from __future__ import annotations

import pytest
import torch

import unit_scaling as uu
from unit_scaling import zoo
from unit_scaling.export import to_plain
from unit_scaling.float8 import convert_to_float8_training
from unit_scaling.transforms import unit_scale
from unit_scaling.utils import analyse_module


def _model(name: str) -> zoo.ZooModel:
    model = zoo.get(name)
    if not model.available():
        pytest.skip(f"{name} needs {model.requires}")
    return model


def _backward(out: torch.Tensor) -> None:
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(0))
    out.backward(grad.to(out))


@pytest.mark.parametrize("name", ["gpt2", "llama", "vit", "t5", "nn-transformer"])
def test_real_fp8_conversion_is_quiet(
    name: str, capfd: pytest.CaptureFixture[str]
) -> None:
    model = _model(name)
    capfd.readouterr()
    converted = convert_to_float8_training(unit_scale(model.make(0)))
    _backward(model.run(converted, 0, 0))
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize("name", ["nanogpt", "gpt2"])
def test_to_plain_is_quiet(name: str, capfd: pytest.CaptureFixture[str]) -> None:
    model = _model(name)
    capfd.readouterr()
    scaled = unit_scale(model.make(0))
    args, kwargs = model.example(0, 0)
    scaled(*args, **kwargs)
    export = to_plain(scaled, args, kwargs)
    assert export.max_rel_error < 1e-4
    assert capfd.readouterr().err == ""


def test_analyse_module_is_quiet(capfd: pytest.CaptureFixture[str]) -> None:
    capfd.readouterr()
    x = torch.randn(8, 32, 64, requires_grad=True)
    code = analyse_module(uu.MHSA(64, heads=4, is_causal=True), x)
    assert "(->" in code
    mlp = _model("mlp")
    args, _ = mlp.example(0, 0)
    assert "(->" in analyse_module(mlp.make(0), args[0])
    assert capfd.readouterr().err == ""
