"""The model zoo the transform tests share, and how to measure a model's scales.

Each :class:`ModelCase` builds a small model with random weights (nothing is
downloaded), makes inputs for it, picks its main output (logits or last hidden
state) and defines a loss. :func:`measure_scales` runs
``track_scales(unit_scale(model))`` forward and backward and reports which tensors
are unit-scaled.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.fx import Graph

from tests.helpers import unit_backward
from unit_scaling import zoo
from unit_scaling.transforms import prune_same_scale_tensors, track_scales, unit_scale

VOCAB = 64
WIDTH = 32
HEADS = 4
LAYERS = 2
SEQ = 16
BATCH = 4

Inputs = tuple[tuple[Any, ...], dict[str, Any]]


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _ids(seed: int) -> Tensor:
    return torch.randint(VOCAB, (BATCH, SEQ), generator=_generator(seed))


# --------------------------------------------------------------------------- #
# Models written here.
# --------------------------------------------------------------------------- #


class MLP(nn.Module):
    """Two-layer GELU MLP: the toy model every implementation handles."""

    def __init__(self, width: int = WIDTH, hidden: int = 4 * WIDTH) -> None:
        super().__init__()
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.gelu(self.up(x)))


class Encoder(nn.Module):
    """``nn.TransformerEncoder`` (batch first, post-norm) with a padding mask."""

    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(
            WIDTH, HEADS, dim_feedforward=2 * WIDTH, dropout=0.0, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)

    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        return self.encoder(x, src_key_padding_mask=padding_mask)


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        batch, seq, width = x.shape
        q, k, v = self.c_attn(x).split(width, dim=2)
        q, k, v = (
            t.view(batch, seq, self.heads, width // self.heads).transpose(1, 2)
            for t in (q, k, v)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(batch, seq, width))


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class NanoGPT(nn.Module):
    """A nanoGPT-style causal transformer: learned positions, pre-norm blocks,
    ``F.scaled_dot_product_attention(is_causal=True)``, LM head tied to the token
    embedding. Returns ``(logits, loss)``, the loss ``None`` without targets."""

    def __init__(
        self,
        vocab: int = VOCAB,
        width: int = WIDTH,
        heads: int = HEADS,
        layers: int = LAYERS,
        max_seq: int = 2 * SEQ,
    ) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(max_seq, width)
        self.h = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if name.endswith("weight") and p.dim() == 2:
                nn.init.normal_(p, std=0.02)
            elif name.endswith("bias"):
                nn.init.normal_(p, std=0.02)  # nonzero: unit_scale must zero it

    def forward(
        self, idx: Tensor, targets: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(positions)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss


# --------------------------------------------------------------------------- #
# Hugging Face models from small configs (random weights, nothing downloaded).
# --------------------------------------------------------------------------- #


def hf_gpt2() -> nn.Module:
    model = zoo.hf_model(
        "gpt2",
        vocab_size=VOCAB,
        n_positions=2 * SEQ,
        n_embd=WIDTH,
        n_layer=LAYERS,
        n_head=HEADS,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
        attn_implementation="sdpa",
    )
    return _randomise_biases(model)


def hf_llama() -> nn.Module:
    return zoo.hf_model(
        "llama",
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        intermediate_size=2 * WIDTH,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS // 2,  # grouped-query attention
        max_position_embeddings=2 * SEQ,
        use_cache=False,
        attn_implementation="sdpa",
    )


def hf_bert() -> nn.Module:
    masked_lm = zoo.hf_model(
        "bert",
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=2 * WIDTH,
        max_position_embeddings=2 * SEQ,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        attn_implementation="sdpa",
    )
    encoder: nn.Module = masked_lm.bert  # the encoder without its head or pooler
    return _randomise_biases(encoder)


def _randomise_biases(model: nn.Module) -> nn.Module:
    """HF initialises biases to zero; make them nonzero so that zeroing shows."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(std=0.02, generator=_generator(1))
    return model


# --------------------------------------------------------------------------- #
# Cases: a model, its inputs, its main output and its loss.
# --------------------------------------------------------------------------- #


def _float_inputs(seed: int) -> Inputs:
    return (torch.randn(BATCH, SEQ, WIDTH, generator=_generator(seed)),), {}


