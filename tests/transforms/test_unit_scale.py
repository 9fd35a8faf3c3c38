"""Tests for ``unit_scale`` on small models that each exercise one construct real
models use (keyword inputs, structured outputs, integer positions, in-place adds,
masks, attention keywords), plus its logs, parameter initialisation,
``replace=`` and errors. Every zoo architecture is checked in ``test_zoo.py``."""

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
from tests.helpers import unit_backward
from unit_scaling import zoo
from unit_scaling.transforms import unit_scale

LOGGER = "unit_scaling.transforms.unit_scale"
LAYERS = 2


def assert_same_direction(got: Tensor, want: Tensor, name: str = "") -> None:
    """``got`` is a positive multiple of ``want`` (a calibrated gradient scale)."""
    got, want = got.double().flatten(), want.double().flatten()
    cosine = torch.dot(got, want) / (got.norm() * want.norm())
    assert float(cosine) == pytest.approx(1, abs=1e-6), name


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _logs_of_first_call(name: str) -> tuple[nn.Module, nn.Module, list[str]]:
    case = zoo.get(name)
    original = case.make(0)
    logger, handler = logging.getLogger(LOGGER), _Collect()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        scaled = unit_scale(original)
        case.run(scaled, 0, 0)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return original, scaled, handler.messages


_LOGS: dict[str, tuple[nn.Module, nn.Module, list[str]]] = {}


def _first_call(name: str) -> tuple[nn.Module, nn.Module, list[str]]:
    if name not in _LOGS:
        _LOGS[name] = _logs_of_first_call(name)
    return _LOGS[name]


# --------------------------------------------------------------------------- #
# Parameters: independent copies, names kept, initialised for their role.
# --------------------------------------------------------------------------- #

MODELS = ["nanogpt", "gpt2", "llama", "bert", "transformer-encoder", "mlp"]


@pytest.mark.parametrize("name", MODELS)
def test_parameters_are_independent_copies_with_the_same_names(name: str) -> None:
    original, scaled, _ = _first_call(name)
    assert not {p.data_ptr() for p in original.parameters()} & {
        p.data_ptr() for p in scaled.parameters()
    }
    assert scaled.state_dict().keys() == original.state_dict().keys()


@pytest.mark.parametrize("name", MODELS)
def test_parameters_initialised_for_their_role(name: str) -> None:
    original, scaled, _ = _first_call(name)
    before = dict(original.named_parameters(remove_duplicate=False))
    after = dict(scaled.named_parameters(remove_duplicate=False))
    records = scaled.unit_scale_report().parameters
    assert {r.name for r in records} <= after.keys()
    assert records, "no parameter was seen in the graph"
    layers = (nn.Linear, nn.Embedding, nn.MultiheadAttention)
    by_layer = {
        f"{prefix}.{attr}" if prefix else attr
        for prefix, module in original.named_modules()
        if isinstance(module, layers)
        for attr, _ in module.named_parameters(recurse=False)
    }
    for record in records:
        new, old = after[record.name], before[record.name]
        if record.name in by_layer:
            continue  # initialised when unit_scale is called: checked below
        if record.role in ("weight", "table"):
            assert new.std().item() == pytest.approx(1, abs=1e-5), record
        elif record.role in ("bias", "norm bias"):
            assert torch.all(new == 0), record
        elif record.role in ("gain", "norm"):
            assert torch.all(new == 1), record
        else:
            assert torch.equal(new, old), record
    for layer_name in by_layer:
        new = after[layer_name]
        if "weight" in layer_name.rsplit(".", 1)[-1]:
            assert new.std().item() == pytest.approx(1, abs=1e-5), layer_name
        else:
            assert torch.all(new == 0), layer_name


def test_tied_weights_stay_tied() -> None:
    model = unit_scale(zoo.get("nanogpt").make(0))
    assert model.lm_head.weight is model.wte.weight
    assert model.wte.weight.std().item() == pytest.approx(1, abs=1e-5)


def test_parameters_initialised_once_and_kept_by_copies() -> None:
    """Graph-read roles initialise at the first capture only: values set after
    it (training) survive later captures and copies of the module."""
    model = unit_scale(zoo.get("mixtral").make(0))
    case = zoo.get("mixtral")
    case.run(model, 0, 0)
    experts = [p for n, p in model.named_parameters() if "experts" in n]
    assert experts and all(
        p.std().item() == pytest.approx(1, abs=1e-4) for p in experts
    )
    with torch.no_grad():
        for p in experts:
            p.mul_(3)
    case.run(model, 0, 1)  # a second capture, at other shapes
    copied = copy.deepcopy(model)
    case.run(copied, 0, 0)
    for p in (*experts, *(p for n, p in copied.named_parameters() if "experts" in n)):
        assert p.std().item() == pytest.approx(3, abs=1e-3)


# --------------------------------------------------------------------------- #
# Logs and residual detection.
# --------------------------------------------------------------------------- #


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
def test_logs(pattern: str) -> None:
    logs = _first_call("nanogpt")[2]
    assert any(re.search(pattern, m) for m in logs), logs


def test_nanogpt_two_residual_adds_per_layer() -> None:
    logs = _first_call("nanogpt")[2]
    residual = [m for m in logs if "residual-add" in m]
    assert len(residual) == 2 * LAYERS
    assert sum("tau=0.01" in m for m in residual) == LAYERS  # attention branches
    assert sum("tau=0.5" in m for m in residual) == LAYERS  # MLP branches
    # The tied LM head's weight is the embedding's: rescaled once.
    assert sum(m.startswith("unit scaling weight: wte.") for m in logs) == 1
    assert not any("lm_head" in m for m in logs if "weight:" in m)


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert", "transformer-encoder"])
def test_residual_adds_found_in_each_layer(name: str) -> None:
    logs = _first_call(name)[2]
    residual = [m for m in logs if "residual-add" in m]
    assert len(residual) == 2 * LAYERS, residual
    assert sum("tau=0.01" in m for m in residual) == LAYERS, residual  # attention
    assert sum("tau=0.5" in m for m in residual) == LAYERS, residual  # MLP


def test_mlp_has_no_residual_add() -> None:
    assert not any("residual-add" in m for m in _first_call("mlp")[2])


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


def test_without_replace_hand_written_gelu_is_recognised() -> None:
    # No replace=: the tanh formula is recognised numerically as GELU (within the
    # approximation's error), and the report says so.
    model = unit_scale(GeluMLP())
    x = torch.randn(8, 16)
    out = model(x)
    torch.testing.assert_close(out, _gelu_mlp_reference(model, x), atol=2e-3, rtol=0)
    assert any("gelu" in r.op for r in model.unit_scale_report().ops)


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
    replaced = unit_scale(plain, replace={hand_written_gelu: U.silu})
    x = torch.randn(8, 16)
    assert not torch.allclose(plain(x), replaced(x), atol=1e-2)
    assert not torch.allclose(unit_scale(plain)(x), replaced(x), atol=1e-2)


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
    """The same gradients as the functional composition, up to each parameter's
    calibrated scale."""
    model = unit_scale(Constructs())
    reference = copy.deepcopy(model)
    ids, position_ids, mask = _constructs_inputs()
    unit_backward(model(ids, position_ids=position_ids, mask=mask).hidden)
    unit_backward(_constructs_reference(reference, ids, position_ids, mask))
    for (name, p), q in zip(
        model.named_parameters(), reference.parameters(), strict=True
    ):
        assert p.grad is not None and q.grad is not None, name
        assert_same_direction(p.grad, q.grad, name)


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
