"""Tests for OmegaResidual, the rescaled residual connection."""

from __future__ import annotations

import copy

import pytest
import torch

from admin_torch import OmegaResidual


def test_omega_one_is_the_plain_residual() -> None:
    x, f_x = torch.randn(4, 7, 16), torch.randn(4, 7, 16)
    assert torch.equal(OmegaResidual(1.0)(x, f_x), x + f_x)
    trainable = OmegaResidual(1.0, as_parameter=True, embed_dim=16)
    assert torch.equal(trainable(x, f_x), x + f_x)


@pytest.mark.parametrize("omega", [0.5, 2.0, 3.7])
def test_forward_is_x_times_omega_plus_f_x(omega: float) -> None:
    x, f_x = torch.randn(3, 5), torch.randn(3, 5)
    torch.testing.assert_close(OmegaResidual(omega)(x, f_x), x * omega + f_x)
    torch.testing.assert_close(OmegaResidual(omega)(x=x, f_x=f_x), x * omega + f_x)


def test_buffer_omega_is_a_named_scalar_buffer() -> None:
    residual = OmegaResidual(2.5)
    assert dict(residual.named_buffers()).keys() == {"omega"}
    assert list(residual.parameters()) == []
    assert residual.state_dict()["omega"].shape == ()
    assert residual.omega.item() == 2.5


def test_parameter_omega_is_a_vector_over_the_last_dim() -> None:
    residual = OmegaResidual(2.0, as_parameter=True, embed_dim=3)
    assert [name for name, _ in residual.named_parameters()] == ["omega"]
    with torch.no_grad():
        residual.omega.copy_(torch.tensor([1.0, 2.0, 3.0]))
    out = residual(torch.ones(2, 3), torch.zeros(2, 3))
    assert torch.equal(out, torch.tensor([[1.0, 2.0, 3.0]] * 2))


def test_gradients_flow_to_a_trainable_omega() -> None:
    residual = OmegaResidual(1.5, as_parameter=True, embed_dim=4)
    x = torch.randn(2, 3, 4, requires_grad=True)
    f_x = torch.randn(2, 3, 4, requires_grad=True)
    grad = torch.randn(2, 3, 4)
    residual(x, f_x).backward(grad)
    assert residual.omega.grad is not None
    torch.testing.assert_close(residual.omega.grad, (x * grad).sum(dim=(0, 1)))
    torch.testing.assert_close(x.grad, grad * 1.5)
    torch.testing.assert_close(f_x.grad, grad)


def test_buffer_omega_scales_the_shortcut_gradient() -> None:
    x = torch.randn(5, requires_grad=True)
    OmegaResidual(3.0)(x, torch.zeros(5)).sum().backward()
    assert torch.equal(x.grad, torch.full((5,), 3.0))


def test_follows_module_conversions() -> None:
    residual = OmegaResidual(2.0)
    half = copy.deepcopy(residual).to(torch.float64)
    assert half.omega.dtype == torch.float64
    x = torch.randn(3, dtype=torch.bfloat16)
    assert residual(x, x).dtype == torch.bfloat16  # a 0-dim omega keeps x's dtype


def test_extra_repr() -> None:
    assert repr(OmegaResidual(2.0)) == "OmegaResidual(omega=2)"
    trainable = OmegaResidual(1.5, as_parameter=True, embed_dim=8)
    assert repr(trainable) == "OmegaResidual(embed_dim=8, omega_mean=1.5, trainable)"
    with torch.device("meta"):
        assert "omega_shape=()" in repr(OmegaResidual(2.0))


def test_embed_dim_is_ignored_for_a_buffer() -> None:
    assert OmegaResidual(2.0, embed_dim=16).omega.shape == ()


def test_errors() -> None:
    with pytest.raises(ValueError, match="embed_dim is required"):
        OmegaResidual(1.0, as_parameter=True)
    with pytest.raises(TypeError, match="embed_dim must be an int"):
        OmegaResidual(1.0, as_parameter=True, embed_dim=4.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="embed_dim must be positive"):
        OmegaResidual(1.0, as_parameter=True, embed_dim=-2)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="init_value must be finite and positive"):
            OmegaResidual(bad)
    with pytest.raises(TypeError, match="init_value must be a float"):
        OmegaResidual(torch.tensor(1.0))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        OmegaResidual(1.0)(torch.zeros(2))  # type: ignore[call-arg]


def test_omega_is_module_state() -> None:
    # A fixed omega is a buffer, a trainable one a parameter: both are saved,
    # loaded and converted with the module, and only the parameter is trained.
    fixed = OmegaResidual(3.0)
    trained = OmegaResidual(3.0, as_parameter=True, embed_dim=4)
    assert list(fixed.state_dict()) == ["omega"] and not list(fixed.parameters())
    assert [p is trained.omega for p in trained.parameters()] == [True]
    fixed.double()
    assert fixed.omega.dtype == torch.float64
    copy = OmegaResidual(1.0)
    copy.load_state_dict(fixed.state_dict())
    assert copy.omega.item() == 3.0
    x, f_x = torch.randn(2, 4), torch.randn(2, 4)
    torch.testing.assert_close(copy(x.double(), f_x.double()), 3 * x.double() + f_x)
