"""Every place a user starts reads u-μP's recommended values from
:data:`unit_scaling.RECOMMENDED`, never a copy of them.

Each page and script below is parsed (``ast``: whole ``.py`` files, their
docstrings' examples, the ``python`` blocks of ``.md`` pages and their inline
code), and every call is checked wherever it spans lines:

- a u-μP optimizer (``uu.optim.AdamW(``, ``optim.Adam(``, ``SGD(`` imported from
  ``unit_scaling.optim``, ``scaled_parameters(``) takes its ``lr`` from
  ``RECOMMENDED.lr`` (``RECOMMENDED.unit_scale_lr`` for a model made u-μP by
  ``unit_scale``), directly, through a name assigned from it, or through a
  setting (a dataclass field, an ``argparse`` option) whose default is it;
- a ``TransformerDecoder(`` passes ``**RECOMMENDED.multipliers`` (or each
  multiplier from ``RECOMMENDED``).

A call may be exempted by a comment on one of its lines or the line above it,
``# not the recommended lr|multipliers|values: <reason>``. A literal equal to a
recommended value fails even when exempted: it is a copy that would not follow a
change of :mod:`unit_scaling.recommended`.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.test_docs_snippets import python_blocks
from unit_scaling.recommended import RECOMMENDED

ROOT = Path(__file__).resolve().parents[1]
PAGES = [
    "README.md",
    "docs/index.md",
    "docs/guide.md",
    "docs/distributed.md",
    "docs/from-unit-scaling.md",
    "examples/train_ddp.py",
    "examples/train_hf_trainer.py",
    "docs/training-loops.md",
    "src/unit_scaling/app/demo.py",
    "src/unit_scaling/optim.py",
    "src/unit_scaling/__init__.py",
    "src/unit_scaling/recommended.py",
    "docs/results/coord_check.md",
    "experiments/coord_check.py",
]
OPTIMIZERS = {"Adam", "AdamW", "SGD"}
_EXEMPT = re.compile(r"#\s*not the recommended (lr|multipliers|values): *\S{2,}")
_INLINE = re.compile(r"(?<!`)`([^`]+)`(?!`)")
_CALL_TEXT = re.compile(r"(optim\.\w+|TransformerDecoder|scaled_parameters)\(")
_PROMPT = re.compile(r"^\s*(?:>>>|\.\.\.) ?(.*)$", re.MULTILINE)
# Library code, not a place a user starts: only their docstrings' examples count.
DOCSTRINGS_ONLY = {
    "src/unit_scaling/optim.py",
    "src/unit_scaling/__init__.py",
    "src/unit_scaling/recommended.py",
}


@dataclass
class Unit:
    """Code to check: a file, a block or a docstring's examples."""

    where: str
    code: str
    bare_optimizers: bool = False  # ``AdamW(`` means ``unit_scaling.optim.AdamW``


@dataclass
class Scope:
    """What a page's code has assigned so far, in order."""

    origins: dict[str, str] = field(default_factory=dict)  # name -> model kind
    derived: dict[str, set[str]] = field(default_factory=dict)  # RECOMMENDED attrs
    literals: dict[str, ast.expr] = field(default_factory=dict)  # name -> value


def _units(page: str) -> Iterator[Unit]:
    text = (ROOT / page).read_text(encoding="utf-8")
    if page.endswith(".py"):
        if page not in DOCSTRINGS_ONLY:
            yield Unit(page, text)
        yield from _docstring_units(page, text)
        return
    for block in python_blocks(page, text):
        yield Unit(block.where, block.code)
    outside = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    for span in _INLINE.findall(outside):
        if _CALL_TEXT.search(span):
            yield Unit(f"{page}: `{span}`", " ".join(span.split()))


