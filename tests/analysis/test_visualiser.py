"""Tests for ``example_batch``, ``language_model_loss``, ``scales_graph`` and
``visualiser``: offline, on the built-in corpus."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from matplotlib.axes import Axes
from torch import Tensor, nn

import unit_scaling as uu
from unit_scaling.analysis import (
    example_batch,
    graph_to_dataframe,
    language_model_loss,
    scales_graph,
    visualiser,
)
from unit_scaling.data import VOCAB_SIZE


def test_example_batch_is_deterministic_byte_tokens() -> None:
    batch = example_batch(3, 20)
    assert batch.shape == (3, 21)
    assert batch.dtype == torch.long
    assert int(batch.min()) >= 0 and int(batch.max()) < VOCAB_SIZE
    assert torch.equal(batch, example_batch(3, 20))
    assert not torch.equal(batch, example_batch(3, 20, seed=1))
    assert not torch.equal(batch, example_batch(3, 20, split="train"))


class _Logits(nn.Module):
    """A bigram model whose output is configurable: tensor, tuple or HF-like."""

    def __init__(self, wrap: str = "tensor") -> None:
        super().__init__()
        self.table = nn.Embedding(VOCAB_SIZE, VOCAB_SIZE)
        self.wrap = wrap

    def forward(self, input_ids: Tensor) -> object:
        logits = self.table(input_ids)
        if self.wrap == "tuple":
            return (logits, None)
        if self.wrap == "object":
            return type("Output", (), {"logits": logits})()
        return logits


def _reference_loss(model: nn.Module, batch: Tensor) -> Tensor:
    logits = model.table(batch[:, :-1])  # type: ignore[operator]
    return F.cross_entropy(logits.flatten(end_dim=-2), batch[:, 1:].flatten())


@pytest.mark.parametrize("wrap", ["tensor", "tuple", "object"])
def test_language_model_loss_finds_the_logits(wrap: str) -> None:
    model, batch = _Logits(wrap), example_batch(2, 8)
    expected = _reference_loss(model, batch)
    assert language_model_loss(model, batch).item() == pytest.approx(expected.item())


def test_language_model_loss_prefers_loss_method_then_labels() -> None:
    batch = example_batch(2, 8)
    decoder = uu.TransformerDecoder(32, VOCAB_SIZE, layers=1, heads=2)
    assert torch.equal(language_model_loss(decoder, batch), decoder.loss(batch))

    class HFStyle(_Logits):
        def forward(self, input_ids: Tensor, labels: Tensor | None = None) -> object:
            assert labels is not None and torch.equal(labels, input_ids)
            logits = self.table(input_ids)[:, :-1]
            loss = F.cross_entropy(logits.flatten(end_dim=-2), labels[:, 1:].flatten())
            return type("Output", (), {"loss": loss, "logits": logits})()

    model = HFStyle()
    expected = _reference_loss(model, batch)
    assert language_model_loss(model, batch).item() == pytest.approx(expected.item())


def test_language_model_loss_rejects_unknown_outputs() -> None:
    class Odd(nn.Module):
        def forward(self, input_ids: Tensor) -> dict[str, Tensor]:
            return {"x": input_ids.float()}

    with pytest.raises(TypeError, match="loss_fn"):
        language_model_loss(Odd(), example_batch(1, 4))


def test_scales_graph_tracks_forward_and_backward() -> None:
    model = uu.TransformerDecoder(32, VOCAB_SIZE, layers=1, heads=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    df = graph_to_dataframe(scales_graph(model, example_batch(2, 8)))
    assert {"fwd", "bwd"} == set(df["direction"])
    assert "projection.weight" in set(df[df["direction"] == "bwd"]["name"])
    # the model itself is untouched: tracking runs on a copy
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_scales_graph_without_backward() -> None:
    model = _Logits()
    graph = scales_graph(model, example_batch(2, 8), backward=False)
    assert all(
        n.meta["metrics"].bwd is None for n in graph.nodes if "metrics" in n.meta
    )


def test_scales_graph_needs_a_scalar_loss_to_backpropagate() -> None:
    with pytest.raises(ValueError, match="scalar"):
        scales_graph(_Logits(), example_batch(2, 8), loss_fn=lambda m, b: m(b).float())


def test_visualiser_plots_a_unit_scaled_decoder(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = uu.TransformerDecoder(32, VOCAB_SIZE, layers=1, heads=2)
    ax = visualiser(model, batch_size=2, seq_len=16, title="u-μP", metric="std")
    assert isinstance(ax, Axes)
    assert ax.get_xlabel().startswith("standard deviation")
    path = tmp_path / "visualiser.png"
    ax.figure.savefig(path, dpi=60)
    assert path.stat().st_size > 10_000
    # unit scaled: every forward std within a factor 4 of 1 (readout excepted)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    xs = [float(x) for x, _ in ax.collections[0].get_offsets()]
    assert len(xs) == len(labels)
    inner = [x for x, label in zip(xs, labels, strict=True) if "logits" not in label]
    assert all(0.25 < x < 4 for x in inner), dict(zip(labels, xs, strict=True))


def test_visualiser_passes_plot_options() -> None:
    model = _Logits()
    ax = visualiser(model, batch_size=2, seq_len=8, xmin=2**-20, xmax=2**5)
    assert ax.get_xlim() == pytest.approx((2**-20, 2**5))
    with pytest.raises(ValueError, match="unknown metric"):
        visualiser(model, batch_size=2, seq_len=8, metric="nope")
