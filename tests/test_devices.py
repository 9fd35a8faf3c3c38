"""Device-correctness by construction.

Every tensor the library makes for its own use (a stand-in, probe, mask, scale)
must live on the device of the value it stands for. On a CPU-only machine a
tensor made without a device lands on the CPU, where the model is too, so a
missing ``device=`` goes unnoticed until a user runs on a GPU (a CPU stand-in
times a CUDA weight). Two checks catch that class of bug here:

* statically, every torch factory call in the package names its device (random
  draws go through ``unit_scaling._standins``, which draws on the CPU and moves);
* dynamically, ``unit_scale`` gives the same function and report when its own
  work runs with torch's default device set to one the model is not on
  (``meta``, which every build of torch has): a tensor made on the default
  device then meets the model's CPU tensors and fails, as on CUDA.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.fx import Graph, GraphModule

import unit_scaling
from unit_scaling import _standins, zoo
from unit_scaling.transforms import unit_scale
from unit_scaling.transforms._capture.graph import run_quietly
from unit_scaling.transforms._unit.graph_pass import UnitScalingPass

PACKAGE = Path(unit_scaling.__file__).parent
# Calls that make a tensor (or a generator) from nothing: where it lives is the
# default device unless the call says otherwise.
FACTORIES = {
    "arange",
    "empty",
    "empty_strided",
    "eye",
    "full",
    "Generator",
    "linspace",
    "logspace",
    "normal",
    "ones",
    "rand",
    "randint",
    "randn",
    "randperm",
    "scalar_tensor",
    "tensor",
    "zeros",
}
# The zoo builds the user's side of an example (models and their inputs, on the
# CPU as torch's own constructors do); it is not the library's own work.
EXEMPT = {PACKAGE / "zoo"}


def _factory_calls_without_device(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if not (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "torch"
            and func.attr in FACTORIES
        ):
            continue
        if not any(k.arg == "device" for k in node.keywords):
            where = (
                path.relative_to(PACKAGE.parent)
                if path.is_relative_to(PACKAGE)
                else path
            )
            found.append(f"{where}:{node.lineno} torch.{func.attr}")
    return found


def test_every_factory_call_names_its_device() -> None:
    sources = [
        p
        for p in sorted(PACKAGE.rglob("*.py"))
        if not any(p.is_relative_to(e) for e in EXEMPT)
    ]
    assert len(sources) > 50
    missing = [hit for p in sources for hit in _factory_calls_without_device(p)]
    assert not missing, (
        "torch factory calls without device= (use unit_scaling._standins for "
        "random draws, or pass the device of the value the tensor stands for):\n"
        + "\n".join(missing)
    )


def test_the_static_check_sees_a_missing_device(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "import torch\n"
        "a = torch.randn(3, generator=g)\n"
        "b = torch.zeros(3, device=x.device)\n"
        "c = torch.Generator()\n"
    )
    hits = _factory_calls_without_device(source)
    assert [h.split(" ")[1] for h in hits] == ["torch.randn", "torch.Generator"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_stand_ins_are_the_same_numbers_on_any_device_and_dtype(
    dtype: torch.dtype,
) -> None:
    like = torch.empty(3, 4, dtype=dtype, device="meta")
    moved = _standins.normal_like(like, _standins.seeded(0))
    assert moved.device.type == "meta" and moved.dtype == dtype
    here = _standins.normal((3, 4), _standins.seeded(0), "cpu", dtype)
    reference = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(here, reference.to(dtype))
    with torch.device("meta"):  # torch's default device does not reach the draw
        again = _standins.normal((3, 4), _standins.seeded(0), "cpu", dtype)
    assert again.device.type == "cpu"
    torch.testing.assert_close(again, here)


# Fast zoo models that between them take every path that makes stand-ins: norm
# recognition (Llama's hand-written RMSNorm), calibrated regions, gradient
# calibration, library rewrites (nn.MultiheadAttention), export-free paths.
_ZOO = [
    "mlp",
    "gpt2",
    "llama",
    "bert",
    "vit",
    "resnet",
    "t5",
    "mixtral",
    "dit",
    "transformer-encoder",
    "nn-transformer",
]


@pytest.mark.parametrize("name", _ZOO)
def test_unit_scale_ignores_the_default_device(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Capture is torch's; around it is ours: checking library rewrites on a
    # probe before it, and after it recording values, recognising ops,
    # measuring regions and gradients on stand-ins. Run all of that with
    # torch's default device set to ``meta``: a tensor the library makes without
    # the device of the value it stands for lands there and fails against the
    # model's CPU tensors, as a CPU tensor fails against CUDA ones on a GPU.
    model = zoo.get(name)
    if not model.available():
        pytest.skip(f"{name} needs {model.requires}")
    args, kwargs = model.example(0, 0)
    reference = unit_scale(model.make(0))
    expected = model.output(reference(*args, **kwargs))

    run_pass = UnitScalingPass.__call__

    def on_another_default_device(self: UnitScalingPass, *pass_args: Any) -> Any:
        with torch.device("meta"):
            return run_pass(self, *pass_args)

    monkeypatch.setattr(UnitScalingPass, "__call__", on_another_default_device)
    module = model.make(0)
    with torch.device("meta"):  # the library rewrites (nn.MultiheadAttention)
        scaled = unit_scale(module)
    out = model.output(scaled(*args, **kwargs))
    assert out.device.type == "cpu"
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    ours, theirs = scaled.unit_scale_report(), reference.unit_scale_report()
    assert ours.fallbacks == theirs.fallbacks == []
    assert ours == theirs


def _failing_graph() -> GraphModule:
    graph = Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(torch.matmul, (x, x)))  # (2, 3) @ (2, 3)
    return GraphModule(torch.nn.Module(), graph)


def test_a_caught_error_in_a_measurement_prints_nothing(
    capfd: pytest.CaptureFixture[str],
) -> None:
    # torch.fx prints the generated code around a failing line to stderr when
    # a graph module is called; the library's own measurements must not.
    with pytest.raises(RuntimeError):
        _failing_graph()(torch.ones(2, 3))
    assert "eval_with_key" in capfd.readouterr().err  # (what torch does)
    with pytest.raises(RuntimeError):
        run_quietly(_failing_graph(), torch.ones(2, 3))
    assert capfd.readouterr().err == ""
