"""The transforms on a stand-in device (``tests/standin_device.py``) give what
they give on the CPU: the same outputs and gradients, the same reports, no
fallback and nothing on stderr. A tensor the library makes on the CPU for a
model that is not there fails, as it fails against CUDA tensors on a GPU; the
mutation tests below put such bugs back into the library (each a one-line edit
of its source, applied in the subprocess) and see the check fail.

Every check runs in a fresh process (``standin_device.in_subprocess``):
installing the device is process-wide. The zoo rows are those of
``benchmarks.gpu``'s section (a) with the stand-in device as the other side.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import math
import types
from typing import Any

import pytest
import torch
from torch import nn

from tests import standin_device
from tests.helpers import STANDIN_PATHS

pytestmark = pytest.mark.skipif(
    not standin_device.available(),
    reason="this torch cannot register a device from Python",
)

# In the default run: the device itself, a model without and one with a
# library rewrite, and one mutation; the rest (a minute or more each on two
# cores) under `integration`, which CI runs too.
DEFAULT_RUN = {
    "test_the_device_mismatch_of_cuda_is_raised",
    "test_zoo_transforms_agree_on_the_standin_device[mlp]",
    "test_zoo_transforms_agree_on_the_standin_device[transformer-encoder]",
    "test_a_stand_in_drawn_on_the_cpu_is_caught[_standins: normal_like on the CPU]",
}

ZOO = STANDIN_PATHS
TOLERANCE = 1e-4


# --- in the subprocess --------------------------------------------------- #


def mutate(module_name: str, old: str, new: str) -> None:
    """Edit ``module_name``'s source (``old`` → ``new``, exactly once) and give
    its functions and methods the edited code, in this process: every
    reference to them, imported elsewhere by name too, runs the edit."""
    module = importlib.import_module(module_name)
    source = inspect.getsource(module)
    if source.count(old) != 1:
        raise AssertionError(f"{old!r} is not once in {module_name}")
    namespace = dict(vars(module))
    path = inspect.getsourcefile(module) or module_name
    exec(compile(source.replace(old, new), path, "exec"), namespace)
    for name, value in vars(module).items():
        edited = namespace.get(name)
        for original, replacement in _functions(value, edited):
            original.__code__ = replacement.__code__


def _functions(value: Any, edited: Any) -> list[tuple[Any, Any]]:
    if isinstance(value, types.FunctionType) and isinstance(edited, types.FunctionType):
        value, edited = inspect.unwrap(value), inspect.unwrap(edited)
        if isinstance(value, types.FunctionType) and value.__code__ != edited.__code__:
            return [(value, edited)]
        return []
    if isinstance(value, type) and isinstance(edited, type):
        return [
            pair
            for key, member in vars(value).items()
            for pair in _functions(
                getattr(member, "__func__", member),
                getattr(vars(edited).get(key), "__func__", vars(edited).get(key)),
            )
        ]
    return []


# Bugs of the class that printed 334 tracebacks on CUDA: a stand-in drawn on
# the CPU for a value elsewhere. (module, the line as it is, the line broken)
MUTATIONS: dict[str, tuple[str, str, str]] = {
    "recognise: the input's draw": (
        "unit_scaling.transforms._unit.recognise",
        "normal(x_info.shape, generator, x_info.device)",
        'normal(x_info.shape, generator, "cpu")',
    ),
    "recognise: the parameters' draw": (
        "unit_scaling.transforms._unit.recognise",
        "normal((size,), generator, value.device)",
        'normal((size,), generator, "cpu")',
    ),
    "regions: a stand-in input": (
        "unit_scaling.transforms._unit.regions",
        "normal(info.shape, generator, info.device, info.dtype)",
        'normal(info.shape, generator, "cpu", info.dtype)',
    ),
    "library: the attention probe": (
        "unit_scaling.transforms._capture.library",
        "normal(shape, seeded(0), weight.device, weight.dtype)",
        'normal(shape, seeded(0), "cpu", weight.dtype)',
    ),
    "_standins: normal_like on the CPU": (
        "unit_scaling._standins",
        "return normal(value.shape, generator, value.device, value.dtype)",
        'return normal(value.shape, generator, "cpu", value.dtype)',
    ),
}
# The model whose transforms take each mutated line.
MUTATED_MODEL = {
    "recognise: the input's draw": "llama",
    "recognise: the parameters' draw": "llama",
    "regions: a stand-in input": "llama",
    "library: the attention probe": "nn-transformer",
    "_standins: normal_like on the CPU": "mlp",
}


# Models whose own code branches on the device (the graph, hence the report's
# op records and tracked tensors, differ as they would on a GPU): only their
# outputs and gradients are compared.
OWN_DEVICE_BRANCH = {
    # Hugging Face's MoE counts the tokens per expert with `histc` on a float
    # copy on the CPU, on the integers elsewhere: one op more in the routing
    "mixtral",
}


def problems(row: dict[str, Any]) -> list[str]:
    """What is wrong with a zoo row of ``benchmarks.gpu`` (empty: agrees)."""
    found = []
    if row.get("error"):
        found.append(f"error on {row['error_side']}: {row['error']}")
        return found
    same_graph = row["model"] not in OWN_DEVICE_BRANCH
    for key in ("output", "grads", "report_numbers")[: 3 if same_graph else 2]:
        if not row[key] <= TOLERANCE:
            found.append(f"{key} differs by {row[key]:.2g}")
    if same_graph and not row["report_entries_equal"]:
        found.append("report entries differ")
    if row["stderr_device"] or row["stderr_cpu"]:
        found.append(f"stderr: {(row['stderr_device'] or row['stderr_cpu'])[:300]}")
    if row["messages_device"] != row["messages_cpu"]:
        found.append(f"messages: {row['first_messages']}")
    return found


def zoo_problems(
    name: str, transforms: tuple[str, ...], mutation: str | None = None
) -> dict[str, list[str]]:
    """Per transform, what differs between the CPU and the stand-in device
    for the zoo model ``name`` (after ``mutation``, if given)."""
    from benchmarks.gpu import zoo

    standin_device.install()
    if mutation is not None:
        mutate(*MUTATIONS[mutation])
    side = standin_device.StandInSide()
    with standin_device.math_attention():
        return {t: problems(zoo.compare(name, t, side)) for t in transforms}


def other_transforms() -> dict[str, list[str]]:
    """``convert_to_float8_training``, ``to_plain``, ``analyse_module`` and the
    report command's path, on the CPU and on the stand-in device."""
    with standin_device.math_attention():
        return _other_transforms(standin_device.install())


