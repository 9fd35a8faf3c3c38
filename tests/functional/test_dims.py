"""``for_dims``: the per-dimension functions made from one rule are ordinary,
fully described functions of the rule's module."""

from __future__ import annotations

import doctest
import inspect
import pickle
from pathlib import Path
from string import Template
from types import ModuleType

import griffe
import pytest
import torch
from torch import Tensor

import unit_scaling.functional as U
from unit_scaling.functional import conv, pooling
from unit_scaling.functional._dims import axis_names, for_dims

MADE: dict[ModuleType, tuple[str, ...]] = {
    conv: ("conv1d", "conv2d", "conv3d"),
    pooling: ("max_pool1d", "max_pool2d", "max_pool3d", "avg_pool2d", "avg_pool3d"),
}


def _rule(n: int, x: Tensor, k: int = 2, *, shift: float = 0.0) -> Tensor:
    """A toy rule."""
    return x * n + k + shift


def test_the_rule_runs_with_its_dims_fixed() -> None:
    made = for_dims(_rule, 3, Template("$name over $axes"))
    x = torch.ones(2)
    assert torch.equal(made(x), x * 3 + 2)
    assert torch.equal(made(x, 5, shift=1.0), x * 3 + 6)
    with pytest.raises(TypeError):
        made(x, n=3)  # type: ignore[call-arg]


def test_a_wrong_call_is_reported_against_the_made_function() -> None:
    x, w = torch.randn(2, 4, 8, 8), torch.randn(8, 4, 3, 3)
    with pytest.raises(
        TypeError, match=r"^conv2d\(\): got an unexpected keyword argument 'strid'"
    ):
        U.conv2d(x, w, strid=2)  # type: ignore[call-arg]
    with pytest.raises(
        TypeError, match=r"^max_pool2d\(\): missing a required argument: 'kernel_size'"
    ):
        U.max_pool2d(x)  # type: ignore[call-arg]
    with pytest.raises(
        TypeError, match=r"^conv3d\(\): got an unexpected keyword argument 'n'"
    ):
        U.conv3d(x, w, n=3)  # type: ignore[call-arg]
    # a TypeError from inside the rule is the rule's own
    with pytest.raises(TypeError, match="unsupported operand"):
        for_dims(_rule, 1, Template("$name"))(torch.ones(2), k=None)  # type: ignore[arg-type]


def test_a_made_function_is_named_documented_and_signed_as_torch_names_it() -> None:
    made = for_dims(_rule, 2, Template("$name over $axes, kernel $kernel_numel"))
    assert made.__name__ == made.__qualname__ == "rule2d"
    assert made.__module__ == __name__
    assert made.__code__.co_name == "rule2d"
    assert made.__doc__ == "rule2d over H, W, kernel kH·kW"
    assert list(inspect.signature(made).parameters) == ["x", "k", "shift"]
    assert "n" not in made.__annotations__


def test_axis_names() -> None:
    assert axis_names(1)["kernel_numel"] == "kL"
    assert axis_names(3)["axes"] == "D, H, W"
    assert axis_names(3)["axes_out_numel"] == "D_out·H_out·W_out"


@pytest.mark.parametrize("module", list(MADE), ids=lambda m: m.__name__)
def test_the_made_ops_belong_to_their_module(module: ModuleType) -> None:
    tests = {t.name.rsplit(".", 1)[-1] for t in doctest.DocTestFinder().find(module)}
    for name in MADE[module]:
        op = getattr(U, name)
        assert op.__module__ == module.__name__
        assert name in tests, f"doctest does not find {name}'s example"
        assert pickle.loads(pickle.dumps(op)) is op
        assert f"torch.nn.functional.{name}`" in op.__doc__
        assert "$" not in op.__doc__


def test_the_api_reference_sees_each_made_op_as_a_documented_function() -> None:
    extension = Path(__file__).parents[2] / "docs" / "_ext" / "made_functions.py"
    package = griffe.load(
        "unit_scaling.functional",
        extensions=griffe.load_extensions(str(extension)),
    )
    for module in MADE:
        for name in MADE[module]:
            found = package[f"{module.__name__.rsplit('.', 1)[-1]}.{name}"]
            assert isinstance(found, griffe.Function), name
            assert found.docstring is not None
            assert [p.name for p in found.parameters][:2] in (
                ["input", "weight"],
                ["input", "kernel_size"],
            )
