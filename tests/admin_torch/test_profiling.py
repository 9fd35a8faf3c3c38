"""Tests for profiling-based Admin (admin_torch.profile_init)."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from torch import Tensor, nn

import admin_torch
from admin_torch import OmegaResidual, profile_init

DIM = 16


def _pattern(shape: torch.Size) -> Tensor:
    """Alternating ±1: mean 0 and population variance exactly 1."""
    return (torch.arange(math.prod(shape)) % 2 * 2 - 1).float().reshape(shape)


class ConstantBranch(nn.Module):
    """A branch whose output variance is exactly ``scale**2``, whatever its input."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, x: Tensor) -> Tensor:
        return self.scale * _pattern(x.shape)


class PostLNBlock(nn.Module):
    def __init__(self, branch: nn.Module, as_parameter: bool = False) -> None:
        super().__init__()
        self.branch = branch
        self.residual = admin_torch.as_module(
            6, as_parameter=as_parameter, embed_dim=DIM
        )
        self.norm = nn.LayerNorm(DIM)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(self.residual(x, self.branch(x)))


def constant_stack(*scales: float, as_parameter: bool = False) -> nn.Sequential:
    return nn.Sequential(
        *[PostLNBlock(ConstantBranch(s), as_parameter) for s in scales]
    )


def omegas_of(model: nn.Module) -> list[float]:
    return [
        m.omega.mean().item() for m in model.modules() if isinstance(m, OmegaResidual)
    ]


def test_omegas_from_hand_computed_variances() -> None:
    # Var[x_0] = 4; branch variances 1, 4, 9:
    # omega_1 = sqrt(4) = 2, omega_2 = sqrt(4 + 1), omega_3 = sqrt(4 + 1 + 4) = 3
    model = constant_stack(1.0, 2.0, 3.0)
    x0 = 2 * _pattern(torch.Size([8, DIM]))
    omegas = profile_init(model, x0)
    expected = [2.0, math.sqrt(5.0), 3.0]
    assert list(omegas) == ["0.residual", "1.residual", "2.residual"]
    assert list(omegas.values()) == pytest.approx(expected, rel=1e-6)
    assert omegas_of(model) == pytest.approx(expected, rel=1e-6)


def test_trainable_vector_omegas_are_filled() -> None:
    model = constant_stack(1.0, 2.0, as_parameter=True)
    profile_init(model, 2 * _pattern(torch.Size([4, DIM])))
    second = model[1].residual.omega
    assert isinstance(second, nn.Parameter) and second.requires_grad
    torch.testing.assert_close(second, torch.full((DIM,), math.sqrt(5.0)))


def test_execution_order_not_definition_order() -> None:
    class Reordered(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.late = PostLNBlock(ConstantBranch(3.0))
            self.early = PostLNBlock(ConstantBranch(1.0))
            self.middle = PostLNBlock(ConstantBranch(2.0))

        def forward(self, x: Tensor) -> Tensor:
            return self.late(self.middle(self.early(x)))

    model = Reordered()
    omegas = profile_init(model, (2 * _pattern(torch.Size([4, DIM])),))
    assert list(omegas) == ["early.residual", "middle.residual", "late.residual"]
    assert model.early.residual.omega.item() == pytest.approx(2.0)
    assert model.middle.residual.omega.item() == pytest.approx(math.sqrt(5.0))
    assert model.late.residual.omega.item() == pytest.approx(3.0)


class EncoderDecoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = constant_stack(1.0, 2.0)
        self.decoder = constant_stack(3.0, 1.0)

    def forward(self, src: Tensor, tgt: Tensor, *, scale: float = 1.0) -> Tensor:
        memory = self.encoder(src)
        return self.decoder(tgt * scale + 0 * memory)


def test_encoder_decoder_stacks_accumulate_separately() -> None:
    model = EncoderDecoder()
    src = 2 * _pattern(torch.Size([4, DIM]))  # variance 4
    tgt = 4 * _pattern(torch.Size([4, DIM]))  # variance 16
    omegas = profile_init(model, (src, tgt), stacks=[model.encoder, model.decoder])
    expected = [2.0, math.sqrt(5.0), 4.0, 5.0]  # decoder: sqrt(16), sqrt(16 + 9)
    assert list(omegas.values()) == pytest.approx(expected, rel=1e-6)
    # one stack (the default): the decoder continues the encoder's sum, 4 + 1 + 4
    omegas = profile_init(model, (src, tgt))
    expected = [2.0, math.sqrt(5.0), 3.0, math.sqrt(18.0)]
    assert list(omegas.values()) == pytest.approx(expected, rel=1e-6)


def test_keyword_inputs_and_keyword_residual_calls() -> None:
    class KeywordBlock(PostLNBlock):
        def forward(self, x: Tensor) -> Tensor:
            return self.norm(self.residual(x=x, f_x=self.branch(x)))

    model = EncoderDecoder()
    model.decoder[0] = KeywordBlock(ConstantBranch(3.0))
    src = 2 * _pattern(torch.Size([4, DIM]))
    tgt = _pattern(torch.Size([4, DIM]))
    omegas = profile_init(
        model, (src,), {"tgt": tgt, "scale": 4.0}, stacks=[model.encoder, model.decoder]
    )
    assert omegas["decoder.0.residual"] == pytest.approx(4.0)
    assert omegas["decoder.1.residual"] == pytest.approx(5.0)


class TinyPostLN(nn.Module):
    """A real Post-LN encoder (attention, dropout, batch norm) built with as_module."""

    def __init__(self, layers: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, DIM)
        self.attn = nn.ModuleList(
            nn.MultiheadAttention(DIM, 2, dropout=0.1, batch_first=True)
            for _ in range(layers)
        )
        self.ffn = nn.ModuleList(
            nn.Sequential(
                nn.Linear(DIM, 4 * DIM),
                nn.ReLU(),
                nn.Dropout(0.1),
                nn.Linear(4 * DIM, DIM),
            )
            for _ in range(layers)
        )
        self.bn = nn.BatchNorm1d(DIM)
        self.res_attn = nn.ModuleList(
            admin_torch.as_module(2 * layers) for _ in range(layers)
        )
        self.res_ffn = nn.ModuleList(
            admin_torch.as_module(2 * layers) for _ in range(layers)
        )
        self.ln_attn = nn.ModuleList(nn.LayerNorm(DIM) for _ in range(layers))
        self.ln_ffn = nn.ModuleList(nn.LayerNorm(DIM) for _ in range(layers))

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.embed(tokens)
        x = self.bn(x.transpose(1, 2)).transpose(1, 2)
        for i in range(len(self.attn)):
            f_x, _ = self.attn[i](x, x, x, need_weights=False)
            x = self.ln_attn[i](self.res_attn[i](x, f_x))
            x = self.ln_ffn[i](self.res_ffn[i](x, self.ffn[i](x)))
        return x


def tokens(seed: int = 0) -> Tensor:
    return torch.randint(32, (4, 10), generator=torch.Generator().manual_seed(seed))


def test_only_omegas_change_and_training_mode_is_restored() -> None:
    torch.manual_seed(0)
    model = TinyPostLN().train()
    model.ffn[1].eval()  # a mixed mode must come back exactly
    modes = {name: m.training for name, m in model.named_modules()}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    omegas = profile_init(model, tokens())
    after = model.state_dict()
    assert set(after) == set(before)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed == {f"{name}.omega" for name in omegas}
    assert {name: m.training for name, m in model.named_modules()} == modes
    assert all(not m._forward_hooks for m in model.modules())


def test_real_model_omegas_and_finite_outputs() -> None:
    torch.manual_seed(0)
    model = TinyPostLN(layers=4)
    omegas = list(profile_init(model, tokens()).values())
    assert len(omegas) == 8
    assert omegas[0] == pytest.approx(1.0, abs=0.05)  # batch-normed embedding
    assert omegas == sorted(omegas)  # variance only accumulates
    out = model(tokens(1))
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert all(
        torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None
    )


def test_profiling_is_deterministic() -> None:
    torch.manual_seed(0)
    model = TinyPostLN()
    first = profile_init(model, tokens())
    second = profile_init(model, tokens())  # resets omegas to 1 before measuring
    assert first == second
    torch.manual_seed(0)
    assert profile_init(TinyPostLN(), tokens()) == first


def test_omegas_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="admin_torch.profiling"):
        profile_init(constant_stack(1.0, 2.0), 2 * _pattern(torch.Size([4, DIM])))
    assert "1.residual" in caplog.text and "omega=2.236" in caplog.text


