"""Block-format recipes: each GEMM of a product quantises its operands along its
own contraction (checked against quantising by hand), and ``simulate_format``
applies a recipe to whole models."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import unit_scaling as uu
from unit_scaling import zoo
from unit_scaling.formats import (
    FP8_E4M3,
    MXFP4,
    MXFP4_RECIPE,
    MXFP6_E3M2,
    MXFP8_E4M3,
    MXFP8_RECIPE,
    NVFP4,
    NVFP4_RECIPE,
    BlockFormat,
    FPFormat,
    Recipe,
    quantised_attention,
    quantised_conv,
    quantised_einsum,
    quantised_linear,
    quantised_matmul,
    random_hadamard,
    recipe_with_rule,
)
from unit_scaling.transforms import compile, simulate_format, track_scales, unit_scale

LOGGER = "unit_scaling.transforms.simulate_format"
DEFAULT_RUN = {
    "test_linear_gemms_exact",
    "test_matmul_gemms_exact",
    "test_incoming_gradient_quantised",
    "test_bias_stays_in_high_precision",
    "test_hadamard_is_orthogonal",
    "test_hadamard_cancels_in_the_weight_gradient",
    "test_einsum_is_the_matmul",
    "test_attention_without_formats_is_torch",
    "test_attention_is_quantised",
    "test_recipe_keeps_listed_layers",
    "test_recipe_keeps_last_blocks",
    "test_recipe_keeps_the_output_head",
    "test_recipe_on_unit_scaled_mlp[MXFP8]",
    "test_recipe_composes_with_unit_scale",
    "test_zoo_gpt2[MXFP8]",
    "test_bad_recipes_raise",
    "test_conv_gemms_exact[2]",
    "test_conv_transpose_gemms_exact",
    "test_recipe_quantises_convolutions",
    "test_einsum_of_three_operands_warns",
}

# Different formats in the six places, so an operand quantised along the wrong
# axis or in the wrong GEMM gives different values.
_F1, _F2, _F3 = (dataclasses.replace(MXFP4, block_size=b) for b in (4, 8, 2))
_F4, _F5, _F6 = (
    dataclasses.replace(MXFP8_E4M3, block_size=4),
    dataclasses.replace(MXFP6_E3M2, block_size=2),
    dataclasses.replace(MXFP4, block_size=16),
)
DISTINCT = Recipe(forward=(_F1, _F2), grad_input=(_F3, _F4), grad_weight=(_F5, _F6))
NONE = Recipe(forward=(None, None), grad_input=(None, None), grad_weight=(None, None))


def _randn(*shape: int, seed: int = 0) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_linear_gemms_exact() -> None:
    x = _randn(3, 8, 32).requires_grad_()
    w = _randn(16, 32, seed=1).requires_grad_()
    grad = _randn(3, 8, 16, seed=2)
    y = quantised_linear(x, w, recipe=DISTINCT)
    y.backward(grad)
    xd, wd, tokens = x.detach(), w.detach(), x.detach().reshape(24, 32)
    torch.testing.assert_close(
        y, F.linear(_F1.quantise(xd, -1), _F2.quantise(wd, -1)), rtol=0, atol=0
    )
    dx = _F3.quantise(grad, -1) @ _F4.quantise(wd, 0)
    torch.testing.assert_close(x.grad, dx, rtol=0, atol=0)
    # the weight gradient contracts every token, the batch axis included
    dw = _F5.quantise(grad.reshape(24, 16), 0).T @ _F6.quantise(tokens, 0)
    torch.testing.assert_close(w.grad, dw, rtol=0, atol=0)


def test_matmul_gemms_exact() -> None:
    a = _randn(2, 8, 32).requires_grad_()
    b = _randn(2, 32, 16, seed=1).requires_grad_()
    grad = _randn(2, 8, 16, seed=2)
    y = quantised_matmul(a, b, recipe=DISTINCT, matmul=torch.bmm)
    y.backward(grad)
    ad, bd = a.detach(), b.detach()
    torch.testing.assert_close(
        y, _F1.quantise(ad, -1) @ _F2.quantise(bd, -2), rtol=0, atol=0
    )
    da = _F3.quantise(grad, -1) @ _F4.quantise(bd, -1).transpose(1, 2)
    torch.testing.assert_close(a.grad, da, rtol=0, atol=0)
    db = _F6.quantise(ad, -2).transpose(1, 2) @ _F5.quantise(grad, -2)
    torch.testing.assert_close(b.grad, db, rtol=0, atol=0)


def test_incoming_gradient_quantised() -> None:
    # Only the incoming gradient of the input-gradient GEMM is quantised: the
    # input gradient is Q(dy) W, not dy W.
    recipe = dataclasses.replace(NONE, grad_input=(MXFP4, None))
    x = _randn(4, 64).requires_grad_()
    w = _randn(8, 64, seed=1)
    grad = _randn(4, 8, seed=2)
    quantised_linear(x, w, recipe=recipe).backward(grad)
    torch.testing.assert_close(x.grad, MXFP4.quantise(grad, -1) @ w, rtol=0, atol=0)
    assert not torch.allclose(x.grad, grad @ w)


def test_bias_stays_in_high_precision() -> None:
    x = _randn(4, 32)
    w = _randn(8, 32, seed=1).requires_grad_()
    bias = (_randn(8, seed=2) * 0.337).requires_grad_()
    grad = _randn(4, 8, seed=3) * 0.71
    y = quantised_linear(x, w, bias, recipe=MXFP4_RECIPE)
    y.backward(grad)
    fmt = MXFP4_RECIPE.forward[0]
    assert fmt is not None
    product = F.linear(fmt.quantise(x), fmt.quantise(w.detach()))
    torch.testing.assert_close(y, product + bias.detach(), rtol=0, atol=0)
    torch.testing.assert_close(bias.grad, grad.sum(0), rtol=0, atol=0)


def test_hadamard_is_orthogonal() -> None:
    h = random_hadamard(16, seed=3)
    torch.testing.assert_close(h @ h.T, torch.eye(16), rtol=0, atol=1e-6)
    assert set(h.abs().unique().tolist()) == {0.25}
    assert not torch.equal(h, random_hadamard(16, seed=4))  # random signs
    with pytest.raises(ValueError, match="power of two"):
        random_hadamard(12)


def test_hadamard_cancels_in_the_weight_gradient() -> None:
    x = _randn(40, 32).requires_grad_()  # 40 tokens: two groups of 16 and a tail
    w = _randn(8, 32, seed=1).requires_grad_()
    grad = _randn(40, 8, seed=2)
    rotated = dataclasses.replace(NONE, hadamard=True)
    quantised_linear(x, w, recipe=rotated).backward(grad)
    torch.testing.assert_close(w.grad, grad.T @ x.detach(), rtol=1e-5, atol=1e-5)
    # with formats, it changes what the weight gradient GEMM quantises
    formats = dataclasses.replace(NONE, grad_weight=(MXFP4, MXFP4))
    plain = quantised_linear(x.detach(), w, recipe=formats)
    w.grad = None
    plain.backward(grad)
    unrotated = w.grad.clone()
    w.grad = None
    quantised_linear(
        x.detach(), w, recipe=dataclasses.replace(formats, hadamard=True)
    ).backward(grad)
    assert not torch.equal(w.grad, unrotated)
    exact = grad.T @ x.detach()
    assert (w.grad - exact).norm() < 0.5 * exact.norm()


def test_einsum_is_the_matmul() -> None:
    a, b = _randn(2, 8, 32).requires_grad_(), _randn(2, 32, 16, seed=1)
    b.requires_grad_()
    grad = _randn(2, 8, 16, seed=2)
    out = quantised_einsum("bmk,bkn->bmn", a, b, recipe=DISTINCT)
    out.backward(grad)
    grads = a.grad, b.grad
    a.grad = b.grad = None
    expected = quantised_matmul(a, b, recipe=DISTINCT)
    expected.backward(grad)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    for got, want in zip(grads, (a.grad, b.grad), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def _qkv(seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    q, k, v = _randn(3, 2, 4, 16, 32, seed=seed).unbind(0)
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_()


def test_attention_without_formats_is_torch() -> None:
    q, k, v = _qkv()
    mask = _randn(16, 16, seed=5) > -0.5
    mask.fill_diagonal_(True)
    for kwargs in ({"is_causal": True}, {"attn_mask": mask}, {"scale": 0.3}):
        got = quantised_attention(q, k, v, recipe=NONE, **kwargs)  # type: ignore[arg-type]
        want = F.scaled_dot_product_attention(q, k, v, **kwargs)  # type: ignore[arg-type]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_attention_is_quantised() -> None:
    q, k, v = _qkv()
    out = quantised_attention(q, k, v, is_causal=True, recipe=MXFP8_RECIPE)
    out.sum().backward()
    exact = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    relative = ((out - exact).norm() / exact.norm()).item()
    assert 1e-3 < relative < 0.1
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))


class _Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(32, 32) for _ in range(4))
        self.head = nn.Linear(32, 8)

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = F.gelu(layer(x))
        return self.head(x)


def _kept(
    model: nn.Module, recipe: Recipe, caplog: pytest.LogCaptureFixture
) -> set[str]:
    """The nodes a recipe keeps in high precision, from the log."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    caplog.clear()
    simulate_format(model, recipe)(_randn(4, 32)).sum().backward()
    prefix = "keeping linear product in high precision: "
    return {
        m.removeprefix(prefix)
        for m in (r.getMessage() for r in caplog.records)
        if m.startswith(prefix)
    }


