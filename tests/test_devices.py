"""Device-correctness by construction.

Every tensor the library makes for its own use (a stand-in, probe, mask, scale)
must live on the device of the value it stands for. On a CPU-only machine a
tensor made without a device lands on the CPU, where the model is too, so a
missing ``device=`` goes unnoticed until a user runs on a GPU (a CPU stand-in
times a CUDA weight). Two checks catch that class of bug here:

* statically, every torch factory call in the package, and every call of a
  ``unit_scaling._standins`` function that takes a device, names its device
  and takes it from a value: a device written in the source (``"cpu"``,
  ``torch.device("cpu")``, a module-level name bound to one) is reported unless
  the call's module and function are on ``ALLOWED_LITERAL_DEVICES`` with a
  reason (random draws go through ``_standins``, which draws on a seeded CPU
  generator by design and moves);
* dynamically, ``unit_scale`` gives the same function and report when its own
  work runs with torch's default device set to one the model is not on
  (``meta``, which every build of torch has): a tensor made on the default
  device then meets the model's CPU tensors and fails, as on CUDA.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.fx import Graph, GraphModule

import unit_scaling
from tests.helpers import STANDIN_PATHS
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
# Checked as torch's factories are: its functions that take a device.
STANDINS = ("unit_scaling", "_standins")


def _module_of(path: Path) -> tuple[str, ...]:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return parts[:-1] if parts[-1] == "__init__" else parts


def _device_parameters(path: Path) -> dict[str, int | None]:
    """The functions defined at the top of ``path`` that take a ``device``: the
    parameter's position (``None`` for a keyword-only one)."""
    found: dict[str, int | None] = {}
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.FunctionDef):
            positional = [a.arg for a in node.args.posonlyargs + node.args.args]
            if "device" in positional:
                found[node.name] = positional.index("device")
            elif any(a.arg == "device" for a in node.args.kwonlyargs):
                found[node.name] = None
    return found


# The stand-in functions that take a device (read from their source, so a new
# one is checked too), and where each takes it.
STANDIN_DEVICES = _device_parameters(PACKAGE / "_standins.py")


def _dotted(node: ast.expr) -> tuple[str, ...] | None:
    """``a.b.c`` as ``("a", "b", "c")``; ``None`` for anything else."""
    if isinstance(node, ast.Name):
        return (node.id,)
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else (*base, node.attr)
    return None


def _is_literal(device: ast.expr, constants: set[str]) -> bool:
    """Whether ``device`` names a device in the source rather than taking one
    from a value: a constant (``"cpu"``, ``0``, ``None``), ``torch.device(...)``
    of constants, or a name in ``constants`` (module-level names bound to one
    of those)."""
    if isinstance(device, ast.Constant):
        return True
    if isinstance(device, ast.Name):
        return device.id in constants
    return (
        isinstance(device, ast.Call)
        and _dotted(device.func) == ("torch", "device")
        and all(
            _is_literal(a, constants)
            for a in [*device.args, *(k.value for k in device.keywords)]
        )
    )


@dataclass(frozen=True)
class DeviceCall:
    """A call that makes a tensor or a generator, and the device it passes."""

    module: str  # e.g. "unit_scaling._standins"
    function: str  # the enclosing function, e.g. "Corpus.batches"; "" at the top
    callee: str  # "torch.zeros", "_standins.normal"
    device: ast.expr | None  # None when the call passes none
    literal: bool  # the device is named in the source (see _is_literal)
    line: int

    @property
    def key(self) -> tuple[str, str, str]:
        return self.module, self.function, self.callee

    def __str__(self) -> str:
        device = "no device" if self.device is None else ast.unparse(self.device)
        where = f"{self.module}:{self.line} in {self.function or '<module>'}"
        return f"{where}: {self.callee} with {device}"


