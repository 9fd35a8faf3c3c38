"""Tagged parameters: validation, and tags surviving copies, saves and compile."""

from __future__ import annotations

import copy
import io
import pickle
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from unit_scaling.parameter import (
    TAG_NAMES,
    MupTags,
    Parameter,
    ParameterData,
    _rebuild_parameter,
    has_parameter_data,
    retag,
    tags_of,
)


class _Affine(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = Parameter(torch.randn(4, 3), "weight", 2)
        self.bias = Parameter(torch.zeros(4), "bias")
        # stored (in, out) and used as h @ W: every tag set, the fan-in too
        self.proj = Parameter(torch.randn(4, 6), "weight", 2, mup_fan_in=4)

    def forward(self, x: Tensor) -> Tensor:
        # Reads a tag in forward, so compile must see it as a constant attribute.
        depth = self.weight.mup_scaling_depth or 1
        return ((x @ self.weight.t() + self.bias) / depth) @ self.proj


def _tags(module: nn.Module) -> dict[str, tuple[Any, ...]]:
    """Every tag (``TAG_NAMES``: a tag added later is compared too) and the class."""
    return {
        name: (type(p), *(getattr(p, tag, None) for tag in TAG_NAMES))
        for name, p in module.named_parameters()
    }


EXPECTED = {
    "weight": (Parameter, "weight", 2, None),
    "bias": (Parameter, "bias", None, None),
    "proj": (Parameter, "weight", 2, 4),
}


def test_construction() -> None:
    data = torch.randn(4, 3)
    p = Parameter(data, "weight")
    assert isinstance(p, nn.Parameter)
    assert (p.mup_type, p.mup_scaling_depth, p.requires_grad) == ("weight", None, True)
    assert p.data_ptr() == data.data_ptr()
    frozen = Parameter(torch.zeros(2), "norm", 3, requires_grad=False)
    assert (frozen.mup_scaling_depth, frozen.requires_grad) == (3, False)


def test_invalid_mup_type() -> None:
    with pytest.raises(ValueError, match="mup_type='hidden'"):
        Parameter(torch.zeros(2), "hidden")  # type: ignore[arg-type]


@pytest.mark.parametrize("depth", [0, -1, 1.5, True, "2"])
def test_invalid_depth(depth: Any) -> None:
    with pytest.raises(ValueError, match="mup_scaling_depth="):
        Parameter(torch.zeros(2), "bias", depth)


@pytest.mark.parametrize("fan_in", [0, -1, 1.5, True, "2"])
def test_invalid_fan_in(fan_in: Any) -> None:
    with pytest.raises(ValueError, match="mup_fan_in="):
        Parameter(torch.zeros(2, 2), "weight", mup_fan_in=fan_in)
    with pytest.raises(ValueError, match="mup_fan_in="):
        retag(nn.Parameter(torch.zeros(2, 2)), "weight", None, fan_in)


def test_tags_of_reads_every_tag_and_defaults_a_missing_fan_in() -> None:
    p = Parameter(torch.zeros(8, 4), "weight", 3, mup_fan_in=8)
    assert tags_of(p) == MupTags("weight", 3, 8)
    assert MupTags._fields == TAG_NAMES  # the tuple and the attributes agree
    by_hand = torch.zeros(2)
    by_hand.mup_type = "bias"  # type: ignore[attr-defined]
    by_hand.mup_scaling_depth = 2  # type: ignore[attr-defined]
    assert tags_of(by_hand) == MupTags("bias", 2, None)
    assert tags_of(nn.Parameter(torch.zeros(2))) is None


def test_a_parameter_pickled_before_the_fan_in_tag_loads() -> None:
    # what a pickle of the two-tag Parameter calls: no fan-in argument
    old = _rebuild_parameter(torch.zeros(3, 2), True, "weight", 2, {"note": 1})
    assert tags_of(old) == MupTags("weight", 2, None) and old.note == 1
    bare = torch.zeros(2, 2)
    bare.__class__ = Parameter  # an object that never ran __new__
    assert bare.mup_fan_in is None  # the class default


def test_non_tensor_data() -> None:
    with pytest.raises(TypeError, match=r"data must be a torch\.Tensor, got list"):
        Parameter([1.0, 2.0], "bias")  # type: ignore[arg-type]


def test_has_parameter_data() -> None:
    assert has_parameter_data(Parameter(torch.zeros(2), "bias"))
    assert not has_parameter_data(nn.Parameter(torch.zeros(2)))
    assert not has_parameter_data(torch.zeros(2))
    by_hand = torch.zeros(2)
    by_hand.mup_type = "norm"  # type: ignore[attr-defined]
    by_hand.mup_scaling_depth = None  # type: ignore[attr-defined]
    assert has_parameter_data(by_hand)
    by_hand.mup_type = "gain"  # type: ignore[assignment]
    assert not has_parameter_data(by_hand)
    assert isinstance(Parameter(torch.zeros(2), "bias"), ParameterData)


def test_repr() -> None:
    p = Parameter(torch.zeros(2), "weight", 4)
    assert repr(p).startswith(
        "Parameter(mup_type='weight', mup_scaling_depth=4) containing:\n"
    )
    assert "tensor([0., 0.])" in repr(p)
    assert "mup_scaling_depth" not in repr(Parameter(torch.zeros(2), "bias"))
    assert "mup_fan_in=8)" in repr(Parameter(torch.zeros(8, 2), "weight", mup_fan_in=8))
    assert "mup_fan_in" not in repr(p)


def test_deepcopy() -> None:
    model = _Affine()
    model.weight.note = "kept"  # type: ignore[attr-defined]
    model.tied = model.weight
    clone = copy.deepcopy(model)
    assert _tags(clone) == EXPECTED
    assert clone.weight.note == "kept"  # type: ignore[attr-defined]
    assert clone.tied is clone.weight
    assert clone.weight.data_ptr() != model.weight.data_ptr()
    torch.testing.assert_close(clone.weight, model.weight)


def test_pickle() -> None:
    p = Parameter(torch.randn(3), "norm", 5, requires_grad=False)
    p.note = "kept"  # type: ignore[attr-defined]
    q = pickle.loads(pickle.dumps(p))
    assert (type(q), q.mup_type, q.mup_scaling_depth) == (Parameter, "norm", 5)
    assert q.mup_fan_in is None
    assert not q.requires_grad
    assert q.note == "kept"
    torch.testing.assert_close(q, p)
    assert _tags(pickle.loads(pickle.dumps(_Affine()))) == EXPECTED


def _save_load(obj: object, **kwargs: Any) -> Any:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, **kwargs)


