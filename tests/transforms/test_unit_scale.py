"""Tests for ``unit_scale`` on the model zoo and on small models that each exercise
one construct real models use (keyword inputs, structured outputs, integer
positions, in-place adds, masks, attention keywords), plus its logs, weights,
``replace=`` and errors."""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import re
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import unit_scaling.functional as U
from tests.transforms.models import (
    CASES,
    LAYERS,
    ModelCase,
    NanoGPT,
    measure_scales,
    unit_backward,
)
from unit_scaling.transforms import unit_scale

LOGGER = "unit_scaling.transforms.unit_scale"


def _grads(model: nn.Module) -> dict[str, Tensor]:
    return {
        name: p.grad.clone()
        for name, p in model.named_parameters()
        if p.grad is not None
    }


# --------------------------------------------------------------------------- #
# The model zoo: one transform per family, shared by the tests below.
# --------------------------------------------------------------------------- #


@dataclasses.dataclass
class Transformed:
    case: ModelCase
    original: nn.Module
    state_before: dict[str, Tensor]
    output_before: Tensor
    scaled: nn.Module
    output: Tensor
    grads: dict[str, Tensor]
    logs: list[str]


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _run_transform(case: ModelCase) -> Transformed:
    original = case.make()
    state_before = {k: v.clone() for k, v in original.state_dict().items()}
    with torch.no_grad():
        output_before = case.run(original)
    logger, handler = logging.getLogger(LOGGER), _Collect()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        scaled = unit_scale(original)
        output = case.run(scaled)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    unit_backward(output)
    return Transformed(
        case,
        original,
        state_before,
        output_before,
        scaled,
        output,
        _grads(scaled),
        handler.messages,
    )


_TRANSFORMED: dict[str, Transformed] = {}


def _transform(name: str) -> Transformed:
    """``unit_scale`` of the family's model, run forward and backward (cached)."""
    if name not in _TRANSFORMED:
        _TRANSFORMED[name] = _run_transform(CASES[name])
    return _TRANSFORMED[name]


@pytest.fixture(scope="module", params=list(CASES))
def transformed(request: pytest.FixtureRequest) -> Transformed:
    return _transform(request.param)


def test_output_and_gradients_finite(transformed: Transformed) -> None:
    assert torch.isfinite(transformed.output).all()
    used = dict(transformed.scaled.named_parameters())
    assert transformed.grads.keys() == used.keys(), "a parameter got no gradient"
    for name, grad in transformed.grads.items():
        assert torch.isfinite(grad).all(), name


def test_input_module_not_mutated(transformed: Transformed) -> None:
    original = transformed.original
    for name, value in original.state_dict().items():
        assert torch.equal(value, transformed.state_before[name]), name
    assert all(p.grad is None for p in original.parameters())
    assert "forward" not in vars(original)
    assert not hasattr(original, "scales_graph")
    with torch.no_grad():
        torch.testing.assert_close(
            transformed.case.run(original), transformed.output_before, rtol=0, atol=0
        )


def test_parameters_are_independent_copies(transformed: Transformed) -> None:
    original = {p.data_ptr() for p in transformed.original.parameters()}
    copied = {p.data_ptr() for p in transformed.scaled.parameters()}
    assert not original & copied


def test_state_dict_keys_kept(transformed: Transformed) -> None:
    # Library rewrites (HF Conv1D, RMSNorm, GELU) keep parameter names, so
    # checkpoints of the original architecture still load.
    assert (
        transformed.scaled.state_dict().keys()
        == transformed.original.state_dict().keys()
    )


def _is_weighted_layer(module: nn.Module) -> bool:
    hf_conv1d = type(module).__name__ == "Conv1D"
    return hf_conv1d or isinstance(
        module, (nn.Linear, nn.Embedding, nn.MultiheadAttention)
    )


def test_weights_unit_and_biases_zero(transformed: Transformed) -> None:
    scaled = dict(transformed.scaled.named_parameters(remove_duplicate=False))
    checked = 0
    for prefix, module in transformed.original.named_modules():
        for attr, param in module.named_parameters(recurse=False):
            name = f"{prefix}.{attr}" if prefix else attr
            new = scaled[name]
            if not _is_weighted_layer(module):
                assert torch.equal(new, param), f"{name} changed"
            elif "weight" in attr:
                checked += 1
                assert new.std().item() == pytest.approx(1, abs=1e-5), name
                assert not torch.equal(new, param), f"{name} not rescaled"
            else:
                checked += 1
                assert torch.all(new == 0), f"{name} not zeroed"
    assert checked > 0


def test_tied_weights_stay_tied() -> None:
    model = unit_scale(NanoGPT())
    assert model.lm_head.weight is model.wte.weight
    assert model.wte.weight.std().item() == pytest.approx(1, abs=1e-5)