class _DeviceCalls(ast.NodeVisitor):
    def __init__(self, module: tuple[str, ...], is_package: bool) -> None:
        self.module = module
        self.package = module if is_package else module[:-1]
        self.scope: list[str] = []
        self.constants: set[str] = set()
        # local names of the stand-in module and of its device-taking functions
        here = module == STANDINS
        self.standin_modules: set[str] = set()
        self.standins = {n: n for n in STANDIN_DEVICES} if here else {}
        self.found: list[DeviceCall] = []

    def visit_Module(self, node: ast.Module) -> None:
        for statement in node.body:  # module-level names bound to a literal device
            targets: list[ast.expr] = []
            if isinstance(statement, ast.Assign):
                targets, value = statement.targets, statement.value
            elif isinstance(statement, ast.AnnAssign) and statement.value:
                targets, value = [statement.target], statement.value
            for target in targets:
                if isinstance(target, ast.Name):
                    if _is_literal(value, self.constants):
                        self.constants.add(target.id)
                    else:
                        self.constants.discard(target.id)
        self.generic_visit(node)

    def _in_scope(self, node: ast.AST, name: str) -> None:
        self.scope.append(name)
        self.generic_visit(node)
        self.scope.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._in_scope(node, node.name)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._in_scope(node, node.name)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._in_scope(node, node.name)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if tuple(alias.name.split(".")) == STANDINS and alias.asname:
                self.standin_modules.add(alias.asname)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = self.package[: len(self.package) - node.level + 1] if node.level else ()
        target = base + tuple(node.module.split(".") if node.module else ())
        for alias in node.names:
            local = alias.asname or alias.name
            if target == STANDINS and alias.name in STANDIN_DEVICES:
                self.standins[local] = alias.name
            elif (*target, alias.name) == STANDINS:
                self.standin_modules.add(local)

    def _callee(self, func: ast.expr) -> tuple[str, int | None] | None:
        """The name of a call that makes a tensor or a generator, and the
        position of its device among its arguments (``None`` for keyword-only);
        ``None`` for any other call."""
        name = _dotted(func)
        if name is None:
            return None
        if len(name) == 2 and name[0] == "torch" and name[1] in FACTORIES:
            return f"torch.{name[1]}", 0 if name[1] == "Generator" else None
        if len(name) == 1:
            function = self.standins.get(name[0])
        elif name[:-1] == STANDINS or (
            len(name) == 2 and name[0] in self.standin_modules
        ):
            function = name[-1] if name[-1] in STANDIN_DEVICES else None
        else:
            function = None
        if function is None:
            return None
        return f"_standins.{function}", STANDIN_DEVICES[function]

    def visit_Call(self, node: ast.Call) -> None:
        callee = self._callee(node.func)
        if callee is not None:
            name, position = callee
            device = next((k.value for k in node.keywords if k.arg == "device"), None)
            if device is None and position is not None and len(node.args) > position:
                device = node.args[position]
            self.found.append(
                DeviceCall(
                    ".".join(self.module),
                    ".".join(self.scope),
                    name,
                    device,
                    device is not None and _is_literal(device, self.constants),
                    node.lineno,
                )
            )
        self.generic_visit(node)


def _device_calls(
    path: Path, module: tuple[str, ...] | None = None
) -> list[DeviceCall]:
    """The calls in ``path`` that make a tensor or a generator: torch's
    factories and the stand-in functions that take a device. ``module``: the
    module ``path`` is read as (by default, the one it is in the package)."""
    visitor = _DeviceCalls(module or _module_of(path), path.name == "__init__.py")
    visitor.visit(ast.parse(path.read_text(), str(path)))
    return visitor.found