def _encoder_inputs(seed: int) -> Inputs:
    x = torch.randn(BATCH, SEQ, WIDTH, generator=_generator(seed))
    padding = torch.zeros(BATCH, SEQ, dtype=torch.bool)
    padding[0, SEQ // 2 :] = True  # the first sequence is half padding
    return (x,), {"padding_mask": padding}


def _lm_inputs(seed: int) -> Inputs:
    return (_ids(seed),), {}


def _hf_lm_inputs(seed: int) -> Inputs:
    return (), {"input_ids": _ids(seed)}


def _bert_inputs(seed: int) -> Inputs:
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[0, SEQ // 2 :] = 0
    token_types = torch.zeros(BATCH, SEQ, dtype=torch.long)
    token_types[:, SEQ // 2 :] = 1
    return (), {
        "input_ids": _ids(seed),
        "attention_mask": mask,
        "token_type_ids": token_types,
    }


def _mse_loss(output: Tensor, seed: int) -> Tensor:
    target = torch.randn(output.shape, generator=_generator(seed + 1000))
    return F.mse_loss(output.float(), target)


def _lm_loss(output: Tensor, seed: int) -> Tensor:
    return F.cross_entropy(output.flatten(0, 1).float(), _ids(seed + 1000).flatten())


@dataclasses.dataclass(frozen=True)
class ModelCase:
    """A model family: how to build it, feed it, read it and score it."""

    name: str
    build: Callable[[], nn.Module]
    inputs: Callable[[int], Inputs]
    main_output: Callable[[Any], Tensor]
    loss: Callable[[Tensor, int], Tensor]

    def make(self, seed: int = 0) -> nn.Module:
        torch.manual_seed(seed)
        return self.build()

    def run(self, model: nn.Module, seed: int = 0) -> Tensor:
        """The main output of ``model`` on this case's inputs for ``seed``."""
        args, kwargs = self.inputs(seed)
        return self.main_output(model(*args, **kwargs))

    def __str__(self) -> str:
        return self.name


def _first(output: Any) -> Tensor:
    return output[0]


CASES: dict[str, ModelCase] = {
    case.name: case
    for case in (
        ModelCase("mlp", MLP, _float_inputs, lambda out: out, _mse_loss),
        ModelCase("encoder", Encoder, _encoder_inputs, lambda out: out, _mse_loss),
        ModelCase("nanogpt", NanoGPT, _lm_inputs, _first, _lm_loss),
        ModelCase("gpt2", hf_gpt2, _hf_lm_inputs, lambda o: o.logits, _lm_loss),
        ModelCase("llama", hf_llama, _hf_lm_inputs, lambda o: o.logits, _lm_loss),
        ModelCase(
            "bert", hf_bert, _bert_inputs, lambda o: o.last_hidden_state, _mse_loss
        ),
    )
}


# --------------------------------------------------------------------------- #
# Measuring scales.
# --------------------------------------------------------------------------- #

SCALE_RANGE = (0.5, 2.0)
# A gradient this small in a unit-scaled model is zero by construction, up to
# rounding (e.g. a key bias: softmax is invariant to adding a constant per query).
ZERO_GRADIENT_RMS = 1e-4


def rms(data: Any) -> float:
    """RMS of a tensor from its ``Metrics.Data``: ``sqrt(std² + abs_mean²)``."""
    return math.sqrt(data.std**2 + data.abs_mean**2)


@dataclasses.dataclass
class ScaleReport:
    """Which tracked tensors of a unit-scaled model are unit-scaled.

    Each entry of ``scales`` is ``("fwd" | "bwd", clean_name, rms)``; ``constant``
    names float tensors that carry no gradient (masks, rotary tables, position
    arithmetic) and ``zero_grad`` those whose gradient is zero up to rounding
    (:data:`ZERO_GRADIENT_RMS`). Neither is counted.
    """

    scales: list[tuple[str, str, float]]
    constant: list[str]
    zero_grad: list[str]
    graph: Graph

    @property
    def failing(self) -> list[tuple[str, str, float]]:
        low, high = SCALE_RANGE
        return [s for s in self.scales if not low <= s[2] <= high]

    @property
    def fraction(self) -> float:
        return 1 - len(self.failing) / len(self.scales)

    def describe(self) -> str:
        failing = ", ".join(f"{d}:{n}={v:.3g}" for d, n, v in self.failing)
        return (
            f"{self.fraction:.1%} of {len(self.scales)} scales in {SCALE_RANGE}; "
            f"failing: [{failing}]; constant: {self.constant}; "
            f"zero gradient: {self.zero_grad}"
        )


def scale_report(graph: Graph) -> ScaleReport:
    """Sort the tracked tensors of ``graph`` (a ``scales_graph()``) as documented
    on :class:`ScaleReport`; views of a tensor count once."""
    graph = prune_same_scale_tensors(graph)
    scales: list[tuple[str, str, float]] = []
    constant: list[str] = []
    zero_grad: list[str] = []
    for node in graph.nodes:
        metrics = node.meta.get("metrics")
        if metrics is None:
            continue
        name = node.meta["clean_name"]
        if metrics.bwd is None:
            constant.append(name)
            continue
        if not node.meta["requires_grad"]:  # an activation, not a parameter
            scales.append(("fwd", name, rms(metrics.fwd)))
        if rms(metrics.bwd) < ZERO_GRADIENT_RMS:
            zero_grad.append(name)
        else:
            scales.append(("bwd", name, rms(metrics.bwd)))
    return ScaleReport(scales, constant, zero_grad, graph)


def tracked_unit_scaled(case: ModelCase, seed: int = 0) -> tuple[nn.Module, Graph]:
    """``track_scales(unit_scale(model))`` after a forward pass and a unit-normal
    backward pass from the main output, and its ``scales_graph()``.

    Cached per case and seed, so test files share one run; treat the results as
    read-only (the ``prune_*`` functions return copies).
    """
    key = (case.name, seed)
    if key not in _TRACKED:
        model = track_scales(unit_scale(case.make(seed)))
        unit_backward(case.run(model, seed), seed + 2000)
        _TRACKED[key] = model, model.scales_graph()
    return _TRACKED[key]


_TRACKED: dict[tuple[str, int], tuple[nn.Module, Graph]] = {}


def measure_scales(case: ModelCase, seed: int = 0) -> ScaleReport:
    """Unit-scale ``case``'s model, track it, run forward and a unit-normal
    backward from the main output, and report its scales."""
    return scale_report(tracked_unit_scaled(case, seed)[1])
