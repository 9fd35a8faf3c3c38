"""Tests for closed-form Admin: calculate_init, as_module, as_buffer, as_parameter."""

from __future__ import annotations

import doctest
import math

import pytest
import torch
from torch import nn

import admin_torch
import admin_torch.admin


@pytest.mark.parametrize("n", [1, 2, 6, 12, 24, 36, 100])
def test_calculate_init_matches_closed_forms(n: int) -> None:
    logn = math.sqrt((n + 1) / math.log(n + 1) - 1)
    assert admin_torch.calculate_init(n) == pytest.approx(logn, rel=1e-12)
    assert admin_torch.calculate_init(n, "O(logn)") == pytest.approx(logn, rel=1e-12)
    assert admin_torch.calculate_init(n, "default") == pytest.approx(logn, rel=1e-12)
    assert admin_torch.calculate_init(n, "O(n)") == 1.0
    assert admin_torch.calculate_init(n, "O(1)") == pytest.approx(math.sqrt(n))


def test_calculate_init_known_values() -> None:
    # sqrt(25 / ln 25 - 1) for a 12-layer encoder (24 residual branches)
    assert admin_torch.calculate_init(24) == pytest.approx(2.6012855825524)
    assert admin_torch.calculate_init(16, "O(1)") == 4.0


def test_omega_grows_with_depth_and_scale_order() -> None:
    values = [admin_torch.calculate_init(n) for n in (2, 8, 32, 128)]
    assert values == sorted(values)
    for n in (4, 24, 96):
        o_n, o_logn, o_1 = (
            admin_torch.calculate_init(n, s) for s in ("O(n)", "O(logn)", "O(1)")
        )
        assert o_n < o_logn < o_1


@pytest.mark.parametrize("scale", ["O(logn)", "default", "O(n)", "O(1)"])
def test_as_module_uses_calculate_init(scale: str) -> None:
    residual = admin_torch.as_module(12, scale)
    assert isinstance(residual, admin_torch.OmegaResidual)
    expected = admin_torch.calculate_init(12, scale)
    assert residual.omega.item() == pytest.approx(expected)
    assert residual.omega.shape == ()
    assert not residual.omega.requires_grad


def test_as_module_as_parameter() -> None:
    residual = admin_torch.as_module(8, "O(1)", as_parameter=True, embed_dim=5)
    assert isinstance(residual.omega, nn.Parameter)
    assert torch.equal(residual.omega, torch.full((5,), math.sqrt(8)))


def test_as_buffer_registers_a_persistent_buffer() -> None:
    net = nn.Linear(4, 4)
    admin_torch.as_buffer(net, "attn_omega", 12)
    assert "attn_omega" in dict(net.named_buffers())
    assert "attn_omega" in net.state_dict()
    assert "attn_omega" not in dict(net.named_parameters())
    assert net.attn_omega.item() == pytest.approx(admin_torch.calculate_init(12))
    admin_torch.as_buffer(net, "ffn_omega", 12, "O(1)")
    assert net.ffn_omega.item() == pytest.approx(math.sqrt(12))
    # round trip through state_dict
    other = nn.Linear(4, 4)
    admin_torch.as_buffer(other, "attn_omega", 2)
    admin_torch.as_buffer(other, "ffn_omega", 2)
    other.load_state_dict(net.state_dict())
    assert other.attn_omega.item() == pytest.approx(admin_torch.calculate_init(12))


def test_as_parameter_registers_a_trainable_vector() -> None:
    net = nn.Linear(4, 4)
    admin_torch.as_parameter(net, "ffn_omega", 6, 4)
    params = dict(net.named_parameters())
    assert "ffn_omega" in params and "ffn_omega" in net.state_dict()
    assert params["ffn_omega"].shape == (4,) and params["ffn_omega"].requires_grad
    expected = admin_torch.calculate_init(6)
    assert torch.allclose(net.ffn_omega, torch.full((4,), expected))
    admin_torch.as_parameter(net, "attn_omega", 6, 4, output_change_scale="O(n)")
    assert torch.equal(net.attn_omega, torch.ones(4))


def test_module_names_in_state_dict_of_a_model() -> None:
    model = nn.ModuleDict(
        {
            "fixed": admin_torch.as_module(4),
            "trained": admin_torch.as_module(4, as_parameter=True, embed_dim=3),
        }
    )
    assert set(model.state_dict()) == {"fixed.omega", "trained.omega"}
    assert [name for name, _ in model.named_parameters()] == ["trained.omega"]


