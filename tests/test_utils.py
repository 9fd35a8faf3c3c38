"""Tests for ``unit_scaling.utils.analyse_module``: the annotated-code view."""

from __future__ import annotations

import re
import sys

import pytest
import torch
from torch import Tensor, nn

import unit_scaling as uu
from unit_scaling.transforms import unit_scale
from unit_scaling.utils import analyse_module

ANNOTATION = re.compile(r"\(-> (\S+?)(?:, <- (\S+))?\)$")


def _line(code: str, start: str) -> str:
    matches = [
        line.strip() for line in code.splitlines() if line.strip().startswith(start)
    ]
    assert len(matches) == 1, code
    return matches[0]


def _stds(line: str) -> tuple[float, float | None]:
    match = ANNOTATION.search(line)
    assert match, line
    fwd, bwd = match.groups()
    return float(fwd), None if bwd is None else float(bwd)


def test_annotates_each_line_with_fwd_and_bwd_std() -> None:
    torch.manual_seed(0)
    module, x = uu.Linear(16, 32), torch.randn(64, 16)
    code = analyse_module(module, x)
    assert code.splitlines()[0] == "def forward(input):"
    line = _line(code, "linear = U.linear(input, self.weight")
    fwd, bwd = _stds(line)
    assert fwd == pytest.approx(
        module(x).std().item(), rel=5e-3
    )  # 3 significant digits
    assert bwd is not None and 0.8 < bwd < 1.2  # unit-normal default gradient
    weight_fwd, weight_bwd = _stds(_line(code, "self.weight"))
    assert weight_fwd == pytest.approx(module.weight.std().item(), rel=5e-3)
    assert weight_bwd is not None
    # annotations line up in one column
    columns = {line.index("(->") for line in code.splitlines() if "(->" in line}
    assert len(columns) == 1


def test_uses_the_given_gradient() -> None:
    module, x = nn.Linear(8, 8, bias=False), torch.randn(4, 8)
    code = analyse_module(module, x, backward=torch.full((4, 8), 3.0))
    _, bwd = _stds(_line(code, "linear ="))
    assert bwd == 0  # a constant gradient has zero std


class _Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: Tensor, scale: Tensor) -> Tensor:
        return (x + torch.relu(self.fc(x)) * scale).sum()


def test_renders_operators_and_several_inputs() -> None:
    x, scale = torch.randn(4, 8), torch.tensor(2.0)
    code = analyse_module(_Residual(), (x, scale))
    assert code.splitlines()[0] == "def forward(x, scale):"
    assert re.search(r"= x \+ \w+", code)
    assert re.search(r"= \w+ \* scale", code)
    assert "F.linear(x, self.fc.weight, self.fc.bias)" in code
    assert "torch.relu(" in code
    # a one-element output gets gradient 1, so the input gradient is deterministic
    assert x.grad is not None


def test_unit_scaled_module_reads_close_to_one() -> None:
    torch.manual_seed(0)
    model = unit_scale(nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)))
    code = analyse_module(model, torch.randn(512, 64))
    for line in code.splitlines():
        if " = U." in line:
            fwd, bwd = _stds(line)
            assert 0.5 < fwd < 2 and bwd is not None and 0.5 < bwd < 2, line


class _Counts(nn.Module):
    def forward(self, ids: Tensor) -> Tensor:
        return ids.float() * 2


def test_no_backward_when_output_needs_no_grad() -> None:
    code = analyse_module(_Counts(), torch.arange(6))
    assert "(-> " in code and "<-" not in code
    with pytest.raises(ValueError, match="does not require grad"):
        analyse_module(_Counts(), torch.arange(6), backward=torch.ones(6))


def test_gradient_count_must_match_outputs() -> None:
    with pytest.raises(ValueError, match="one gradient per tensor"):
        analyse_module(
            nn.Linear(4, 4), torch.randn(2, 4), backward=(torch.ones(2, 4),) * 2
        )


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.fc = nn.Linear(8, 8)

    def forward(self, x: Tensor) -> Tensor:
        return x + torch.relu(self.fc(self.norm(x)))


class _Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_Block(), _Block()])
        self.head = nn.Linear(8, 2)

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x) * 2
        return self.head(x)


def test_recurse_modules_false_shows_one_line_per_submodule_call() -> None:
    torch.manual_seed(0)
    model, x = _Stack(), torch.randn(4, 8)
    deep = analyse_module(model, x)
    shallow = analyse_module(model, x, recurse_modules=False)
    assert "F.layer_norm" in deep and "self.layers.0.fc.weight" in deep
    assert "F.layer_norm" not in shallow and ".weight" not in shallow
    assert shallow.splitlines()[0] == "def forward(x):"
    first = _line(shallow, "add = self.layers[0](x)")
    _line(shallow, "add_1 = self.layers[1](x)")  # reads the rebound x
    head = _line(shallow, "linear_2 = self.head(x_1)")
    # a call is annotated with the scale of the module's output
    fwd, bwd = _stds(first)
    with torch.no_grad():
        expected = model.layers[0](x).std().item()
    assert fwd == pytest.approx(expected, rel=5e-3) and bwd is not None
    assert _stds(head)[0] == pytest.approx(_stds(_line(deep, "linear_2 ="))[0])
    assert len(shallow.splitlines()) < len(deep.splitlines())


def test_recurse_modules_false_on_a_unit_scaled_model() -> None:
    shallow = analyse_module(
        unit_scale(_Stack()), torch.randn(4, 8), recurse_modules=False
    )
    assert "self.layers[0](" in shallow and "self.head(" in shallow
    assert ".weight" not in shallow  # parameters (and their scaling) are inside


def test_syntax_highlight_colours_with_pygments() -> None:
    pytest.importorskip("pygments")
    x, scale = torch.randn(4, 8), torch.tensor(2.0)
    plain = analyse_module(_Residual(), (x, scale))
    coloured = analyse_module(_Residual(), (x, scale), syntax_highlight=True)
    assert "\x1b[" in coloured and "\x1b[" not in plain
    assert (
        re.sub(r"\x1b\[[0-9;]*m", "", coloured).split("(->")[0] == plain.split("(->")[0]
    )


def test_syntax_highlight_without_pygments_returns_plain_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pygments", None)  # import fails
    with pytest.warns(UserWarning, match="pygments"):
        code = analyse_module(
            _Residual(), (torch.randn(4, 8), torch.tensor(2.0)), syntax_highlight=True
        )
    assert "\x1b[" not in code and code.startswith("def forward(")