def test_torch_save_load_parameter_weights_only() -> None:
    p = Parameter(torch.randn(4, 3), "weight", 3, mup_fan_in=4)
    q = _save_load(p)  # weights_only=True is torch.load's default
    assert (type(q), tags_of(q)) == (Parameter, MupTags("weight", 3, 4))
    assert q.requires_grad
    torch.testing.assert_close(q, p)
    q = _save_load(Parameter(torch.randn(4, 3), "output"), weights_only=True)
    assert q.mup_type == "output"


def test_torch_save_load_module() -> None:
    model = _Affine()
    loaded = _save_load(model, weights_only=False)
    assert _tags(loaded) == EXPECTED
    torch.testing.assert_close(loaded.weight, model.weight)


@pytest.mark.parametrize("swap", [False, True], ids=["copy", "swap"])
def test_load_state_dict_into_tagged_model(swap: bool) -> None:
    source, target = _Affine(), _Affine()
    state = _save_load(source.state_dict())
    old = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(swap)
    try:
        target.load_state_dict(state)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(old)
    assert _tags(target) == EXPECTED
    torch.testing.assert_close(target.weight, source.weight)
    assert target.weight.requires_grad


@pytest.mark.parametrize(
    "convert",
    [lambda m: m.to(torch.float64), lambda m: m.double(), lambda m: m.half()],
    ids=["to(float64)", "double", "half"],
)
def test_dtype_conversion(convert: Any) -> None:
    model = _Affine()
    weight = model.weight
    convert(model)
    assert _tags(model) == EXPECTED
    assert model.weight is weight
    assert model.weight.dtype != torch.float32


def _params(module: nn.Module) -> Iterator[tuple[str, Parameter]]:
    for name, p in module.named_parameters():
        assert isinstance(p, Parameter)
        yield name, p


def test_torch_compile_fullgraph() -> None:
    model = _Affine()
    compiled = torch.compile(model, fullgraph=True)
    assert isinstance(compiled, nn.Module)
    x = torch.randn(5, 3)
    out = compiled(x)
    out.sum().backward()
    torch.testing.assert_close(out, model(x))
    assert model.weight.grad is not None and model.bias.grad is not None
    tags = {name: tags_of(p) for name, p in _params(compiled)}
    assert tags == {
        "_orig_mod.weight": ("weight", 2, None),
        "_orig_mod.bias": ("bias", None, None),
        "_orig_mod.proj": ("weight", 2, 4),
    }
