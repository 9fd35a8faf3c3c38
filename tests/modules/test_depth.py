"""Tests for the depth containers ``DepthModuleList`` and ``DepthSequential``.

Every tagged parameter inside must carry ``mup_scaling_depth == len(container)``
after construction and after every mutation, and an untagged parameter must be
rejected with a ``ValueError`` naming it.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import unit_scaling as uu

CONTAINERS = [
    pytest.param(lambda *ms: uu.DepthModuleList(ms), id="DepthModuleList"),
    pytest.param(lambda *ms: uu.DepthSequential(*ms), id="DepthSequential"),
]


def _block() -> nn.Module:
    return uu.MLP(4, expansion_factor=1)


def _depths(container: nn.Module) -> set[int | None]:
    return {p.mup_scaling_depth for p in container.parameters()}


def _assert_depth(container: nn.Module) -> None:
    assert _depths(container) == {len(container)}


@pytest.mark.parametrize("make", CONTAINERS)
def test_sets_depth_on_construction(make) -> None:
    container = make(*(_block() for _ in range(3)))
    assert len(list(container.parameters())) == 9
    _assert_depth(container)
    assert _depths(container) == {3}


@pytest.mark.parametrize("make", CONTAINERS)
def test_depth_follows_mutations(make) -> None:
    container = make(_block(), _block())
    container.append(_block())
    _assert_depth(container)
    container.extend([_block(), _block()])
    _assert_depth(container)
    container.insert(1, _block())
    _assert_depth(container)
    assert len(container) == 6
    del container[0]
    _assert_depth(container)
    del container[1:3]
    _assert_depth(container)
    assert len(container) == 3
    container.pop(0)
    _assert_depth(container)
    assert len(container) == 2
    new = _block()
    container[1] = new
    _assert_depth(container)
    assert new.linear_1.weight.mup_scaling_depth == 2


def test_module_list_iadd_updates_depth() -> None:
    container = uu.DepthModuleList([_block()])
    container += [_block(), _block()]
    _assert_depth(container)


def test_sequential_iadd_and_imul_update_depth() -> None:
    container = uu.DepthSequential(_block())
    container += uu.DepthSequential(_block())
    _assert_depth(container)
    container *= 2
    _assert_depth(container)


def test_tags_only_depth_not_type() -> None:
    stack = uu.DepthSequential(uu.Linear(4, 4, bias=True), uu.RMSNorm(4, None, True))
    tags = {n: (p.mup_type, p.mup_scaling_depth) for n, p in stack.named_parameters()}
    assert tags == {
        "0.weight": ("weight", 2),
        "0.bias": ("bias", 2),
        "1.weight": ("norm", 2),
    }


def test_accepts_hand_made_parameters() -> None:
    block = nn.Module()
    block.scale = uu.Parameter(torch.ones(3), mup_type="norm")
    uu.DepthModuleList([block, _block()])
    assert block.scale.mup_scaling_depth == 2


@pytest.mark.parametrize("make", CONTAINERS)
def test_rejects_untagged_parameter_at_construction(make) -> None:
    with pytest.raises(ValueError, match=r"'1\.bias'|'1\.weight'"):
        make(_block(), nn.Linear(4, 4))


@pytest.mark.parametrize("make", CONTAINERS)
def test_rejects_untagged_parameter_when_mutated(make) -> None:
    container = make(_block())
    with pytest.raises(ValueError, match=r"'1\.weight'"):
        container.append(nn.Linear(4, 4, bias=False))
    container = make(_block())
    with pytest.raises(ValueError, match=r"'0\.weight'"):
        container.insert(0, nn.LayerNorm(4, bias=False))
    container = make(_block())
    nested = nn.Sequential(uu.Linear(4, 4), nn.Linear(4, 4, bias=False))
    with pytest.raises(ValueError, match=r"'0\.1\.weight'"):
        container[0] = nested


@pytest.mark.parametrize("make", CONTAINERS)
def test_rejected_module_is_not_added(make) -> None:
    container = make(_block())
    with pytest.raises(ValueError):
        container.append(nn.Linear(4, 4))
    assert len(container) == 1


def test_works_as_its_torch_base() -> None:
    x = torch.randn(2, 4)
    seq = uu.DepthSequential(uu.Linear(4, 4), uu.Linear(4, 4))
    torch.testing.assert_close(seq(x), seq[1](seq[0](x)))
    assert isinstance(seq, nn.Sequential)
    assert isinstance(uu.DepthModuleList(), nn.ModuleList)