_SEEDED = "draws from a seeded CPU generator by design, then moves the result"
_RULE = (
    "a probe of a scale rule, not of the model: float64 values on the CPU, "
    "from which only a Python number leaves"
)
_META = "a meta tensor that carries only a shape (and a dtype), no values"
_SOLVER = "the export's least-squares solve for scale factors, float64 on the CPU"
_DATA = (
    "the corpus and the generator that samples it live on the CPU, as "
    "documented; get_batch() moves each batch to the device asked for"
)
_TABLE = (
    "a format's constant table, built once (cached) on the CPU and moved to the "
    "device of the values it is used with"
)
# Calls allowed a device named in the source, each with its reason. Keyed by
# module, enclosing function and callee (not by line), so that such a call
# anywhere else, even in the same module, is still reported.
ALLOWED_LITERAL_DEVICES: dict[tuple[str, str, str], str] = {
    ("unit_scaling._standins", "seeded", "torch.Generator"): _SEEDED,
    ("unit_scaling._standins", "normal", "torch.randn"): _SEEDED,
    ("unit_scaling.export._decoder", "export_decoder", "torch.randint"): _SEEDED,
    ("unit_scaling.export._decoder", "_residual_weights", "torch.ones"): _RULE,
    ("unit_scaling.export._decoder", "_residual_weights", "torch.zeros"): _RULE,
    ("unit_scaling.export._decoder", "_ratios", "_standins.normal"): _RULE,
    ("unit_scaling.export._graph", "attention_scale_at", "torch.zeros"): _RULE,
    ("unit_scaling.export._graph", "attention_temperature", "torch.zeros"): _RULE,
    ("unit_scaling.transforms._unit.consistency", "_probe_grad", "torch.linspace"): (
        _RULE
    ),
    ("unit_scaling.export._solver", "RatioSystem.solve", "torch.zeros"): _SOLVER,
    ("unit_scaling.export._solver", "_least_change", "torch.tensor"): _SOLVER,
    ("unit_scaling.optim", "_tagged", "torch.empty"): _META,
    ("unit_scaling.transforms._unit.values", "graph_values", "torch.empty"): _META,
    ("unit_scaling.data", "_load.as_tensor", "torch.empty"): _DATA,
    ("unit_scaling.data", "encode", "torch.tensor"): _DATA,
    ("unit_scaling.data", "_as_generator", "torch.Generator"): _DATA,
    ("unit_scaling.data", "Corpus.batches", "torch.Generator"): _DATA,
    ("unit_scaling.formats._codes", "element_table", "torch.tensor"): _TABLE,
    ("unit_scaling.formats._recipe", "_hadamard", "torch.ones"): _TABLE,
    ("unit_scaling.formats._recipe", "_hadamard", "torch.Generator"): _SEEDED,
    ("unit_scaling.formats._recipe", "_hadamard", "torch.randint"): _SEEDED,
}


def _literal_devices(calls: list[DeviceCall]) -> list[str]:
    """Those of ``calls`` that name their device in the source, unless allowed."""
    return [str(c) for c in calls if c.literal and c.key not in ALLOWED_LITERAL_DEVICES]


def test_every_factory_call_names_its_device() -> None:
    sources = [
        p
        for p in sorted(PACKAGE.rglob("*.py"))
        if not any(p.is_relative_to(e) for e in EXEMPT)
    ]
    assert len(sources) > 50
    calls = [c for p in sources for c in _device_calls(p)]
    missing = [str(c) for c in calls if c.device is None]
    assert not missing, (
        "torch factory calls without device= (use unit_scaling._standins for "
        "random draws, or pass the device of the value the tensor stands for):\n"
        + "\n".join(missing)
    )
    literal = _literal_devices(calls)
    assert not literal, (
        "calls that name their device in the source (pass the device of the "
        "value the tensor stands for; if one must name it, add it to "
        "ALLOWED_LITERAL_DEVICES with the reason):\n" + "\n".join(literal)
    )
    stale = set(ALLOWED_LITERAL_DEVICES) - {c.key for c in calls if c.literal}
    assert not stale, f"ALLOWED_LITERAL_DEVICES entries that match nothing: {stale}"


def test_the_static_check_sees_a_missing_device(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "import torch\n"
        "a = torch.randn(3, generator=g)\n"
        "b = torch.zeros(3, device=x.device)\n"
        "c = torch.Generator()\n"
    )
    calls = _device_calls(source, ("unit_scaling", "m"))
    assert [c.callee for c in calls if c.device is None] == [
        "torch.randn",
        "torch.Generator",
    ]