def _docstring_units(page: str, text: str) -> Iterator[Unit]:
    """The examples of each docstring, comment lines (markers) included."""
    bare = page.endswith("unit_scaling/optim.py")  # its examples run in its globals
    for node in ast.walk(ast.parse(text)):
        if not isinstance(
            node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
        ):
            continue
        docstring = ast.get_docstring(node, clean=True) or ""
        code = "\n".join(m[1] for m in _PROMPT.finditer(docstring))
        if code:
            name = getattr(node, "name", "module")
            yield Unit(f"{page} ({name} docstring)", code, bare_optimizers=bare)


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Call):
        return _dotted(node.func) + "()"
    return "?"


def _recommended_attrs(node: ast.expr, scope: Scope) -> set[str]:
    """The attributes of ``RECOMMENDED`` that ``node``'s value is read from."""
    found: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and _dotted(sub.value).split(".")[-1] == (
            "RECOMMENDED"
        ):
            found.add(sub.attr)
        elif isinstance(sub, ast.Name | ast.Attribute):
            found |= scope.derived.get(_last_name(sub), set())
    return found


def _last_name(node: ast.expr) -> str:
    return _dotted(node).split(".")[-1]


_OPS: dict[type, Callable[..., float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def _number(node: ast.expr) -> float | None:
    """The value of a literal number expression (``2**-3``, ``0.5``), else None."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        value = _number(node.operand)
        return None if value is None else _OPS[type(node.op)](value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _number(node.left), _number(node.right)
        if left is None or right is None:
            return None
        return float(_OPS[type(node.op)](left, right))
    return None


def _setting_default(value: ast.expr | None) -> ast.expr | None:
    """The default of a dataclass field (``setting(default, help)``, ``field``)."""
    if isinstance(value, ast.Call) and _last_name(value.func) in ("setting", "field"):
        for keyword in value.keywords:
            if keyword.arg == "default":
                return keyword.value
        return value.args[0] if value.args else None
    return value


def _settings(tree: ast.Module) -> dict[str, ast.expr]:
    """Each setting's default, by name: dataclass fields and argparse options."""
    found: dict[str, ast.expr] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(
                    item.target, ast.Name
                ):
                    default = _setting_default(item.value)
                    if default is not None:
                        found[item.target.id] = default
        elif isinstance(node, ast.Call) and _last_name(node.func) == "add_argument":
            default = next((k.value for k in node.keywords if k.arg == "default"), None)
            flags = [
                a.value
                for a in node.args
                if isinstance(a, ast.Constant) and isinstance(a.value, str)
            ]
            if default is not None and flags:
                found[flags[-1].lstrip("-").replace("-", "_")] = default
    return found


def _origin(node: ast.expr, scope: Scope) -> str:
    """What model ``node`` (``model.parameters()``, ...) comes from, if known."""
    while True:
        if isinstance(node, ast.Call):
            kind = _model_kind(node)
            if kind:
                return kind
            node = node.func
        elif isinstance(node, ast.Attribute):
            node = node.value
        elif isinstance(node, ast.Name):
            return scope.origins.get(node.id, "")
        else:
            return ""


def _model_kind(call: ast.Call) -> str:
    name = _last_name(call.func)
    if name == "unit_scale":
        return "unit_scale"
    return "decoder" if name == "TransformerDecoder" else ""


class Checker:
    """Finds the problems of one page's units, in order."""

    def __init__(self) -> None:
        self.scope = Scope()
        self.problems: list[str] = []

    def check(self, unit: Unit) -> None:
        try:
            tree = ast.parse(unit.code)
        except SyntaxError as error:
            self.problems.append(
                f"{unit.where}: not Python ({error.msg}): cannot check"
            )
            return
        lines = unit.code.splitlines()
        settings = _settings(tree)
        torch_optim = any(
            isinstance(node, ast.ImportFrom)
            and node.module == "torch"
            and any(alias.name == "optim" for alias in node.names)
            for node in ast.walk(tree)
        )
        for name, default in settings.items():
            self.scope.derived[name] = _recommended_attrs(default, self.scope)
            self.scope.literals[name] = default
        for node in sorted(
            (n for n in ast.walk(tree) if isinstance(n, ast.Assign | ast.Call)),
            key=lambda n: (n.lineno, n.col_offset),
        ):
            if isinstance(node, ast.Assign):
                self._assign(node)
                continue
            exempt = self._exemption(node, lines)
            func = _dotted(node.func)
            where = f"{unit.where}:{node.lineno}: {func}(...)"
            if self._is_optimizer(func, unit.bare_optimizers, torch_optim):
                self._check_lr(node, exempt, where)
            elif func.split(".")[-1] == "TransformerDecoder":
                self._check_multipliers(node, exempt, where)
            elif func.split(".")[-1] == "TrainingArguments":
                self._check_learning_rate(node, exempt, where)

    def _assign(self, node: ast.Assign) -> None:
        kind = next(
            (
                _model_kind(c)
                for c in ast.walk(node.value)
                if isinstance(c, ast.Call) and _model_kind(c)
            ),
            "",
        )
        attrs = _recommended_attrs(node.value, self.scope)
        for target in node.targets:
            if isinstance(target, ast.Name):
                self.scope.origins[target.id] = kind
                self.scope.derived[target.id] = attrs
                self.scope.literals[target.id] = node.value

    @staticmethod
    def _exemption(node: ast.Call, lines: list[str]) -> set[str]:
        first = max(node.lineno - 2, 0)
        last = node.end_lineno or node.lineno
        kinds = {m[1] for line in lines[first:last] for m in _EXEMPT.finditer(line)}
        if "values" in kinds:
            kinds |= {"lr", "multipliers"}
        return kinds

    @staticmethod
    def _is_optimizer(func: str, bare: bool, torch_optim: bool) -> bool:
        parts = func.split(".")
        if parts[-1] == "scaled_parameters":
            return True
        if parts[-1] not in OPTIMIZERS:
            return False
        if len(parts) == 1:
            return bare
        if parts[-2] != "optim" or parts[0] == "torch":
            return False
        return len(parts) > 2 or not torch_optim

    def _literal(self, node: ast.expr, allowed: set[float], where: str) -> bool:
        """Whether ``node`` (or the setting or name it reads) is a literal
        copy of a recommended value; records the problem if so."""
        value = _number(node)
        reads = _recommended_attrs(node, self.scope)
        if value is None and not reads and isinstance(node, ast.Name | ast.Attribute):
            source = self.scope.literals.get(_last_name(node))
            value = None if source is None else _number(source)
        if value is not None and value in allowed:
            self.problems.append(
                f"{where}: the literal {value:g} copies a "
                "recommended value: read RECOMMENDED instead"
            )
            return True
        return False

    def _check_lr(self, call: ast.Call, exempt: set[str], where: str) -> None:
        lr = next((k.value for k in call.keywords if k.arg == "lr"), None)
        position = 2 if _last_name(call.func) == "scaled_parameters" else 1
        if lr is None and len(call.args) > position:
            lr = call.args[position]
        if lr is not None and self._literal(
            lr, {RECOMMENDED.lr, RECOMMENDED.unit_scale_lr}, where
        ):
            return
        if "lr" in exempt:
            return
        if lr is None:
            self.problems.append(
                f"{where}: no lr (torch's default): pass "
                "lr=uu.RECOMMENDED.lr or exempt it"
            )
            return
        attrs = _recommended_attrs(lr, self.scope) & {"lr", "unit_scale_lr"}
        origin = _origin(call.args[0], self.scope) if call.args else ""
        wanted = {"unit_scale": {"unit_scale_lr"}, "decoder": {"lr"}}.get(
            origin, {"lr", "unit_scale_lr"}
        )
        if not attrs & wanted:
            self.problems.append(
                f"{where}: lr is not read from RECOMMENDED."
                + "/".join(sorted(wanted))
                + (f" (the model comes from {origin})" if origin else "")
            )

    def _check_learning_rate(
        self, call: ast.Call, exempt: set[str], where: str
    ) -> None:
        """A Trainer's ``learning_rate``: none is fine (the integration starts
        a u-μP model from RECOMMENDED), a given one must read it."""
        lr = next((k.value for k in call.keywords if k.arg == "learning_rate"), None)
        if lr is None:
            return
        recommended = {RECOMMENDED.lr, RECOMMENDED.unit_scale_lr}
        if self._literal(lr, recommended, where) or "lr" in exempt:
            return
        if not _recommended_attrs(lr, self.scope) & {"lr", "unit_scale_lr"}:
            self.problems.append(
                f"{where}: learning_rate is not read from RECOMMENDED (leave it "
                "out, read RECOMMENDED.lr/unit_scale_lr, or exempt it)"
            )

    def _check_multipliers(self, call: ast.Call, exempt: set[str], where: str) -> None:
        given = {k.arg: k.value for k in call.keywords}
        for name, value in (
            ("residual_mult", RECOMMENDED.residual_mult),
            ("loss_mult", RECOMMENDED.loss_mult),
        ):
            if name in given and self._literal(given[name], {value}, where):
                return
        if "multipliers" in exempt:
            return
        spread = [
            k.value
            for k in call.keywords
            if k.arg is None
            and "multipliers" in _recommended_attrs(k.value, self.scope)
        ]
        each = all(
            name in given and name in _recommended_attrs(given[name], self.scope)
            for name in RECOMMENDED.multipliers
        )
        if not spread and not each:
            self.problems.append(
                f"{where}: pass **uu.RECOMMENDED.multipliers or exempt it"
            )


def problems(units: list[Unit]) -> list[str]:
    """The problems of a page's units, checked in order."""
    checker = Checker()
    for unit in units:
        checker.check(unit)
    return checker.problems


@pytest.mark.parametrize("page", PAGES)
def test_each_start_reads_recommended(page: str) -> None:
    units = list(_units(page))
    assert units, f"{page}: nothing to check"
    found = problems(units)
    assert not found, "\n".join(found)


def test_the_scan_finds_the_starts() -> None:
    """The pages do construct u-μP optimizers and decoders: the scan saw them."""
    seen: list[str] = []
    for page in ("README.md", "docs/guide.md", "src/unit_scaling/optim.py"):
        for unit in _units(page):
            seen += re.findall(
                r"RECOMMENDED\.(?:lr|unit_scale_lr|multipliers)", unit.code
            )
    assert seen.count("RECOMMENDED.multipliers") >= 6
    assert seen.count("RECOMMENDED.unit_scale_lr") >= 3


def _check(code: str, bare: bool = False) -> list[str]:
    return problems([Unit("snippet", code, bare_optimizers=bare)])


@pytest.mark.parametrize(
    ("code", "problem"),
    [
        # a literal lr, on a later line of a multi-line call
        (
            "opt = uu.optim.AdamW(\n    model.parameters(),\n    lr=2**-3,\n)",
            "not read from",
        ),
        # a literal equal to a recommended value: a copy, even when exempted
        (
            f"opt = uu.optim.AdamW(m.parameters(), lr={RECOMMENDED.lr!r})"
            "  # not the recommended lr: a test",
            "copies a recommended",
        ),
        # torch's default lr
        (
            "opt = uu.optim.Adam(model.parameters())",
            "no lr",
        ),
        # a Trainer's learning rate given as a literal
        (
            "args = TrainingArguments('out', learning_rate=3e-4)",
            "learning_rate is not read",
        ),
        # the positional lr
        (
            "opt = uu.optim.AdamW(model.parameters(), 0.1)",
            "not read from",
        ),
        # the decoder's lr for a unit_scale'd model
        (
            "scaled = unit_scale(model)\n"
            "opt = uu.optim.AdamW(scaled.parameters(), lr=uu.RECOMMENDED.lr)",
            "RECOMMENDED.unit_scale_lr (the model comes from unit_scale)",
        ),
        # and the other way round
        (
            "model = uu.TransformerDecoder(8, 8, 1, 1, **uu.RECOMMENDED.multipliers)\n"
            "opt = uu.optim.AdamW(model.parameters(), lr=uu.RECOMMENDED.unit_scale_lr)",
            "RECOMMENDED.lr (the model comes from decoder)",
        ),
        # a setting whose default is not RECOMMENDED's
        (
            "class C:\n    lr_umup: float = setting(2**-3, 'lr')\n"
            "opt = optim.AdamW(ps, lr=config.lr_umup)",
            "not read from",
        ),
        # an argparse default that copies the value
        (
            f"p.add_argument('--lr', type=float, default={RECOMMENDED.lr!r})\n"
            "opt = uu.optim.AdamW(ps, lr=args.lr)",
            "copies a recommended",
        ),
        # a bare optimizer name in unit_scaling.optim's own examples
        (
            "opt = AdamW(model.parameters(), lr=1e-2)",
            "not read from",
        ),
        # a decoder without the multipliers
        (
            "model = uu.TransformerDecoder(\n    64, 256, layers=2, heads=4\n)",
            "pass **uu.RECOMMENDED.multipliers",
        ),
        # one multiplier copied as a literal
        (
            "model = uu.TransformerDecoder(64, 256, 2, 4, "
            f"residual_mult={RECOMMENDED.residual_mult!r}, "
            "loss_mult=uu.RECOMMENDED.loss_mult)",
            "copies a recommended",
        ),
        # a marker without a reason
        (
            "opt = uu.optim.AdamW(ps, lr=0.1)  # not the recommended lr:",
            "not read from",
        ),
        # scaled_parameters' lr
        (
            "groups = scaled_parameters(ps, lr_scale_func_adam, lr=1e-2)",
            "not read from",
        ),
    ],
)
def test_the_scan_rejects(code: str, problem: str) -> None:
    found = _check(code, bare=True)
    assert len(found) == 1 and problem in found[0], found


@pytest.mark.parametrize(
    "code",
    [
        "opt = uu.optim.AdamW(\n    model.parameters(),\n    lr=uu.RECOMMENDED.lr,\n)",
        "lr = uu.RECOMMENDED.lr\ngroups = scaled_parameters(ps, f, lr=lr)",
        "scaled = unit_scale(model)\n"
        "opt = uu.optim.AdamW(scaled.parameters(), lr=uu.RECOMMENDED.unit_scale_lr)",
        "class C:\n    lr_umup: float = setting(RECOMMENDED.lr, 'lr')\n"
        "opt = optim.AdamW(ps, lr=config.lr_umup)",
        "p.add_argument('--lr', type=float, default=uu.RECOMMENDED.lr)\n"
        "opt = uu.optim.AdamW(ps, lr=args.lr)",
        "# not the recommended lr: the sweep's own result\n"
        "opt = uu.optim.AdamW(ps, lr=best['lr'])",
        "model = uu.TransformerDecoder(64, 256,\n    **uu.RECOMMENDED.multipliers)",
        "model = uu.TransformerDecoder(64, 256, 2, 4, "
        "residual_mult=uu.RECOMMENDED.residual_mult, "
        "loss_mult=uu.RECOMMENDED.loss_mult)",
        # SP is not checked: torch's optimizer, another decoder
        "opt = torch.optim.AdamW(model.parameters(), lr=2**-8)\n"
        "m = StandardTransformerDecoder(64, 256, 2, 4)",
        "from torch import optim\nopt = optim.AdamW(ps, lr=1e-3)",
    ],
)
def test_the_scan_accepts(code: str) -> None:
    assert _check(code, bare=True) == []


def test_the_demo_starts_from_recommended() -> None:
    from unit_scaling.app import demo

    config = demo.DemoConfig()
    model, optimizer = demo._build("u-μP", "FP32", config)
    assert config.lr_umup == RECOMMENDED.lr
    for name, value in RECOMMENDED.multipliers.items():
        assert getattr(model, name) == value
    # The readout's group steps at the base lr (its rule's factor is 1).
    assert max(group["lr"] for group in optimizer.param_groups) == RECOMMENDED.lr