# --------------------------------------------------------------------------- #
# Scale fractions: the acceptance criterion.
# --------------------------------------------------------------------------- #

MIN_FRACTION = 0.9

# Names of the tensors each family may legitimately exclude (see ScaleReport).
CONSTANT = {
    "mlp": r"$^",
    "encoder": r"mask|zeros_like",
    "nanogpt": r"$^",
    "gpt2": r"mask",
    "llama": r"rotary|inv_freq|freqs|cos|sin|float",
    "bert": r"mask",
}
ZERO_GRAD = {name: r"$^" for name in CASES} | {
    "bert": r"encoder\.layer\.\d\.attention\.self\.key\.bias"
}


def _fraction_param(name: str) -> object:
    marks: dict[str, pytest.MarkDecorator] = {}
    return pytest.param(name, marks=marks.get(name, ()))


@pytest.mark.parametrize("name", [_fraction_param(name) for name in CASES])
def test_scale_fraction(name: str) -> None:
    report = measure_scales(CASES[name])
    assert report.fraction >= MIN_FRACTION, f"{name}: {report.describe()}"


@pytest.mark.parametrize("name", list(CASES))
def test_excluded_tensors_are_legitimate(name: str) -> None:
    report = measure_scales(CASES[name])
    for excluded in report.constant:
        assert re.search(CONSTANT[name], excluded), f"{name}: {report.describe()}"
    for excluded in report.zero_grad:
        assert re.search(ZERO_GRAD[name], excluded), f"{name}: {report.describe()}"
    if name == "bert":  # the key bias of every layer, and nothing else
        assert len(report.zero_grad) == LAYERS


# --------------------------------------------------------------------------- #
# Logs and residual detection.
# --------------------------------------------------------------------------- #


@pytest.fixture(scope="module")
def nanogpt_logs() -> list[str]:
    return _transform("nanogpt").logs


@pytest.mark.parametrize(
    "pattern",
    [
        r"^unit scaling function: ",
        r"\(residual-add, tau=0\.5\)$",
        r"\(residual-add, tau=0\.01\)$",
        r"^unconstraining node: logits$",
        r"^unit scaling weight: h\.0\.attn\.c_attn\.weight$",
        r"^unit scaling weight: wte\.weight$",
        r"^setting bias to zero: h\.0\.attn\.c_attn\.bias$",
    ],
)
def test_logs(nanogpt_logs: list[str], pattern: str) -> None:
    assert any(re.search(pattern, m) for m in nanogpt_logs), nanogpt_logs


def test_nanogpt_two_residual_adds_per_layer(nanogpt_logs: list[str]) -> None:
    residual = [m for m in nanogpt_logs if "residual-add" in m]
    assert len(residual) == 2 * LAYERS
    assert sum("tau=0.01" in m for m in residual) == LAYERS  # attention branches
    assert sum("tau=0.5" in m for m in residual) == LAYERS  # MLP branches
    # The tied LM head's weight is the embedding's: rescaled once.
    assert sum(m.startswith("unit scaling weight: wte.") for m in nanogpt_logs) == 1
    assert not any("lm_head" in m for m in nanogpt_logs if "weight:" in m)


def test_residual_adds_found_in_each_layer(
    transformed: Transformed, request: pytest.FixtureRequest
) -> None:
    name = transformed.case.name
    if name == "mlp":
        assert not any("residual-add" in m for m in transformed.logs)
        return
    residual = [m for m in transformed.logs if "residual-add" in m]
    assert len(residual) == 2 * LAYERS, residual
    assert sum("tau=0.01" in m for m in residual) == LAYERS, residual  # attention
    assert sum("tau=0.5" in m for m in residual) == LAYERS, residual  # MLP


def test_post_norm_residual_numerics() -> None:
    """``norm(x + f(x))`` (post-norm, as BERT and nn.TransformerEncoder): the add
    is a residual add, so the result matches the functional composition."""

    class PostNorm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(16, 16)
            self.norm = nn.LayerNorm(16)

        def forward(self, x: Tensor) -> Tensor:
            return self.norm(x + F.relu(self.fc(x)))

    model = unit_scale(PostNorm())
    x = torch.randn(8, 16)
    residual, skip = U.residual_split(x, 0.5)
    branch = U.relu(U.linear(residual, model.fc.weight, model.fc.bias))
    expected = U.layer_norm(
        U.residual_add(branch, skip, 0.5), (16,), model.norm.weight, model.norm.bias
    )
    torch.testing.assert_close(model(x), expected, rtol=0, atol=0)


# --------------------------------------------------------------------------- #
# replace=
# --------------------------------------------------------------------------- #


def hand_written_gelu(x: Tensor) -> Tensor:
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


