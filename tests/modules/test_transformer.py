"""Tests for the unit-scaled transformer: ``MLP``, ``MHSA``, ``TransformerLayer``,
``TransformerStack``, ``TransformerDecoder``.

The building blocks are checked against compositions of ``U.*`` functions; the
decoder as a whole for its u-μP tags, its unit scale at initialisation (RMS of
activations, measured with forward hooks), its residual weights, its loss, and
that it trains, compiles without graph breaks, and runs under bf16 autocast.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import unit_scaling as uu
import unit_scaling.functional as U
from tests.helpers import randn, unit_backward
from unit_scaling.data import Corpus

LAYER_LINEARS = (
    "mhsa.linear_qkv",
    "mhsa.linear_o",
    "mlp.linear_1",
    "mlp.linear_gate",
    "mlp.linear_2",
)


def _ids(vocab: int, *shape: int, seed: int = 0) -> Tensor:
    return torch.randint(vocab, shape, generator=torch.Generator().manual_seed(seed))


def _run(fn: Callable[[Tensor], Tensor], x: Tensor, params: list[Tensor]):
    """Output of ``fn(x)`` and the grads of ``x`` and ``params`` (fixed unit grad)."""
    for t in [x, *params]:
        t.grad = None
    out = fn(x)
    unit_backward(out, seed=1)
    return out.detach(), [t.grad.clone() for t in [x, *params]]


def _assert_same(a, b, tol: float = 0.0) -> None:
    torch.testing.assert_close(a[0], b[0], rtol=tol, atol=tol)
    for ga, gb in zip(a[1], b[1], strict=True):
        torch.testing.assert_close(ga, gb, rtol=tol, atol=tol)


def _reference_mhsa(x: Tensor, mhsa: uu.MHSA) -> Tensor:
    """MHSA written out from the functional API: fused q|k|v, heads, attention."""
    batch, seq, hidden = x.shape
    heads = mhsa.heads
    q, k, v = (
        U.linear(x, mhsa.linear_qkv.weight)
        .view(batch, seq, 3 * heads, hidden // heads)
        .transpose(1, 2)
        .chunk(3, dim=1)
    )
    a = U.scaled_dot_product_attention(
        q, k, v, is_causal=mhsa.is_causal, mult=mhsa.mult
    )
    return U.linear(a.transpose(1, 2).reshape(batch, seq, hidden), mhsa.linear_o.weight)


def _reference_mlp(x: Tensor, mlp: uu.MLP) -> Tensor:
    # Natural scales on all three (see uu.MLP): unit weight gradients for any
    # expansion factor, with the block's input gradient still the true one.
    up, gate, down = mlp.linear_1, mlp.linear_gate, mlp.linear_2
    z = U.silu_glu(
        U.linear(x, up.weight, constraint=None),
        U.linear(x, gate.weight, constraint=None),
        mlp.mult,
    )
    return U.linear(z, down.weight, constraint=None)


# --- MLP and MHSA ------------------------------------------------------------------


@pytest.mark.parametrize("mult", [1.0, 2.0])
def test_mlp_calls_functional(mult: float) -> None:
    mlp = uu.MLP(16, expansion_factor=3, mult=mult)
    assert mlp.linear_1.out_features == mlp.linear_gate.out_features == 48
    assert (mlp.linear_2.in_features, mlp.linear_2.out_features) == (48, 16)
    x = randn(2, 5, 16, seed=0)
    params = list(mlp.parameters())
    _assert_same(
        _run(mlp, x, params), _run(lambda x: _reference_mlp(x, mlp), x, params)
    )


@pytest.mark.parametrize(("is_causal", "mult"), [(True, 1.0), (False, 3.0)])
def test_mhsa_calls_functional(is_causal: bool, mult: float) -> None:
    mhsa = uu.MHSA(16, heads=4, is_causal=is_causal, mult=mult)
    x = randn(3, 7, 16, seed=0)
    params = list(mhsa.parameters())
    _assert_same(
        _run(mhsa, x, params),
        _run(lambda x: _reference_mhsa(x, mhsa), x, params),
        tol=1e-6,
    )


def test_mhsa_dropout_only_in_training() -> None:
    mhsa = uu.MHSA(16, heads=2, is_causal=True, dropout_p=0.5)
    x = torch.randn(2, 6, 16)
    with torch.no_grad():
        expected = _reference_mhsa(x, mhsa)
        torch.testing.assert_close(mhsa.eval()(x), expected)
        assert not torch.allclose(mhsa.train()(x), expected)


@pytest.mark.parametrize(("hidden", "heads"), [(10, 4), (8, 0)])
def test_mhsa_rejects_bad_heads(hidden: int, heads: int) -> None:
    with pytest.raises(ValueError, match=f"hidden_size={hidden}.*heads={heads}"):
        uu.MHSA(hidden, heads, is_causal=True)


# --- TransformerLayer and TransformerStack -----------------------------------------


def test_layer_is_two_residual_branches() -> None:
    layer = uu.TransformerLayer(16, 4, mhsa_tau=0.3, mlp_tau=0.7, is_causal=True)
    assert isinstance(layer.mhsa_norm, uu.RMSNorm)
    assert isinstance(layer.mlp_norm, uu.RMSNorm)

    def reference(x: Tensor) -> Tensor:
        x = U.residual_apply(
            lambda r: _reference_mhsa(U.rms_norm(r, (16,)), layer.mhsa), x, 0.3
        )
        return U.residual_apply(
            lambda r: _reference_mlp(U.rms_norm(r, (16,)), layer.mlp), x, 0.7
        )

    x = randn(2, 5, 16, seed=0)
    params = list(layer.parameters())
    _assert_same(_run(layer, x, params), _run(reference, x, params), tol=1e-6)


@pytest.mark.parametrize("layers", [1, 3, 6])
def test_stack_taus_follow_default_rule(layers: int) -> None:
    rule = uu.transformer_residual_scaling_rule()
    stack = uu.TransformerStack(layers, 8, 2, is_causal=True)
    assert len(stack) == layers
    for i, layer in enumerate(stack):
        assert layer.mhsa_tau == pytest.approx(rule(2 * i, 2 * layers), rel=1e-12)
        assert layer.mlp_tau == pytest.approx(rule(2 * i + 1, 2 * layers), rel=1e-12)


def test_default_rule_keeps_stream_unit_for_unit_branches() -> None:
    # With unit, independent branches the skip weights compound so that every
    # branch contributes a_branch² / (L/2 + Σ a²) of the final variance: all
    # contributions (skip included) sum to 1.
    layers = 5
    stack = uu.TransformerStack(layers, 8, 2, is_causal=True)
    taus = [t for layer in stack for t in (layer.mhsa_tau, layer.mlp_tau)]
    variance = 1.0
    for tau in taus:
        variance = (variance + tau**2) / (1 + tau**2)
    assert variance == pytest.approx(1.0)
    # ... and not merely a trivial rule: the branch weights shrink with depth.
    assert taus[0] > taus[-1] > 0


def test_custom_residual_scaling_is_honoured() -> None:
    calls: list[tuple[int, int]] = []

    def rule(index: int, branches: int) -> float:
        calls.append((index, branches))
        return 0.1 * (index + 1)

    model = uu.TransformerDecoder(8, 16, layers=3, heads=2, residual_scaling=rule)
    assert sorted(calls) == [(i, 6) for i in range(6)]
    for i, layer in enumerate(model.layers):
        assert layer.mhsa_tau == pytest.approx(0.1 * (2 * i + 1))
        assert layer.mlp_tau == pytest.approx(0.1 * (2 * i + 2))
    other = uu.transformer_residual_scaling_rule(
        residual_mult=2.0, residual_attn_ratio=0.5
    )
    model = uu.TransformerDecoder(8, 16, layers=2, heads=2, residual_scaling=other)
    assert model.layers[1].mhsa_tau == pytest.approx(other(2, 4))
    assert model.layers[1].mlp_tau == pytest.approx(other(3, 4))


def test_stack_rejects_no_layers() -> None:
    with pytest.raises(ValueError, match="layers=0"):
        uu.TransformerStack(0, 8, 2, is_causal=True)


# --- TransformerDecoder: structure and tags ----------------------------------------


@pytest.mark.parametrize("layers", [1, 3])
def test_decoder_tags(layers: int) -> None:
    model = uu.TransformerDecoder(16, 32, layers=layers, heads=2)
    tags = {}
    for name, param in model.named_parameters():
        assert isinstance(param, uu.Parameter), name
        tags[name] = (param.mup_type, param.mup_scaling_depth)
    expected = {
        "embedding.weight": ("weight", None),
        "projection.weight": ("output", None),
    }
    for i in range(layers):
        for sub in LAYER_LINEARS:
            expected[f"layers.{i}.{sub}.weight"] = ("weight", layers)
    assert tags == expected


def test_decoder_weights_unit_at_init() -> None:
    model = uu.TransformerDecoder(64, 128, layers=2, heads=4)
    for name, param in model.named_parameters():
        tol = 6 / math.sqrt(2 * param.numel())
        assert abs(param.std().item() - 1) <= tol, name


# --- TransformerDecoder: unit scale at initialisation -------------------------------


@pytest.mark.parametrize(("width", "layers"), [(32, 1), (64, 3), (128, 4)])
def test_decoder_unit_scale_at_init(width: int, layers: int) -> None:
    torch.manual_seed(0)
    vocab = 256
    model = uu.TransformerDecoder(width, vocab, layers=layers, heads=4)
    fwd: dict[str, float] = {}
    bwd: dict[str, float] = {}

    def rms(t: Tensor) -> float:
        return t.detach().float().pow(2).mean().sqrt().item()

    def hook(name: str):
        def record(module: nn.Module, inputs: object, output: Tensor) -> None:
            fwd[name] = rms(output)
            output.register_hook(lambda g: bwd.__setitem__(name, rms(g)))

        return record

    watched = (
        uu.TransformerLayer,
        uu.MHSA,
        uu.MLP,
        uu.RMSNorm,
        uu.Linear,
        uu.Embedding,
    )
    for name, module in model.named_modules():
        if isinstance(module, watched) and name != "projection":
            module.register_forward_hook(hook(name))
    ids = _ids(vocab, 4, 33)
    logits = model(ids[:, :-1])
    loss = U.cross_entropy(logits.flatten(end_dim=-2), ids[:, 1:].flatten())
    loss.backward()
    assert len(fwd) == 2 + layers * 10

    # Attention assumes its values are independent across positions. That holds
    # for layer 0 (its inputs are embeddings of random tokens), so its output is
    # ≈ 1; later layers see mixed, position-correlated inputs and their attention
    # output grows (≈ 3 by layer 4 here), a known limit of u-μP's rule, hence a
    # looser band for those only.
    for name, value in fwd.items():
        if name == "layers.0.mhsa":
            assert 0.8 < value < 1.25, (name, value)
        elif name.endswith(("mhsa", "linear_o")):
            assert 0.5 < value < 4, (name, value)
        else:
            assert 0.5 < value < 2, (name, value)
    # The readout is μP's: logits RMS ≈ fan_in^-½ (a unit input times W / fan_in).
    assert 0.5 < rms(logits) * math.sqrt(width) < 2
    # Every activation gradient is within a factor 4 of unit ...
    for name, value in bwd.items():
        assert 0.25 < value < 4, (name, value)
    # ... and every parameter gets a finite, non-zero gradient.
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all(), name
        assert param.grad.abs().sum() > 0, name
        assert 0.1 < rms(param.grad) < 10, (name, rms(param.grad))


# --- TransformerDecoder: loss --------------------------------------------------------


@pytest.mark.parametrize("loss_mult", [1.0, 2.0])
def test_decoder_loss_is_next_token_cross_entropy(loss_mult: float) -> None:
    model = uu.TransformerDecoder(16, 32, layers=1, heads=2, loss_mult=loss_mult)
    ids = _ids(32, 3, 9)
    loss = model.loss(ids)
    assert loss.shape == ()
    with torch.no_grad():
        logits = model(ids[:, :-1])
        assert logits.shape == (3, 8, 32)
        expected = F.cross_entropy(
            loss_mult * logits.reshape(-1, 32), ids[:, 1:].reshape(-1)
        )
        unit = U.cross_entropy(
            logits.reshape(-1, 32), ids[:, 1:].reshape(-1), mult=loss_mult
        )
    torch.testing.assert_close(loss.detach(), expected)
    torch.testing.assert_close(loss.detach(), unit, rtol=0, atol=0)
    # At init, predictions are near uniform: loss ≈ ln(vocab).
    assert abs(loss.item() - math.log(32)) < 0.5


@pytest.mark.parametrize("shape", [(9,), (2, 1), (2, 3, 9)])
def test_decoder_loss_rejects_bad_shapes(shape: tuple[int, ...]) -> None:
    model = uu.TransformerDecoder(16, 32, layers=1, heads=2)
    with pytest.raises(ValueError, match=r"input_ids.*\(batch, seq\+1\)"):
        model.loss(_ids(32, *shape))


# --- TransformerDecoder: u-μP multipliers ----------------------------------------

MULTIPLIERS = (
    "embedding_mult",
    "residual_mult",
    "residual_attn_ratio",
    "mhsa_mult",
    "mlp_mult",
    "readout_mult",
    "loss_mult",
)


def _decoder(seed: int = 0, **kwargs: object) -> uu.TransformerDecoder:
    torch.manual_seed(seed)
    return uu.TransformerDecoder(16, 32, layers=2, heads=2, **kwargs)  # type: ignore[arg-type]


def _loss_and_grads(model: nn.Module, ids: Tensor) -> tuple[Tensor, list[Tensor]]:
    model.zero_grad()
    loss = model.loss(ids)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def test_decoder_default_multipliers_change_nothing() -> None:
    ids = _ids(32, 3, 9)
    default = _decoder()
    explicit_rule = _decoder(residual_scaling=uu.transformer_residual_scaling_rule())
    all_ones = _decoder(**dict.fromkeys(MULTIPLIERS, 1.0))
    assert all(getattr(default, name) == 1.0 for name in MULTIPLIERS)
    assert default.extra_repr() == ""
    expected = _loss_and_grads(explicit_rule, ids)
    for model in (default, all_ones):
        assert [lyr.mhsa_tau for lyr in model.layers] == [
            lyr.mhsa_tau for lyr in explicit_rule.layers
        ]
        torch.testing.assert_close(model(ids), explicit_rule(ids), rtol=0, atol=0)
        _assert_same(_loss_and_grads(model, ids), expected)


def test_decoder_readout_mult_scales_the_logits_exactly() -> None:
    ids = _ids(32, 3, 9)
    with torch.no_grad():
        logits = _decoder()(ids[:, :-1])
        doubled = _decoder(readout_mult=2.0)(ids[:, :-1])
        torch.testing.assert_close(doubled, 2 * logits, rtol=0, atol=0)
        # In the loss, it is the same as the loss's own temperature.
        torch.testing.assert_close(
            _decoder(readout_mult=2.0).loss(ids),
            _decoder(loss_mult=2.0).loss(ids),
            rtol=0,
            atol=0,
        )
    # The gradient is the true gradient of the multiplied logits: twice as large.
    model, reference = _decoder(readout_mult=2.0), _decoder()
    unit_backward(model(ids), seed=1)
    unit_backward(reference(ids), seed=1)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, 2 * q.grad)


def test_decoder_embedding_mult_multiplies_the_embedding_output() -> None:
    ids = _ids(32, 3, 9)
    model = _decoder(embedding_mult=4.0)
    reference = _decoder()
    reference.embedding.register_forward_hook(lambda module, args, out: 4.0 * out)
    _assert_same(_loss_and_grads(model, ids), _loss_and_grads(reference, ids))
    with torch.no_grad():
        logits, plain = model(ids), _decoder()(ids)
        # The embedding outweighs the branches: the logits move away from the
        # default model's, towards those of a model with no residual branches.
        bypass = _decoder()
        bypass.layers = nn.Sequential()
        skip_only = bypass(ids)
    assert not torch.equal(logits, plain)
    assert (logits - skip_only).norm() < (plain - skip_only).norm()


def test_decoder_residual_multipliers_build_the_rule() -> None:
    mult, ratio = 2.0, 0.5
    model = _decoder(residual_mult=mult, residual_attn_ratio=ratio)
    rule = uu.transformer_residual_scaling_rule(mult, ratio)
    for i, layer in enumerate(model.layers):
        assert layer.mhsa_tau == rule(2 * i, 4)
        assert layer.mlp_tau == rule(2 * i + 1, 4)
    default = _decoder()
    # residual_mult > 1 weighs every branch more against the embedding ...
    heavier = _decoder(residual_mult=2.0)
    for a, b in zip(heavier.layers, default.layers, strict=True):
        assert a.mhsa_tau > b.mhsa_tau and a.mlp_tau > b.mlp_tau
    # ... and residual_attn_ratio > 1 weighs attention more against the MLP.
    attn = _decoder(residual_attn_ratio=2.0).layers[0]
    assert attn.mhsa_tau > default.layers[0].mhsa_tau
    assert attn.mlp_tau < default.layers[0].mlp_tau
    ids = _ids(32, 3, 9)
    with torch.no_grad():
        assert not torch.equal(heavier(ids), default(ids))
    assert model.extra_repr() == "residual_mult=2.0, residual_attn_ratio=0.5"


def test_decoder_residual_multipliers_conflict_with_a_rule() -> None:
    rule = uu.transformer_residual_scaling_rule(2.0)
    with pytest.raises(ValueError, match=r"residual_scaling.*residual_mult=2\.0"):
        _decoder(residual_scaling=rule, residual_mult=2.0)
    with pytest.raises(ValueError, match=r"residual_attn_ratio=0\.5"):
        _decoder(residual_scaling=rule, residual_attn_ratio=0.5)
    assert _decoder(residual_scaling=rule).layers[0].mhsa_tau == rule(0, 4)


@pytest.mark.parametrize("name", MULTIPLIERS)
def test_decoder_rejects_bad_multipliers(name: str) -> None:
    for value in (0.0, -1.0, math.inf, math.nan, True):
        with pytest.raises(ValueError, match=f"{name} must be a positive, finite"):
            _decoder(**{name: value})


# --- TransformerDecoder: training, compile, autocast --------------------------------


def test_decoder_trains_on_builtin_corpus() -> None:
    torch.manual_seed(0)
    corpus = Corpus(max_bytes=2**18)
    model = uu.TransformerDecoder(32, 256, layers=1, heads=2)
    opt = uu.optim.AdamW(model.parameters(), lr=2**-4)
    held_out = corpus.get_batch("validation", 16, 32, generator=123)
    with torch.no_grad():
        before = model.loss(held_out).item()
    gen = torch.Generator().manual_seed(0)
    for _ in range(16):
        opt.zero_grad()
        model.loss(corpus.get_batch("train", 8, 32, generator=gen)).backward()
        opt.step()
    with torch.no_grad():
        after = model.loss(held_out).item()
    assert math.isfinite(after)
    # ln 256 ≈ 5.5 at init; 16 steps learn at least the byte frequencies
    # (≈ 4.4 here).
    assert after < before - 0.75, (before, after)


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")
def test_decoder_compiles_fullgraph_and_matches_eager() -> None:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = uu.TransformerDecoder(32, 64, layers=2, heads=4)
    eager = copy.deepcopy(model)
    ids = _ids(64, 2, 17)

    # fullgraph=True raises on any graph break in the forward; AOTAutograd traces
    # and compiles the backward from the same graph.
    compiled_loss = torch.compile(model.loss, fullgraph=True)
    loss = compiled_loss(ids)
    loss.backward()
    eager_loss = eager.loss(ids)
    eager_loss.backward()

    assert not counters["graph_break"], dict(counters["graph_break"])
    torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
    # The tags survive, and an optimizer step followed by a new batch reuses
    # the compiled graph rather than recompiling.
    assert model.layers[0].mlp.linear_1.weight.mup_scaling_depth == 2
    uu.optim.AdamW(model.parameters(), lr=1e-3).step()
    with torch._dynamo.config.patch(error_on_recompile=True):
        compiled_loss(_ids(64, 2, 17, seed=1)).backward()


def test_decoder_bf16_autocast() -> None:
    torch.manual_seed(0)
    model = uu.TransformerDecoder(32, 64, layers=1, heads=2)
    ids = _ids(64, 2, 9)
    with torch.no_grad():
        reference = model.loss(ids)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(ids[:, :-1])
        loss = model.loss(ids)
    assert logits.dtype == torch.bfloat16
    loss.float().backward()
    torch.testing.assert_close(loss.float(), reference, rtol=0.02, atol=0.02)
    for name, param in model.named_parameters():
        assert param.grad is not None and param.grad.dtype == torch.float32, name
        assert torch.isfinite(param.grad).all() and param.grad.abs().sum() > 0, name