def test_non_module_model() -> None:
    with pytest.raises(TypeError, match=r"model must be an nn\.Module"):
        profile_init(lambda x: x, torch.zeros(2))  # type: ignore[arg-type]


def test_model_without_omega_residual() -> None:
    with pytest.raises(ValueError, match="Linear has no OmegaResidual"):
        profile_init(nn.Linear(4, 4), torch.zeros(2, 4))


def test_residual_used_twice_is_an_error_and_restores_omegas() -> None:
    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.branch = ConstantBranch(1.0)
            self.residual = admin_torch.as_module(4)

        def forward(self, x: Tensor) -> Tensor:
            x = self.residual(x, self.branch(x))
            return self.residual(x, self.branch(x))

    model = Shared()
    with pytest.raises(ValueError, match=r"\['residual'\] ran more than once"):
        profile_init(model, torch.randn(2, DIM))
    assert model.residual.omega.item() == pytest.approx(admin_torch.calculate_init(4))


def test_batch_that_misses_a_residual() -> None:
    class Skipping(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = constant_stack(1.0, 2.0, 3.0)

        def forward(self, x: Tensor, depth: int = 3) -> Tensor:
            for block in self.blocks[:depth]:
                x = block(x)
            return x

    model = Skipping()
    with pytest.raises(
        ValueError, match=r"did not reach OmegaResidual modules \['blocks.2.residual'\]"
    ):
        profile_init(model, torch.randn(2, DIM), {"depth": 2})
    assert omegas_of(model) == pytest.approx([admin_torch.calculate_init(6)] * 3)


def test_failing_forward_restores_everything() -> None:
    model = constant_stack(1.0, 2.0).train()
    with pytest.raises(RuntimeError):
        profile_init(model, torch.randn(2, DIM + 1))
    assert model.training
    assert omegas_of(model) == pytest.approx([admin_torch.calculate_init(6)] * 2)
    assert all(not m._forward_hooks for m in model.modules())


def test_stack_errors() -> None:
    model = EncoderDecoder()
    args = (torch.randn(2, DIM), torch.randn(2, DIM))
    with pytest.raises(ValueError, match="in none of the given stacks"):
        profile_init(model, args, stacks=[model.encoder])
    with pytest.raises(ValueError, match="do not overlap"):
        profile_init(model, args, stacks=[model, model.decoder])
    with pytest.raises(TypeError, match=r"stacks\[1\] must be an nn\.Module"):
        profile_init(model, args, stacks=[model.encoder, "decoder"])  # type: ignore[list-item]


def test_degenerate_variances() -> None:
    with pytest.raises(ValueError, match="zero variance"):
        profile_init(constant_stack(1.0), torch.zeros(2, DIM))
    nan_input = torch.full((2, DIM), float("nan"))
    with pytest.raises(ValueError, match="non-finite"):
        profile_init(constant_stack(1.0), nan_input)