def test_recipe_keeps_listed_layers(caplog: pytest.LogCaptureFixture) -> None:
    model = _Blocks()
    x = _randn(4, 32)
    kept = simulate_format(model, MXFP4_RECIPE.keeping("head", "layers.*"))
    torch.testing.assert_close(kept(x), model(x), rtol=0, atol=0)
    assert len(_kept(model, MXFP4_RECIPE.keeping("layers.1"), caplog)) == 1
    assert not torch.allclose(simulate_format(model, MXFP4_RECIPE)(x), model(x))


def test_recipe_keeps_last_blocks(caplog: pytest.LogCaptureFixture) -> None:
    recipe = dataclasses.replace(MXFP4_RECIPE, high_precision_last=0.3)
    assert len(_kept(_Blocks(), recipe, caplog)) == 2  # ceil(0.3 * 4)
    # NVIDIA's recipe: the last 15% of the blocks (here one) and the head
    assert len(_kept(_Blocks(), NVFP4_RECIPE, caplog)) == 2
    no_head = dataclasses.replace(NVFP4_RECIPE, high_precision_head=False)
    assert len(_kept(_Blocks(), no_head, caplog)) == 1


def test_recipe_keeps_the_output_head(caplog: pytest.LogCaptureFixture) -> None:
    """The head is the last ``nn.Linear``, or what a Hugging Face model's
    ``get_output_embeddings`` names (here not the last linear)."""
    recipe = dataclasses.replace(MXFP4_RECIPE, high_precision_head=True)
    assert _kept(_Blocks(), recipe, caplog) == {"linear_4"}  # the fifth linear

    class Named(_Blocks):
        def get_output_embeddings(self) -> nn.Module:
            return self.layers[0]

    assert _kept(Named(), recipe, caplog) == {"linear"}  # the first