# A module of the package that imports the stand-ins in each way there is, for
# one call inside a function.
_SYNTHETIC = (
    "import torch\n"
    "import unit_scaling._standins\n"
    "import unit_scaling._standins as standins\n"
    "from ... import _standins\n"
    "from ..._standins import normal, normal_like\n"
    "from unit_scaling._standins import normal as draw\n"
    '_CPU = torch.device("cpu")\n'
    "_DEFAULT: torch.device = _CPU\n"
    "def make(value, g):\n"
    "    {}\n"
)
_SYNTHETIC_MODULE = ("unit_scaling", "transforms", "_unit", "m")


@pytest.mark.parametrize(
    ("call", "callee"),
    [
        ('torch.zeros(3, device="cpu")', "torch.zeros"),
        ('torch.zeros(3, device="cuda")', "torch.zeros"),
        ('torch.zeros(3, device=torch.device("cpu"))', "torch.zeros"),
        ('torch.zeros(3, device=torch.device("cuda", 0))', "torch.zeros"),
        ('torch.zeros(3, device=torch.device(type="cpu"))', "torch.zeros"),
        ("torch.zeros(3, device=_CPU)", "torch.zeros"),
        ('torch.Generator("cpu")', "torch.Generator"),
        ('torch.Generator(device="cpu")', "torch.Generator"),
        ('_standins.normal(value.shape, g, "cpu", value.dtype)', "_standins.normal"),
        ('_standins.normal(value.shape, g, device="cpu")', "_standins.normal"),
        ("normal(value.shape, g, _CPU, value.dtype)", "_standins.normal"),
        ("draw(value.shape, g, _CPU)", "_standins.normal"),
        ("standins.normal(value.shape, g, _DEFAULT)", "_standins.normal"),
        ('unit_scaling._standins.normal(value.shape, g, "cpu")', "_standins.normal"),
    ],
)
def test_the_static_check_sees_a_literal_device(
    call: str, callee: str, tmp_path: Path
) -> None:
    path = tmp_path / "m.py"
    path.write_text(_SYNTHETIC.format(call))
    calls = _device_calls(path, _SYNTHETIC_MODULE)
    found = [c for c in calls if c.literal]
    assert [(c.function, c.callee, c.line) for c in found] == [("make", callee, 10)]
    assert _literal_devices(calls) == [str(found[0])]


@pytest.mark.parametrize(
    "call",
    [
        "torch.zeros(3, device=value.device)",
        "torch.Generator(value.device)",
        "_standins.normal(value.shape, g, value.device, value.dtype)",
        "normal(value.shape, g, device=value.device)",
        "draw(value.shape, g, device)",
    ],
)
def test_the_static_check_passes_a_device_taken_from_a_value(
    call: str, tmp_path: Path
) -> None:
    path = tmp_path / "m.py"
    path.write_text(_SYNTHETIC.format(call))
    calls = _device_calls(path, _SYNTHETIC_MODULE)
    assert [(c.function, c.device is not None, c.literal) for c in calls] == [
        ("make", True, False)
    ]
    assert _literal_devices(calls) == []


def test_a_literal_device_is_allowed_only_where_listed(tmp_path: Path) -> None:
    # The stand-ins draw on the CPU in ``normal`` by design; the same call in
    # another function of theirs, or in another module, is reported.
    path = tmp_path / "m.py"
    path.write_text(
        "import torch\n"
        '_CPU = torch.device("cpu")\n'
        "def normal(shape, generator, device):\n"
        "    return torch.randn(shape, generator=generator, device=_CPU)\n"
        "def other(shape, generator, device):\n"
        "    return torch.randn(shape, generator=generator, device=_CPU)\n"
    )
    assert _literal_devices(_device_calls(path, STANDINS)) == [
        "unit_scaling._standins:6 in other: torch.randn with _CPU"
    ]
    assert len(_literal_devices(_device_calls(path, ("unit_scaling", "m")))) == 2


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


@pytest.mark.parametrize("name", STANDIN_PATHS)
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