def test_documented_examples_run() -> None:
    """The corrected admin-torch examples (in the docstrings) run as written."""
    results = doctest.testmod(admin_torch.admin, optionflags=doctest.ELLIPSIS)
    assert results.attempted >= 20 and results.failed == 0
    results = doctest.testmod(admin_torch, optionflags=doctest.ELLIPSIS)
    assert results.failed == 0


def test_documented_example_trains() -> None:
    """A stack of the documented layer (as_parameter variant) takes an Adam step."""
    dim = 8

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = nn.MultiheadAttention(dim, 2)
            admin_torch.as_parameter(self, "attn_omega", 4, dim)
            self.ln_attn = nn.LayerNorm(dim)
            self.ffn = nn.Sequential(
                nn.Linear(dim, 4 * dim), nn.ReLU(), nn.Linear(4 * dim, dim)
            )
            admin_torch.as_parameter(self, "ffn_omega", 4, dim)
            self.ln_ffn = nn.LayerNorm(dim)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            f_x, _ = self.attn(x, x, x)
            x = self.ln_attn(x * self.attn_omega + f_x)
            return self.ln_ffn(x * self.ffn_omega + self.ffn(x))

    torch.manual_seed(0)
    model = nn.Sequential(Layer(), Layer())
    # Admin's initial omega for a 4-layer stack, on every channel
    expected = admin_torch.calculate_init(4)
    torch.testing.assert_close(model[0].attn_omega, torch.full((dim,), expected))
    x, target = torch.randn(5, 3, dim), torch.randn(5, 3, dim)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for _ in range(40):
        opt.zero_grad()
        loss = (model(x) - target).pow(2).mean()
        loss.backward()
        assert model[0].attn_omega.grad is not None
        assert model[0].attn_omega.grad.abs().sum() > 0  # omega is trained
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0], losses


@pytest.mark.parametrize("scale", ["O(log n)", "o(1)", "", "linear"])
def test_unknown_output_change_scale(scale: str) -> None:
    match = r"unknown output_change_scale .*'O\(logn\)', 'default', 'O\(n\)', 'O\(1\)'"
    with pytest.raises(ValueError, match=match):
        admin_torch.calculate_init(4, scale)
    with pytest.raises(ValueError, match="unknown output_change_scale"):
        admin_torch.as_module(4, scale)
    with pytest.raises(ValueError, match="unknown output_change_scale"):
        admin_torch.as_buffer(nn.Linear(1, 1), "omega", 4, scale)
    with pytest.raises(ValueError, match="unknown output_change_scale"):
        admin_torch.as_parameter(nn.Linear(1, 1), "omega", 4, 2, scale)


@pytest.mark.parametrize("n", [0, -1, -24])
def test_non_positive_layer_count(n: int) -> None:
    with pytest.raises(ValueError, match="num_res_layers must be positive"):
        admin_torch.calculate_init(n)
    with pytest.raises(ValueError, match="num_res_layers must be positive"):
        admin_torch.as_module(n)


@pytest.mark.parametrize("n", [2.0, True, "12", None])
def test_non_int_layer_count(n: object) -> None:
    with pytest.raises(TypeError, match="num_res_layers must be an int"):
        admin_torch.calculate_init(n)  # type: ignore[arg-type]


def test_as_parameter_without_embed_dim() -> None:
    with pytest.raises(ValueError, match="embed_dim is required"):
        admin_torch.as_module(4, as_parameter=True)
    with pytest.raises(ValueError, match="embed_dim is required"):
        admin_torch.as_parameter(nn.Linear(1, 1), "omega", 4, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="embed_dim must be positive"):
        admin_torch.as_parameter(nn.Linear(1, 1), "omega", 4, 0)


@pytest.mark.parametrize("network", [None, "model", torch.zeros(2), nn.Linear])
def test_non_module_network(network: object) -> None:
    with pytest.raises(TypeError, match=r"network must be the torch\.nn\.Module"):
        admin_torch.as_buffer(network, "omega", 4)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"network must be the torch\.nn\.Module"):
        admin_torch.as_parameter(network, "omega", 4, 8)  # type: ignore[arg-type]