RECIPES = {"MXFP8": MXFP8_RECIPE, "MXFP4": MXFP4_RECIPE, "NVFP4": NVFP4_RECIPE}
# Relative output change on the MLP below, measured: MXFP8 0.060, MXFP4 0.24,
# NVFP4 0.18 (per-tensor FP8: 0.049; MXFP8's OCP floor rule saturates the
# largest element of a block whose amax has a mantissa above 1.75). The bounds
# allow a factor of about three either way.
_MLP_CHANGE = {"MXFP8": (0.02, 0.18), "MXFP4": (0.08, 0.7), "NVFP4": (0.06, 0.5)}


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(uu.Linear(64, 256), uu.GELU(), uu.Linear(256, 64))


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_on_unit_scaled_mlp(name: str) -> None:
    model = _mlp()
    x = _randn(32, 64)
    quantised = simulate_format(model, RECIPES[name])
    out = quantised(x)
    out.sum().backward()
    relative = ((out - model(x)).norm() / model(x).norm()).item()
    low, high = _MLP_CHANGE[name]
    assert low < relative < high, relative
    for p in quantised.parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all()


def test_recipe_composes_with_unit_scale() -> None:
    model = _Blocks()
    x = _randn(4, 32)
    torch.manual_seed(0)
    first = simulate_format(unit_scale(model), MXFP8_RECIPE)
    torch.manual_seed(0)
    second = unit_scale(simulate_format(model, MXFP8_RECIPE))
    torch.testing.assert_close(first(x), second(x), rtol=0, atol=0)
    assert not torch.allclose(first(x), unit_scale(model)(x))
    first(x).sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in first.parameters())  # type: ignore[arg-type]