def _other_transforms(target: torch.device) -> dict[str, list[str]]:
    import pandas

    import unit_scaling as uu
    from unit_scaling.analysis import graph_to_dataframe
    from unit_scaling.export import to_plain
    from unit_scaling.float8 import convert_to_float8_training
    from unit_scaling.transforms import (
        prune_same_scale_tensors,
        track_scales,
        unit_scale,
    )
    from unit_scaling.utils import analyse_module

    found: dict[str, list[str]] = {}

    def fresh(model: nn.Module, on: torch.device | None) -> nn.Module:
        model = copy.deepcopy(model)
        return standin_device.move(model) if on is not None else model

    torch.manual_seed(0)
    decoder = uu.TransformerDecoder(64, 128, layers=2, heads=4)
    tokens = torch.randint(128, (2, 17))

    def fp8(on: torch.device | None) -> Any:
        model = convert_to_float8_training(fresh(decoder, on))
        batch = standin_device.move(tokens) if on is not None else tokens
        loss = model.loss(batch)
        loss.backward()
        return loss, {n: p.grad for n, p in model.named_parameters()}

    found["convert_to_float8_training"] = _compare(fp8(None), fp8(target))

    from unit_scaling import zoo

    entry = zoo.get("llama")
    base = entry.make(0)
    args, kwargs = entry.example(0, 0)

    def plain(on: torch.device | None) -> Any:
        model = unit_scale(fresh(base, on))
        a, k = standin_device.move((args, kwargs)) if on is not None else (args, kwargs)
        model(*a, **k)
        export = to_plain(model, a, k)
        return entry.output(export.module.eval()(*a, **k)), export.max_rel_error

    (out_cpu, error_cpu), (out_dev, error_dev) = plain(None), plain(target)
    found["to_plain"] = _compare(out_cpu, out_dev)
    if not error_dev <= 1e-4:
        found["to_plain"].append(f"max_rel_error {error_dev:.2g} ({error_cpu:.2g})")

    x = torch.randn(4, 16)
    mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))
    text_cpu = analyse_module(mlp, (x,))
    text_dev = analyse_module(fresh(mlp, target), (standin_device.move(x),))
    found["analyse_module"] = [] if text_cpu == text_dev else ["annotated code differs"]

    # the report command's path: each version tracked, its table of scales
    def tables(on: torch.device | None) -> list[Any]:
        model = fresh(base, on)
        a, k = standin_device.move((args, kwargs)) if on is not None else (args, kwargs)
        frames = []
        for candidate in (model, unit_scale(model)):
            tracked = track_scales(candidate)
            out = entry.output(tracked(*a, **k))
            out.backward(torch.ones_like(out))
            graph = prune_same_scale_tensors(tracked.scales_graph())
            frames.append(graph_to_dataframe(graph))
        return frames

    found["report"] = []
    for cpu, dev in zip(tables(None), tables(target), strict=True):
        # The smallest |x| of a tensor is a cancellation's rounding, whatever its
        # relative size: held to its row's largest |x| instead.
        cpu_min, dev_min = cpu.pop("abs_min"), dev.pop("abs_min")
        if not ((cpu_min - dev_min).abs() <= TOLERANCE * cpu.abs_max).all():
            found["report"].append("abs_min differs beyond 1e-4 of abs_max")
        try:
            pandas.testing.assert_frame_equal(cpu, dev, rtol=TOLERANCE, atol=1e-6)
        except AssertionError as error:
            found["report"].append(str(error)[-600:])
    return found


