"""Real FP8 training through ``torch._scaled_mm`` (emulated on the CPU)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import unit_scaling as uu
from unit_scaling import float8
from unit_scaling import functional as U
from unit_scaling.float8 import Float8Config, convert_to_float8_training
from unit_scaling.formats import FP8_E4M3, FP8_E5M2

from .helpers import randn


def sqnr(approx: Tensor, exact: Tensor) -> float:
    """Signal-to-quantisation-noise ratio in dB."""
    noise = (approx.double() - exact.double()).pow(2).mean()
    return float(10 * torch.log10(exact.double().pow(2).mean() / noise))


def _run(
    fn: Callable[[Tensor, Tensor], Tensor], x: Tensor, w: Tensor, g: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    y = fn(x, w)
    y.backward(g)
    assert x.grad is not None and w.grad is not None
    return y.detach(), x.grad, w.grad


def _simulated(x: Tensor, w: Tensor) -> Tensor:
    """What the FP8 GEMMs compute: operands rounded to E4M3 in the forward pass,
    the output gradient (the backward GEMMs' operand) rounded to E5M2."""
    return FP8_E5M2.quantise_bwd(
        U.linear(FP8_E4M3.quantise_fwd(x), FP8_E4M3.quantise_fwd(w))
    )


@pytest.fixture
def operands() -> tuple[Tensor, Tensor, Tensor]:
    return randn(64, 256, seed=1), randn(512, 256, seed=2), randn(64, 512, seed=3)


def test_real_fp8_equals_the_simulation(operands: tuple[Tensor, ...]) -> None:
    real = _run(float8.linear, *operands)
    simulated = _run(_simulated, *operands)
    for got, expected in zip(real, simulated, strict=True):
        # Products of FP8 values are exact in float32; only the order of the
        # sums differs.
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_single_linear_meets_torchaos_sqnr_bars(operands: tuple[Tensor, ...]) -> None:
    y, gx, gw = _run(float8.linear, *operands)
    ey, egx, egw = _run(U.linear, *operands)
    assert sqnr(y, ey) >= 18
    assert sqnr(gx, egx) >= 17
    assert sqnr(gw, egw) >= 17


def _all_grads(model: nn.Module, loss: Tensor) -> dict[str, Tensor]:
    loss.backward()
    return {
        n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
    }


def test_llama_style_ffn_meets_20_db_everywhere() -> None:
    torch.manual_seed(0)
    exact = uu.MLP(256, expansion_factor=4)
    real = convert_to_float8_training(
        uu.MLP(256, expansion_factor=4).requires_grad_(True)
    )
    real.load_state_dict(exact.state_dict())
    x, g = randn(512, 256, seed=4), randn(512, 256, seed=5)
    outs = []
    for model in (exact, real):
        xi = x.detach().clone().requires_grad_()
        y = model(xi)
        grads = _all_grads(model, (y * g).sum())
        outs.append((y.detach(), xi.grad, grads))
    (ey, egx, egrads), (y, gx, grads) = outs
    assert sqnr(y, ey) >= 20
    assert sqnr(gx, egx) >= 20
    assert egrads.keys() == grads.keys() and len(grads) == 3
    for name, expected in egrads.items():
        assert sqnr(grads[name], expected) >= 20, name


def test_decoder_logits_and_weight_gradients() -> None:
    torch.manual_seed(0)
    exact = uu.TransformerDecoder(64, 256, layers=2, heads=4)
    real = convert_to_float8_training(uu.TransformerDecoder(64, 256, layers=2, heads=4))
    real.load_state_dict(exact.state_dict())
    tokens = torch.randint(256, (4, 65), generator=torch.Generator().manual_seed(0))
    assert sqnr(real(tokens), exact(tokens)) >= 18
    egrads = _all_grads(exact, exact.loss(tokens))
    grads = _all_grads(real, real.loss(tokens))
    for name, expected in egrads.items():
        if expected.dim() == 2:  # the weights
            assert sqnr(grads[name], expected) >= 17, name


def test_compiled_equals_eager(operands: tuple[Tensor, ...]) -> None:
    compiled = torch.compile(float8.linear, fullgraph=True)
    for got, expected in zip(
        _run(compiled, *operands), _run(float8.linear, *operands), strict=True
    ):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_no_amax_and_no_host_sync(operands: tuple[Tensor, ...]) -> None:
    """Static scales: the forward and backward reduce no tensor to a maximum
    and read no value back to the host."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _run(float8.linear, *operands)
    events = list(prof.events())
    names = {e.name for e in events}
    assert "aten::_scaled_mm" in names
    assert not names & {"aten::amax", "aten::max", "aten::abs", "aten::norm"}

    def inside_scaled_mm(event: Any) -> bool:
        while event is not None:
            if event.name == "aten::_scaled_mm":
                return True
            event = event.cpu_parent
        return False

    # The CPU emulation of _scaled_mm reads its two scale arguments with item();
    # on a GPU the kernel reads them on the device. Nothing else reads a value.
    reads = [e for e in events if e.name in ("aten::item", "aten::_local_scalar_dense")]
    assert reads and all(inside_scaled_mm(e) for e in reads)


def test_save_fp8_inputs_saves_fp8(operands: tuple[Tensor, ...]) -> None:
    saved: list[torch.dtype] = []

    def pack(t: Tensor) -> Tensor:
        saved.append(t.dtype)
        return t

    config = Float8Config(save_fp8_inputs=True)
    x, w, g = operands
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = _run(lambda a, b: float8.linear(a, b, config=config), x, w, g)
    assert saved == [torch.float8_e4m3fn, torch.float8_e4m3fn]
    for got, expected in zip(result, _run(float8.linear, x, w, g), strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cast_column_major_is_the_cast_then_the_transpose(dtype: torch.dtype) -> None:
    # The backward's one-pass cast must give the bytes and the layout of the
    # two-pass one it replaced, saturating values included.
    from unit_scaling.float8 import _gemm

    x = (randn(48, 32, seed=6) * 300).to(dtype)
    assert x.abs().max() > 448
    for fp8 in (torch.float8_e4m3fn, torch.float8_e5m2):
        got = _gemm.cast_column_major(x, fp8)
        expected = _gemm.column_major(_gemm.cast(x, fp8))
        assert got.dtype == fp8 and got.stride() == expected.stride() == (1, 48)
        assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8))


def test_tokens_not_a_multiple_of_16_are_padded(operands: tuple[Tensor, ...]) -> None:
    # The weight-gradient GEMM's inner dimension is the tokens: 40 of them take
    # the padded path, 64 the one-pass cast; both compute the simulation.
    x, w, g = operands
    for tokens in (40, 64):
        real = _run(float8.linear, x[:tokens], w, g[:tokens])
        simulated = _run(_simulated, x[:tokens], w, g[:tokens])
        for got, expected in zip(real, simulated, strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_gemms_kept_in_high_precision_on_request(operands: tuple[Tensor, ...]) -> None:
    config = Float8Config(output=False, grad_input=False, grad_weight=False)
    fp32 = _run(lambda a, b: float8.linear(a, b, config=config), *operands)
    for got, expected in zip(fp32, _run(U.linear, *operands), strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_shapes_fp8_cannot_take_are_kept_or_padded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    x, w, g = randn(10, 40, seed=1), randn(24, 40, seed=2), randn(10, 24, seed=3)
    kept = _run(float8.linear, x, w, g)
    for got, expected in zip(kept, _run(U.linear, x, w, g), strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    pad = Float8Config(unsupported_shapes="pad")
    padded = _run(lambda a, b: float8.linear(a, b, config=pad), x, w, g)
    for got, expected in zip(padded, _run(_simulated, x, w, g), strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    with caplog.at_level(logging.WARNING, logger="unit_scaling.float8"):
        model = convert_to_float8_training(nn.Sequential(uu.Linear(40, 24)))
    assert "0 (40 -> 24)" in caplog.text and "stay in high precision" in caplog.text
    assert isinstance(model[0], float8.Float8Linear)


def test_conversion_is_in_place_and_keeps_parameters() -> None:
    model = uu.TransformerDecoder(64, 256, layers=2, heads=4)
    params = dict(model.named_parameters())
    out = convert_to_float8_training(
        model, module_filter_fn=lambda layer, fqn: "mlp" in fqn
    )
    assert out is model
    assert dict(model.named_parameters()) == params
    assert type(model.layers[0].mlp.linear_2) is float8.Float8Linear
    assert type(model.layers[0].mhsa.linear_qkv) is uu.Linear  # filtered out
    assert model.layers[0].mlp.linear_2.weight.mup_type == "weight"


def test_autocast_gives_the_autocast_dtype(operands: tuple[Tensor, ...]) -> None:
    x, w, _ = operands
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert float8.linear(x, w).dtype == torch.bfloat16
    assert float8.linear(
        x, w, config=Float8Config(output_dtype=torch.bfloat16)
    ).dtype == (torch.bfloat16)


def test_a_unit_scaled_hf_model_converts_in_place() -> None:
    pytest.importorskip("transformers")
    from unit_scaling.transforms import unit_scale
    from unit_scaling.transforms._capture.engine import transform_state
    from unit_scaling.zoo import hf_model

    torch.manual_seed(0)
    scaled = unit_scale(hf_model("llama", hidden_size=64, vocab_size=256))
    tokens = torch.randint(256, (2, 32), generator=torch.Generator().manual_seed(0))
    before = scaled(input_ids=tokens).logits
    assert convert_to_float8_training(scaled) is scaled
    after = scaled(input_ids=tokens).logits
    state = transform_state(scaled)
    assert state is not None
    targets = {n.target for c in state.captures for n in c.graph_module.graph.nodes}
    names = {getattr(t, "__name__", "") for t in targets}
    assert "float8_linear" in names and U.linear not in targets
    assert sqnr(after, before) >= 18
    assert not torch.equal(after, before)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"forward_dtype": torch.bfloat16}, ValueError),
        ({"forward_dtype": torch.float8_e5m2}, ValueError),  # E5M2 x E5M2
        ({"output_dtype": torch.float8_e4m3fn}, ValueError),
        ({"unsupported_shapes": "drop"}, ValueError),
        ({"output": 1}, TypeError),
        ({"attention": "yes"}, TypeError),
        (  # attention's backward would be E5M2 x E5M2
            {
                "forward_dtype": torch.float8_e5m2,
                "grad_weight": False,
                "attention": True,
            },
            ValueError,
        ),
    ],
)
def test_bad_config_is_refused(kwargs: dict[str, Any], error: type) -> None:
    with pytest.raises(error, match="Float8Config"):
        Float8Config(**kwargs)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(TypeError, match=r"nn\.Module"):
        convert_to_float8_training("model")  # type: ignore[type-var]
    with pytest.raises(TypeError, match="Float8Config"):
        convert_to_float8_training(nn.Linear(2, 2), config={})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="in_features"):
        float8.linear(torch.randn(4, 8), torch.randn(16, 4))
    with pytest.raises(TypeError, match="floating-point"):
        float8.linear(torch.ones(4, 16, dtype=torch.long), torch.randn(16, 16))
    q = torch.randn(2, 16, 8)
    with pytest.raises(ValueError, match="either attn_mask or is_causal"):
        float8.scaled_dot_product_attention(
            q, q, q, attn_mask=torch.ones(16, 16, dtype=torch.bool), is_causal=True
        )
    with pytest.raises(ValueError, match="head dimension"):
        float8.scaled_dot_product_attention(q, q[..., :4], q)
    with pytest.raises(TypeError, match="Float8Config"):
        float8.scaled_dot_product_attention(q, q, q, config="fp8")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="floating-point"):
        float8.scaled_dot_product_attention(q.long(), q.long(), q.long())


def _aten_ops_run(call: Callable[[], object]) -> set[str]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        call()
    return {event.name for event in prof.events()}


def test_the_cpu_fp8_gemm_takes_torchs_reference_kernel() -> None:
    """``float8._gemm._cpu_gemm`` turns oneDNN off around ``_scaled_mm``: on a CPU
    with AMX torch sends E4M3 x E4M3 to oneDNN, two orders of magnitude slower
    than its reference kernel (``python -m benchmarks.float8 --onednn`` times
    both). Checked by the kernel that ran, not by time: the reference kernel
    widens the operands and calls ``aten::mm``, oneDNN's does not."""
    from unit_scaling.float8._gemm import _cpu_gemm

    a = randn(64, 32, seed=1).to(torch.float8_e4m3fn)
    b = randn(16, 32, seed=2).to(torch.float8_e4m3fn).t()
    two = torch.tensor(2.0)
    out: list[Tensor] = []
    before = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = True  # torch's default, whatever a test left
    try:
        ops = _aten_ops_run(lambda: out.append(_cpu_gemm(a, b, two, torch.float32)))
        assert torch.backends.mkldnn.enabled, "the flag was not restored"
    finally:
        torch.backends.mkldnn.enabled = before
    assert {"aten::_scaled_mm", "aten::mm"} <= ops, sorted(ops)
    torch.testing.assert_close(out[0], 2 * a.float() @ b.float())


# --------------------------------------------------------------------------- #
# Attention in FP8 (Float8Config(attention=True)).
# --------------------------------------------------------------------------- #


def _attention_operands(heads: int = 4, kv_heads: int = 4) -> tuple[Tensor, ...]:
    q = randn(2, heads, 48, 32, seed=11)
    k, v = randn(2, kv_heads, 48, 32, seed=12), randn(2, kv_heads, 48, 32, seed=13)
    return q, k, v, randn(2, heads, 48, 32, seed=14)


def _run_attention(fn: Callable[..., Tensor], *operands: Tensor, **kwargs: Any) -> Any:
    *inputs, g = operands
    inputs = [t.detach().requires_grad_() for t in inputs]
    y = fn(*inputs, **kwargs)
    y.backward(g)
    return (y.detach(), *(t.grad for t in inputs))


def _simulated_attention(q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> Tensor:
    """What the FP8 attention computes, simulated in float32: Q, K, V and
    256·P rounded to E4M3, the gradients of both products' outputs to E5M2."""
    from unit_scaling.functional._scaling import attention_scales

    temperature, c = attention_scales(
        "test", q, k, v, None, 0.0, kwargs.get("is_causal", False), None, False, 1.0
    )
    e4m3, e5m2 = FP8_E4M3.quantise_fwd, FP8_E5M2.quantise_bwd
    scores = e5m2(e4m3(q) @ e4m3(k).transpose(-2, -1) * temperature)
    if kwargs.get("is_causal"):
        allowed = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        scores = scores.masked_fill(~allowed, float("-inf"))
    probs = e4m3(scores.softmax(-1) * 256) / 256
    return e5m2(probs @ e4m3(v) * c)


@pytest.mark.parametrize("is_causal", [False, True])
def test_fp8_attention_equals_the_simulation(is_causal: bool) -> None:
    operands = _attention_operands()
    real = _run_attention(
        float8.scaled_dot_product_attention, *operands, is_causal=is_causal
    )
    simulated = _run_attention(_simulated_attention, *operands, is_causal=is_causal)
    for got, expected in zip(real, simulated, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("kwargs", "kv_heads"),
    [
        ({}, 4),
        ({"is_causal": True}, 4),
        ({"attn_mask": randn(48, 48, seed=15) > -0.5}, 4),
        ({"attn_mask": torch.full((48, 48), -1e9).triu(1)}, 4),
        ({"mult": 4.0, "is_causal": True}, 4),
        ({"scale": 32**-0.5}, 4),
        ({"enable_gqa": True, "is_causal": True}, 2),
    ],
    ids=["plain", "causal", "bool-mask", "float-mask", "mult", "scale", "gqa"],
)
def test_fp8_attention_is_the_unit_scaled_attention(
    kwargs: dict[str, Any], kv_heads: int
) -> None:
    """The same function as ``U.scaled_dot_product_attention`` (every option),
    up to FP8 rounding: output and gradients at least 20 and 18 dB."""
    operands = _attention_operands(kv_heads=kv_heads)
    real = _run_attention(float8.scaled_dot_product_attention, *operands, **kwargs)
    exact = _run_attention(U.scaled_dot_product_attention, *operands, **kwargs)
    assert sqnr(real[0], exact[0]) >= 20
    for got, expected in zip(real[1:], exact[1:], strict=True):
        assert sqnr(got, expected) >= 18


def test_fp8_attention_keeps_unit_scale_under_dropout() -> None:
    q, k, v = (
        randn(8, 4, 128, 64, seed=21),
        randn(8, 4, 128, 64, seed=22),
        randn(8, 4, 128, 64, seed=23),
    )
    torch.manual_seed(0)
    y = float8.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    exact = U.scaled_dot_product_attention(q, k, v)
    assert y.std().item() == pytest.approx(exact.std().item(), rel=0.1)
    assert (y == 0).float().mean() < 0.01  # dropout drops weights, not outputs


def test_fp8_attention_compiles() -> None:
    q, k, v, g = _attention_operands()
    compiled = torch.compile(float8.scaled_dot_product_attention, fullgraph=True)
    for got, expected in zip(
        _run_attention(compiled, q, k, v, g, is_causal=True),
        _run_attention(float8.scaled_dot_product_attention, q, k, v, g, is_causal=True),
        strict=True,
    ):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_fp8_attention_runs_no_amax() -> None:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _run_attention(
            float8.scaled_dot_product_attention, *_attention_operands(), is_causal=True
        )
    names = {e.name for e in prof.events()}
    assert "aten::_scaled_mm" in names
    assert not names & {"aten::amax", "aten::max", "aten::abs", "aten::norm"}


def test_attention_is_converted_only_on_request() -> None:
    torch.manual_seed(0)
    exact = uu.TransformerDecoder(64, 256, layers=2, heads=4)
    plain = uu.TransformerDecoder(64, 256, layers=2, heads=4)
    convert_to_float8_training(plain)
    assert type(plain.layers[0].mhsa) is uu.MHSA
    config = Float8Config(attention=True)
    real = convert_to_float8_training(
        uu.TransformerDecoder(64, 256, layers=2, heads=4), config=config
    )
    assert isinstance(real.layers[0].mhsa, float8.Float8MHSA)
    real.load_state_dict(exact.state_dict())
    tokens = torch.randint(256, (4, 65), generator=torch.Generator().manual_seed(0))
    assert sqnr(real(tokens), exact(tokens)) >= 18
    plain.load_state_dict(exact.state_dict())
    assert not torch.equal(real(tokens), plain(tokens))
    egrads = _all_grads(exact, exact.loss(tokens))
    grads = _all_grads(real, real.loss(tokens))
    for name, expected in egrads.items():
        if expected.dim() == 2:
            assert sqnr(grads[name], expected) >= 17, name


def test_attention_of_a_unit_scaled_hf_model_converts() -> None:
    pytest.importorskip("transformers")
    from unit_scaling.transforms import unit_scale
    from unit_scaling.transforms._capture.engine import transform_state
    from unit_scaling.zoo import hf_model

    torch.manual_seed(0)
    scaled = unit_scale(hf_model("llama", hidden_size=64, vocab_size=256))
    tokens = torch.randint(256, (2, 32), generator=torch.Generator().manual_seed(0))
    before = scaled(input_ids=tokens).logits
    convert_to_float8_training(scaled, config=Float8Config(attention=True))
    after = scaled(input_ids=tokens).logits
    state = transform_state(scaled)
    assert state is not None
    targets = {n.target for c in state.captures for n in c.graph_module.graph.nodes}
    names = {getattr(t, "__name__", "") for t in targets}
    assert {"float8_linear", "float8_scaled_dot_product_attention"} <= names
    assert U.scaled_dot_product_attention not in targets
    assert sqnr(after, before) >= 18