def test_recipe_composes_with_compile_and_track_scales() -> None:
    model = _Blocks()
    x = _randn(4, 32)
    eager = simulate_format(unit_scale(model), MXFP8_RECIPE)
    expected = eager(x)
    expected.sum().backward()
    for wrap in (compile, track_scales):
        other = wrap(simulate_format(unit_scale(model), MXFP8_RECIPE))
        out = other(x)
        out.sum().backward()
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
        for a, b in zip(other.parameters(), eager.parameters(), strict=True):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-5)


# Relative change of gpt2's logits, measured: MXFP8 0.046, MXFP4 0.19, NVFP4
# (one of its two blocks quantised) 0.062; per-tensor FP8 0.059.
_GPT2_CHANGE = {"MXFP8": (0.015, 0.15), "MXFP4": (0.06, 0.6), "NVFP4": (0.02, 0.2)}


@pytest.mark.parametrize("name", RECIPES)
def test_zoo_gpt2(name: str) -> None:
    entry = zoo.get("gpt2")
    if not entry.available:
        pytest.skip("needs transformers")
    model = entry.make(seed=0)
    exact = entry.run(model, seed=0)
    quantised = simulate_format(model, RECIPES[name])
    out = entry.run(quantised, seed=0)
    out.float().pow(2).mean().backward()
    relative = ((out - exact).norm() / exact.norm()).item()
    low, high = _GPT2_CHANGE[name]
    assert low < relative < high, relative
    for p in quantised.parameters():
        assert p.grad is None or torch.isfinite(p.grad).all()


def test_bad_recipes_raise() -> None:
    with pytest.raises(TypeError, match="pair of BlockFormat"):
        Recipe(
            forward=(FP8_E4M3, None),
            grad_input=NONE.grad_input,
            grad_weight=NONE.grad_weight,
        )  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="products must be among"):
        dataclasses.replace(NONE, products=frozenset({"convolution"}))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tuple of module-path patterns"):
        dataclasses.replace(NONE, high_precision="lm_head")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="bwd_format must be None"):
        simulate_format(nn.Linear(2, 2), MXFP8_RECIPE, FPFormat(5, 2))
    with pytest.raises(TypeError, match="a Recipe"):
        simulate_format(nn.Linear(2, 2), NVFP4)  # type: ignore[arg-type]
    assert isinstance(NVFP4_RECIPE.forward[1], BlockFormat)
    with pytest.raises(TypeError, match="recipe must be a Recipe"):
        recipe_with_rule("MXFP8", "floor")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="scale_rule"):
        recipe_with_rule(MXFP8_RECIPE, "bogus")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="groups must be a positive int"):
        quantised_conv(_randn(1, 4, 3, 3), _randn(4, 4, 1, 1), recipe=NONE, groups=0)


def _by_channel(fmt: BlockFormat, x: Tensor, dim: int, groups: int = 1) -> Tensor:
    """``x`` quantised along ``dim`` in ``groups`` separate parts."""
    split = x.reshape(*x.shape[:dim], groups, -1, *x.shape[dim + 1 :])
    return fmt.quantise(split, dim + 1).reshape(x.shape)


def _by_tokens(fmt: BlockFormat, x: Tensor) -> Tensor:
    """``x`` (N, C, ...) quantised along every axis but the channels, in order."""
    moved = x.movedim(1, 0)
    flat = fmt.quantise(moved.reshape(moved.shape[0], -1), -1)
    return flat.reshape(moved.shape).movedim(0, 1)