def _compare(cpu: Any, dev: Any) -> list[str]:
    from unit_scaling._torch_internals import pytree

    left, right = pytree.tree_leaves(cpu), pytree.tree_leaves(standin_device.back(dev))
    found = []
    for i, (a, b) in enumerate(zip(left, right, strict=True)):
        if isinstance(a, torch.Tensor):
            if type(b) is not torch.Tensor:
                found.append(f"value {i} came back as {type(b).__name__}")
                continue
            a, b = a.detach().float(), b.detach().float()
            scale = float(a.norm()) or 1.0
            difference = float((a - b).norm()) / scale
            if not difference <= TOLERANCE:
                found.append(f"value {i} differs by {difference:.2g}")
        elif isinstance(a, float) and not math.isclose(a, b, rel_tol=TOLERANCE):
            found.append(f"value {i}: {a} against {b}")
    return found


def mismatch_raises() -> list[str]:
    """What the device does (names of behaviours that hold)."""
    target = standin_device.install()
    held = []
    x = torch.randn(3, 4).to(target)
    if isinstance(x, standin_device.StandIn) and x.device == target:
        held.append("moves there")
    try:
        x + torch.randn(3, 4)
    except RuntimeError as error:
        if "same device" in str(error):
            held.append("a CPU tensor beside it raises")
    if (x * torch.tensor(2.0)).device == target:
        held.append("a CPU scalar tensor passes")
    if isinstance(torch.zeros(2, device=target), standin_device.StandIn):
        held.append("factories make stand-ins")
    back = x.cpu()
    if type(back) is torch.Tensor and torch.equal(back, x.inner):
        held.append("comes back as the same numbers")
    layer = nn.Linear(4, 2).to(target)
    layer(x).sum().backward()
    if isinstance(layer.weight.grad, standin_device.StandIn):
        held.append("autograd runs there")
    return held


# --- the tests ----------------------------------------------------------- #


def test_the_device_mismatch_of_cuda_is_raised() -> None:
    held = standin_device.in_subprocess(mismatch_raises)
    assert held == [
        "moves there",
        "a CPU tensor beside it raises",
        "a CPU scalar tensor passes",
        "factories make stand-ins",
        "comes back as the same numbers",
        "autograd runs there",
    ]


@pytest.mark.parametrize("name", ZOO)
def test_zoo_transforms_agree_on_the_standin_device(name: str) -> None:
    from benchmarks.gpu.zoo import TRANSFORMS

    found = standin_device.in_subprocess(zoo_problems, name, TRANSFORMS)
    assert found == {t: [] for t in TRANSFORMS}


def test_the_other_transforms_agree_on_the_standin_device() -> None:
    found = standin_device.in_subprocess(other_transforms)
    assert found == {
        "convert_to_float8_training": [],
        "to_plain": [],
        "analyse_module": [],
        "report": [],
    }


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_a_stand_in_drawn_on_the_cpu_is_caught(mutation: str) -> None:
    found = standin_device.in_subprocess(
        zoo_problems, MUTATED_MODEL[mutation], ("unit_scale",), mutation
    )
    assert found["unit_scale"], f"{mutation}: nothing differs"
