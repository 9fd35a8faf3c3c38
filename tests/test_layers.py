"""The package's layers, checked on its imports (every ``import`` statement,
function-level ones included, read from the source with :mod:`ast`).

1. A module never imports another module's private (underscore) name: a helper
   used in two modules lives in a private *module*, under a public name.
2. A layer imports only from its own layer and those below it
   (``from package import name`` counts as importing the module
   ``package.name`` when there is one, at any relative level).
3. ``admin_torch`` depends on torch (and the standard library) alone.
4. Private torch APIs are used in two modules only: ``_torch_internals`` and
   ``transforms/_capture/dynamo`` (each pinned by its own tests).
5. Inside ``transforms``: entry points -> passes (``_unit``, ``_tracking``) ->
   capture engine (``_capture``), and the folder holds nothing else.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# Top-level parts of ``unit_scaling``, lowest layer first. A new module or
# subpackage must be placed here (the test below fails until it is).
LAYERS: dict[str, tuple[str, ...]] = {
    "primitives": (
        "_autograd",
        "_twoway",
        "_kernels",
        "_fx_names",
        "_torch_internals",
        "_standins",
        "scale",
        "constraints",
        "core",
    ),
    "ops": ("functional", "formats", "data"),
    "library": (
        "parameter",
        "modules",
        "_optim_step",
        "optim",
        "recommended",
        "parallel",
    ),
    "transforms": ("transforms", "float8", "export"),
    "analysis": ("analysis", "monitor", "utils", "zoo"),
    "integrations": ("integrations",),
    "application": ("app", "__main__"),
}
RANK = {part: rank for rank, parts in enumerate(LAYERS.values()) for part in parts}


@dataclass(frozen=True)
class Import:
    module: tuple[str, ...]  # the importing module, e.g. ("unit_scaling", "scale")
    target: tuple[str, ...]  # the module imported from
    name: str | None  # the name imported from it (``from target import name``)
    line: int


def _module_of(path: Path) -> tuple[str, ...]:
    parts = path.relative_to(SRC).with_suffix("").parts
    return parts[:-1] if parts[-1] == "__init__" else parts


def _is_module(parts: tuple[str, ...]) -> bool:
    path = SRC.joinpath(*parts)
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports(path: Path, module: tuple[str, ...] | None = None) -> list[Import]:
    """The imports in ``path``, read as those of ``module`` (by default the
    module that ``path`` is under ``SRC``)."""
    module = module or _module_of(path)
    package = module if path.name == "__init__.py" else module[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [
                Import(module, tuple(a.name.split(".")), None, node.lineno)
                for a in node.names
            ]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = base + tuple(node.module.split(".") if node.module else ())
            else:
                target = tuple((node.module or "").split("."))
            found += [Import(module, target, a.name, node.lineno) for a in node.names]
    return found


def _imported_module(i: Import) -> tuple[str, ...]:
    """The module ``i`` reads: for ``from package import name`` that is
    ``package.name`` when ``name`` is a module (a file or a package), else
    ``package``."""
    if i.name is not None and _is_module((*i.target, i.name)):
        return (*i.target, i.name)
    return i.target


def _all_imports(package: str) -> list[Import]:
    return [i for p in sorted((SRC / package).rglob("*.py")) for i in _imports(p)]


def _where(i: Import) -> str:
    return f"{'.'.join(i.module)} (line {i.line})"


@pytest.mark.parametrize("package", ["unit_scaling", "admin_torch"])
def test_no_private_name_of_another_module_is_imported(package: str) -> None:
    ours = ("unit_scaling", "admin_torch")
    bad = [
        f"{_where(i)} imports {i.name} from {'.'.join(i.target)}"
        for i in _all_imports(package)
        if i.target[0] in ours
        and i.name is not None
        and i.name.startswith("_")
        and not i.name.startswith("__")
        and not _is_module((*i.target, i.name))  # a private module is fine
        and i.target != i.module
    ]
    assert not bad, "\n".join(bad)


def test_every_part_of_the_package_has_a_layer() -> None:
    parts = {
        p.stem if p.is_file() else p.name
        for p in (SRC / "unit_scaling").iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()
    }
    assert parts == set(RANK), (
        f"place in LAYERS: {sorted(parts - set(RANK))}; "
        f"gone: {sorted(set(RANK) - parts)}"
    )


def _upward_imports(imports: list[Import]) -> list[str]:
    """Those of ``imports`` that read a module of a higher layer."""
    bad = []
    for i in imports:
        imported = _imported_module(i)
        if len(i.module) < 2 or imported[0] != "unit_scaling" or len(imported) < 2:
            continue  # the package's own __init__ gathers the public API
        source, target = i.module[1], imported[1]
        if source != target and RANK[target] > RANK[source]:
            bad.append(f"{_where(i)} imports {'.'.join(imported)}")
    return bad


def test_layers_import_only_downwards() -> None:
    bad = _upward_imports(_all_imports("unit_scaling"))
    assert not bad, "a lower layer imports a higher one:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    ("module", "source", "imported"),
    [
        ("scale", "def f():\n    from . import zoo\n", "zoo"),
        ("scale", "def f():\n    from unit_scaling import zoo\n", "zoo"),
        ("scale", "def f():\n    import unit_scaling.zoo\n", "zoo"),
        ("scale", "from . import zoo\n", "zoo"),
        ("functional.x", "def f():\n    from .. import zoo\n", "zoo"),
        (
            "core.x",
            "def f():\n    from ..transforms import _unit\n",
            "transforms._unit",
        ),
    ],
    ids=["relative", "absolute", "import", "module-level", "two-up", "subpackage"],
)
def test_the_layer_check_sees_an_upward_import(
    module: str, source: str, imported: str, tmp_path: Path
) -> None:
    # ``from <package> import <module>``, at any level and inside a function
    # too, counts as importing that module.
    path = tmp_path / "m.py"
    path.write_text(source)
    line = source.count("\n")  # the import is the last line
    found = _upward_imports(_imports(path, ("unit_scaling", *module.split("."))))
    assert found == [
        f"unit_scaling.{module} (line {line}) imports unit_scaling.{imported}"
    ]


def test_admin_torch_depends_only_on_torch() -> None:
    allowed = {"admin_torch", "torch", *sys.stdlib_module_names}
    bad = [
        f"{_where(i)} imports {'.'.join(i.target)}"
        for i in _all_imports("admin_torch")
        if i.target[0] not in allowed
    ]
    assert not bad, "\n".join(bad)


def test_the_checks_see_a_violation() -> None:
    # The parser itself: a relative import of a private name is resolved to the
    # module it names, and a private module is told from a private name.
    found = _imports(SRC / "unit_scaling" / "scale.py")
    assert any(
        i.target == ("unit_scaling", "_twoway") and i.name == "scale_twoway"
        for i in found
    )
    assert _is_module(("unit_scaling", "_twoway"))
    assert not _is_module(("unit_scaling", "scale", "scale_fwd"))
    assert RANK["transforms"] > RANK["functional"] > RANK["scale"]


# The modules allowed to touch private torch APIs.
TORCH_INTERNALS = {
    ("unit_scaling", "_torch_internals"),
    ("unit_scaling", "transforms", "_capture", "dynamo"),
}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_torch_uses(path: Path) -> list[str]:
    """Imports of private torch modules or names, and ``torch._x`` attribute
    chains (``torch``, ``nn``, ``F`` as the root), in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and not node.level:
            parts = (node.module or "").split(".")
            if parts[0] == "torch":
                names = [a.name for a in node.names]
                if any(map(_is_private, parts + names)):
                    found.append(f"line {node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "torch" and any(map(_is_private, parts)):
                    found.append(f"line {node.lineno}: import {alias.name}")
        elif isinstance(node, ast.Attribute) and _is_private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in ("torch", "nn", "F"):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_private_torch_apis_only_in_their_two_modules() -> None:
    bad = [
        f"{'.'.join(_module_of(path))} {use}"
        for package in ("unit_scaling", "admin_torch")
        for path in sorted((SRC / package).rglob("*.py"))
        if _module_of(path) not in TORCH_INTERNALS
        for use in _private_torch_uses(path)
    ]
    assert not bad, "move these behind unit_scaling._torch_internals:\n" + "\n".join(
        bad
    )
    # and the check sees one where there is one
    assert _private_torch_uses(SRC / "unit_scaling" / "_torch_internals.py")


TRANSFORMS = ("unit_scale", "track_scales", "simulate_format", "compile")


def test_each_transform_builds_on_the_engine_not_on_another_transform() -> None:
    bad = []
    for name in TRANSFORMS:
        for i in _imports(SRC / "unit_scaling" / "transforms" / f"{name}.py"):
            target = i.target if i.name is None else (*i.target, i.name)
            for other in TRANSFORMS:
                if other != name and ("transforms", other) in pairwise(target):
                    bad.append(f"{_where(i)} imports {'.'.join(target)}")
    assert not bad, "\n".join(bad)


# Inside ``transforms``: the entry points, over the passes of each transform,
# over the capture engine they share. Imports run one way only, and the two pass
# packages never import each other (what both need lives in the engine).
TRANSFORM_LAYERS: dict[str, int] = {"_capture": 0, "_unit": 1, "_tracking": 1}
ENTRY_POINTS = frozenset({"__init__", *TRANSFORMS})


def _transforms_part(module: tuple[str, ...]) -> str | None:
    """The part of ``transforms`` a module belongs to: a layer package, or
    ``"entry"`` for the public modules at its top; ``None`` outside it."""
    if module[:2] != ("unit_scaling", "transforms"):
        return None
    if len(module) == 2 or module[2] not in TRANSFORM_LAYERS:
        return "entry"
    return module[2]


def _wrong_way(i: Import) -> bool:
    source = _transforms_part(i.module)
    target = i.target if i.name is None else (*i.target, i.name)
    into = _transforms_part(target)
    if source is None or into is None or source == into:
        return False
    if into == "entry":
        return True  # nothing below the entry points imports one
    if source == "entry":
        return False
    return TRANSFORM_LAYERS[into] >= TRANSFORM_LAYERS[source]


def test_transforms_tree_shows_its_layers() -> None:
    root = SRC / "unit_scaling" / "transforms"
    modules = {p.stem for p in root.glob("*.py")}
    packages = {p.name for p in root.iterdir() if (p / "__init__.py").is_file()}
    assert modules == ENTRY_POINTS, f"top of transforms/: {sorted(modules)}"
    assert packages == set(TRANSFORM_LAYERS), f"packages: {sorted(packages)}"


def test_transforms_import_downwards_only() -> None:
    bad = [
        f"{_where(i)} imports {'.'.join(i.target)}" + (f" {i.name}" if i.name else "")
        for i in _all_imports("unit_scaling/transforms")
        if _wrong_way(i)
    ]
    assert not bad, (
        "transforms/ imports run entry points -> passes (_unit, _tracking) -> "
        "engine (_capture):\n" + "\n".join(bad)
    )
    # and the check sees a wrong-way import where there is one
    engine = ("unit_scaling", "transforms", "_capture", "engine")
    unit = ("unit_scaling", "transforms", "_unit", "params")
    tracking = ("unit_scaling", "transforms", "_tracking", "metrics")
    entry = ("unit_scaling", "transforms", "unit_scale")
    assert _wrong_way(Import(engine, unit[:3], "params", 1))  # from .._unit import
    assert _wrong_way(Import(unit, tracking, "Metrics", 1))
    assert _wrong_way(Import(tracking, entry, "unit_scale", 1))
    assert not _wrong_way(Import(entry, unit, "x", 1))
    assert not _wrong_way(Import(unit, engine, "Transform", 1))
    # the parser resolves a relative import inside a layer package
    found = _imports(SRC / "unit_scaling" / "transforms" / "_unit" / "params.py")
    assert any(i.target[:3] == engine[:3] for i in found)