@pytest.mark.parametrize("groups", [1, 2])
def test_conv_gemms_exact(groups: int) -> None:
    """Forward: channels at each position and input channels at each offset;
    input gradient: output channels; weight gradient: batch and positions."""
    x = _randn(2, 16, 9, 7).requires_grad_()
    w = _randn(8, 16 // groups, 3, 3, seed=1).requires_grad_()
    grad = _randn(2, 8, 5, 4, seed=2)
    args = (2, 1, 1, groups)  # stride, padding, dilation, groups
    y = quantised_conv(x, w, None, *args, recipe=DISTINCT, groups=groups)
    y.backward(grad)
    xd, wd = x.detach(), w.detach()
    q_x, q_w = _by_channel(_F1, xd, 1, groups), _F2.quantise(wd, 1)
    torch.testing.assert_close(y, F.conv2d(q_x, q_w, None, *args), rtol=0, atol=0)
    q_g, q_w = _by_channel(_F3, grad, 1, groups), _by_channel(_F4, wd, 0, groups)
    dx = torch.nn.grad.conv2d_input(x.shape, q_w, q_g, 2, 1, 1, groups)
    torch.testing.assert_close(x.grad, dx, rtol=0, atol=0)
    q_g, q_x = _by_tokens(_F5, grad), _by_tokens(_F6, xd)
    dw = torch.nn.grad.conv2d_weight(q_x, w.shape, q_g, 2, 1, 1, groups)
    torch.testing.assert_close(w.grad, dw, rtol=0, atol=0)


def test_conv_transpose_gemms_exact() -> None:
    x = _randn(2, 16, 5, 5).requires_grad_()
    w = _randn(16, 4, 4, 4, seed=1).requires_grad_()  # (C_in, C_out / G, k, k)
    grad = _randn(2, 8, 10, 10, seed=2)
    args = (2, 1, 0, 2)  # stride, padding, output_padding, groups
    y = quantised_conv(
        x,
        w,
        None,
        *args,
        recipe=DISTINCT,
        conv=F.conv_transpose2d,
        transposed=True,
        groups=2,
    )
    y.backward(grad)
    xd, wd = x.detach(), w.detach()
    q_x, q_w = _by_channel(_F1, xd, 1, 2), _by_channel(_F2, wd, 0, 2)
    expected = F.conv_transpose2d(q_x, q_w, None, *args)
    torch.testing.assert_close(y, expected, rtol=0, atol=0)
    # ∂x is a convolution of ∂y with W: output channels contracted.
    q_g, q_w = _by_channel(_F3, grad, 1, 2), _F4.quantise(wd, 1)
    dx = F.conv2d(q_g, q_w, None, 2, 1, 1, 2)
    torch.testing.assert_close(x.grad, dx, rtol=0, atol=0)
    assert w.grad is not None and w.grad.shape == w.shape


class _ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 32, 3, padding=1)
        self.grouped = uu.Conv2d(32, 32, 3, padding=1, groups=4)
        self.up = nn.ConvTranspose2d(32, 8, 2, stride=2)

    def forward(self, x: Tensor) -> Tensor:
        return self.up(F.gelu(self.grouped(F.gelu(self.conv(x)))))


def test_recipe_quantises_convolutions(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    model = _ConvNet()
    x = _randn(2, 3, 8, 8)
    caplog.set_level(logging.INFO, logger=LOGGER)
    quantised = simulate_format(model, MXFP8_RECIPE)
    out = quantised(x)
    out.sum().backward()
    quantised_convs = [r for r in caplog.records if "quantising conv" in r.getMessage()]
    assert len(quantised_convs) == 3
    relative = ((out - model(x)).norm() / model(x).norm()).item()
    assert 0.005 < relative < 0.1, relative
    assert all(p.grad is not None for p in quantised.parameters())
    # NVIDIA's NVFP4 recipe quantises linear layers only: convolutions stay.
    caplog.clear()
    torch.testing.assert_close(
        simulate_format(model, NVFP4_RECIPE)(x), model(x), rtol=0, atol=0
    )
    assert any("keeping conv" in r.getMessage() for r in caplog.records)


def test_einsum_of_three_operands_warns() -> None:
    class Three(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(_randn(32, 8))

        def forward(self, x: Tensor) -> Tensor:
            return torch.einsum("bi,ij,bj->b", x, self.w @ self.w.T, x)

    with pytest.warns(UserWarning, match="einsum of 3 operands"):
        simulate_format(Three(), MXFP8_RECIPE)(_randn(4, 32))