class HandWrittenGELU(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return hand_written_gelu(x)


class GeluMLP(nn.Module):
    def __init__(self, act: nn.Module | None = None) -> None:
        super().__init__()
        self.up = nn.Linear(16, 32)
        self.act = act
        self.down = nn.Linear(32, 16)

    def forward(self, x: Tensor) -> Tensor:
        h = self.up(x)
        h = self.act(h) if self.act is not None else hand_written_gelu(h)
        return self.down(h)


def _gelu_mlp_reference(model: nn.Module, x: Tensor) -> Tensor:
    # No residual add: every op is "after the last residual", so unconstrained.
    h = U.linear(x, model.up.weight, model.up.bias, constraint=None)
    h = U.gelu(h, constraint=None)
    return U.linear(h, model.down.weight, model.down.bias, constraint=None)


def test_replace_function(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    model = unit_scale(GeluMLP(), replace={hand_written_gelu: U.gelu})
    x = torch.randn(8, 16)
    torch.testing.assert_close(model(x), _gelu_mlp_reference(model, x))
    assert any(r.getMessage().startswith("replacing function:") for r in caplog.records)


def test_without_replace_hand_written_gelu_is_not_gelu() -> None:
    model = unit_scale(GeluMLP())
    x = torch.randn(8, 16)
    assert not torch.allclose(model(x), _gelu_mlp_reference(model, x), atol=1e-3)


def test_replace_module_class(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    model = unit_scale(GeluMLP(HandWrittenGELU()), replace={HandWrittenGELU: U.gelu})
    x = torch.randn(8, 16)
    torch.testing.assert_close(model(x), _gelu_mlp_reference(model, x))
    assert any(
        r.getMessage().startswith("replacing module: act") for r in caplog.records
    )


def test_replace_is_per_call() -> None:
    # The replacement applies to the returned module only.
    plain = GeluMLP()
    replaced = unit_scale(plain, replace={hand_written_gelu: U.gelu})
    x = torch.randn(8, 16)
    assert not torch.allclose(plain(x), replaced(x), atol=1e-3)
    assert not torch.allclose(unit_scale(plain)(x), replaced(x), atol=1e-3)


def test_replace_unknown_target_reported(caplog: pytest.LogCaptureFixture) -> None:
    def never_called(x: Tensor) -> Tensor:
        return x

    caplog.set_level(logging.WARNING)
    reported = ""
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        try:
            model = unit_scale(GeluMLP(), replace={never_called: U.gelu})
            model(torch.randn(2, 16))
        except Exception as error:  # an error naming the key is fine too
            reported = str(error)
    reported += " ".join(str(w.message) for w in warned)
    reported += " ".join(r.getMessage() for r in caplog.records)
    assert "never_called" in reported


# --------------------------------------------------------------------------- #
# Bad inputs.
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("bad", ["model", lambda x: x, torch.randn(2), None])
def test_non_module_raises(bad: object) -> None:
    with pytest.raises(TypeError, match=r"nn\.Module"):
        unit_scale(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "replace", [{"gelu": U.gelu}, {F.gelu: "U.gelu"}, {F.gelu: None}, {1: U.gelu}]
)
def test_non_callable_replace_raises(replace: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(TypeError, match="replace"):
        unit_scale(GeluMLP(), replace=replace)


class Untraceable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    @torch._dynamo.disable
    def forward(self, x: Tensor) -> Tensor:
        return self.fc(x)


def test_untraceable_forward_error_names_construct_and_suggests_replace() -> None:
    model = unit_scale(Untraceable())
    with pytest.raises(RuntimeError) as error:
        model(torch.randn(2, 8))
    message = str(error.value)
    assert "Untraceable" in message
    assert "disable" in message  # the construct that stopped tracing
    assert "replace=" in message


# --------------------------------------------------------------------------- #
# Constructs real models use.
# --------------------------------------------------------------------------- #


@dataclasses.dataclass
class Output:
    hidden: Tensor
    extras: dict[str, object]


class Constructs(nn.Module):
    """Keyword-only inputs, integer positions, an in-place residual add, a float
    additive mask, attention with ``scale=`` and ``enable_gqa=``, and a
    dataclass holding a dict holding a tuple as output."""

    def __init__(self, width: int = 32, heads: int = 4, kv_heads: int = 2) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, width // heads
        self.embed = nn.Embedding(16, width)
        self.positions = nn.Embedding(16, width)
        self.q = nn.Linear(width, width)
        self.kv = nn.Linear(width, 2 * kv_heads * self.head_dim)
        self.o = nn.Linear(width, width)

    def forward(
        self, ids: Tensor, *, position_ids: Tensor, mask: Tensor | None = None
    ) -> Output:
        batch, seq = ids.shape
        x = self.embed(ids) + self.positions(position_ids)
        q = self.q(x).view(batch, seq, self.heads, -1).transpose(1, 2)
        k, v = (
            self.kv(x)
            .view(batch, seq, 2 * self.kv_heads, -1)
            .transpose(1, 2)
            .chunk(2, dim=1)
        )
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=self.head_dim**-0.5, enable_gqa=True
        )
        x += self.o(y.transpose(1, 2).reshape(batch, seq, -1))  # in place
        last = position_ids.max() + 1  # integer arithmetic
        return Output(x, {"pair": (x.sum(), last), "none": None})


def _constructs_inputs() -> tuple[Tensor, Tensor, Tensor]:
    ids = torch.randint(16, (2, 8), generator=torch.Generator().manual_seed(0))
    position_ids = torch.arange(8).expand(2, 8)
    mask = torch.zeros(8, 8).masked_fill(
        torch.ones(8, 8, dtype=torch.bool).triu(1), float("-inf")
    )
    return ids, position_ids, mask


def _constructs_reference(
    model: Constructs, ids: Tensor, position_ids: Tensor, mask: Tensor
) -> Tensor:
    batch, seq = ids.shape
    x = U.add(
        U.embedding(ids, model.embed.weight),
        U.embedding(position_ids, model.positions.weight),
    )
    residual, skip = U.residual_split(x, 0.01)
    q = U.linear(residual, model.q.weight, model.q.bias)
    q = q.view(batch, seq, model.heads, -1).transpose(1, 2)
    kv = U.linear(residual, model.kv.weight, model.kv.bias)
    k, v = kv.view(batch, seq, 2 * model.kv_heads, -1).transpose(1, 2).chunk(2, 1)
    y = U.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, scale=model.head_dim**-0.5, enable_gqa=True
    )
    out = U.linear(
        y.transpose(1, 2).reshape(batch, seq, -1), model.o.weight, model.o.bias
    )
    return U.residual_add(out, skip, 0.01)


def test_constructs_real_models_use(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    original = Constructs()
    model = unit_scale(original)
    ids, position_ids, mask = _constructs_inputs()
    out = model(ids, position_ids=position_ids, mask=mask)
    assert isinstance(out, Output)
    assert out.extras["none"] is None
    total, last = out.extras["pair"]
    assert isinstance(last, Tensor) and last.dtype == torch.long and last.item() == 8
    torch.testing.assert_close(total, out.hidden.sum())
    expected = _constructs_reference(model, ids, position_ids, mask)
    torch.testing.assert_close(out.hidden, expected)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("(residual-add, tau=0.01)" in m for m in messages) == 1
    grad = unit_backward(out.hidden)
    assert grad is not None
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_constructs_gradients_match_reference() -> None:
    model = unit_scale(Constructs())
    reference = copy.deepcopy(model)
    ids, position_ids, mask = _constructs_inputs()
    unit_backward(model(ids, position_ids=position_ids, mask=mask).hidden)
    unit_backward(_constructs_reference(reference, ids, position_ids, mask))
    for (name, p), q in zip(
        model.named_parameters(), reference.parameters(), strict=True
    ):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


def test_dict_and_tuple_outputs() -> None:
    class Outputs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
            y = self.fc(x)
            return y, {"relu": F.relu(y), "shape": torch.tensor(y.shape)}

    model = unit_scale(Outputs())
    x = torch.randn(4, 8)
    y, extras = model(x)
    torch.testing.assert_close(
        y, U.linear(x, model.fc.weight, model.fc.bias, constraint=None)
    )
    torch.testing.assert_close(extras["relu"], U.relu(y, constraint=None))
    assert extras["shape"].tolist() == [4, 8]


def test_empty_and_one_element_tensors() -> None:
    class Odd(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            y = self.fc(x)
            return y, self.fc(x[:0]), y.mean()

    y, empty, mean = unit_scale(Odd())(torch.randn(4, 8))
    assert empty.shape == (0, 8)
    assert torch.isfinite(y).all() and torch.isfinite(mean)


def test_inplace_activation() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(inplace=True), nn.Linear(16, 8))
    scaled = unit_scale(model)
    x = torch.randn(4, 8)
    h = U.relu(
        U.linear(x, scaled[0].weight, scaled[0].bias, constraint=None), constraint=None
    )
    expected = U.linear(h, scaled[2].weight, scaled[2].bias, constraint=None)
    torch.testing.assert_close(scaled(x), expected)


def test_bool_padding_mask_in_attention() -> None:
    class Masked(nn.Module):
        def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    q, k, v = torch.randn(3, 2, 4, 8, 16).unbind(0)
    mask = torch.ones(2, 1, 8, 8, dtype=torch.bool)
    mask[0, :, :, 5:] = False
    out = unit_scale(Masked())(q, k, v, mask)
    expected = U.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.25)
    torch.testing.assert_close(out, expected)
