"""``visualiser``: plot a language model's scales on built-in text, fully offline."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.fx import Graph

from ..transforms import track_scales
from ._corpus import analysis_corpus
from ._optional import require_plot_extra
from .plot import plot

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["example_batch", "language_model_loss", "scales_graph", "visualiser"]

LossFn = Callable[[nn.Module, Tensor], Tensor]


def example_batch(
    batch_size: int = 4,
    seq_len: int = 64,
    *,
    split: str = "validation",
    seed: int = 0,
    device: torch.device | str | None = None,
) -> Tensor:
    """A batch of byte tokens from the built-in corpus (no download).

    The corpus is the Python standard library's source (see
    :mod:`unit_scaling.data`); tokens are bytes, so any model with a vocabulary of
    at least 256 accepts them.

    Args:
        batch_size: number of sequences.
        seq_len: number of input tokens per sequence.
        split: ``"train"`` or ``"validation"``.
        seed: the same seed gives the same batch on every machine with the same
            Python version.
        device: where to put the batch. Default: CPU.

    Returns:
        A ``torch.long`` tensor ``(batch_size, seq_len + 1)``: the inputs are
        ``batch[:, :-1]`` and the next-token targets ``batch[:, 1:]``.

    Example::

        >>> example_batch(2, 16).shape
        torch.Size([2, 17])
    """
    return analysis_corpus().get_batch(split, batch_size, seq_len, seed, device=device)


def _logits(output: Any) -> Tensor:
    """The first tensor of a model output: itself, a tuple's first element, or a
    Hugging Face output's ``.logits``."""
    if isinstance(output, Tensor):
        return output
    logits = getattr(output, "logits", None)
    if isinstance(logits, Tensor):
        return logits
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], Tensor):
        return output[0]
    raise TypeError(
        f"cannot find logits in a model output of type {type(output).__name__}: "
        "pass loss_fn=lambda model, batch: ... returning a scalar loss"
    )


def _accepts_labels(model: nn.Module) -> bool:
    # The class's forward: a transformed module's instance forward is a wrapper.
    try:
        parameters = inspect.signature(type(model).forward).parameters
    except (TypeError, ValueError):
        return False
    return "labels" in parameters


def language_model_loss(model: nn.Module, batch: Tensor) -> Tensor:
    """The next-token loss of ``model`` on ``batch`` ``(batch, seq + 1)``.

    In order of preference:

    1. ``model.loss(batch)`` if the model has a ``loss`` method (as
       :class:`unit_scaling.TransformerDecoder` does);
    2. ``model(batch, labels=batch).loss`` if ``forward`` takes ``labels`` (Hugging
       Face causal LMs, which shift the labels themselves): the loss is computed
       inside ``forward``, so :func:`~unit_scaling.transforms.unit_scale`
       unit-scales it and :func:`~unit_scaling.transforms.track_scales` tracks it;
    3. the mean ``F.cross_entropy`` of ``model(batch[:, :-1])``'s logits (a tensor
       or the first element of a tuple) against ``batch[:, 1:]``. This plain loss
       runs outside the model, so its gradient is not unit-scaled: for a
       unit-scaled model pass a ``loss_fn`` using
       :func:`unit_scaling.functional.cross_entropy` instead.

    Example::

        >>> language_model_loss(uu.TransformerDecoder(64, 256, 2, 4), example_batch())
        tensor(5.5..., grad_fn=...)
    """
    loss_method = getattr(model, "loss", None)
    if callable(loss_method) and not isinstance(loss_method, nn.Module):
        result: Tensor = loss_method(batch)
        return result
    if _accepts_labels(model):
        output = model(batch, labels=batch)
        loss = getattr(output, "loss", None)
        if isinstance(loss, Tensor):
            return loss
        return _logits(output)  # a tuple output starts with the loss
    logits = _logits(model(batch[:, :-1]))
    return F.cross_entropy(
        logits.flatten(end_dim=-2).float(), batch[:, 1:].flatten().to(logits.device)
    )


def _device_of(model: nn.Module) -> torch.device:
    parameter = next(model.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def scales_graph(
    model: nn.Module,
    batch: Tensor | None = None,
    *,
    loss_fn: LossFn | None = None,
    backward: bool = True,
) -> Graph:
    """Run ``model`` once under :func:`track_scales` and return its scales graph.

    ``model`` itself is not changed (tracking runs on a copy). Only the ops inside
    the model's ``forward`` are tracked: a loss computed outside it (as
    ``model.loss`` does) shows through the gradient of the model's output.

    Args:
        model: a language model taking token ids ``(batch, seq)``.
        batch: token ids ``(batch, seq + 1)``. Default: :func:`example_batch` on the
            model's device.
        loss_fn: ``loss_fn(model, batch) -> scalar``, called with the tracked
            model. Default: :func:`language_model_loss`.
        backward: backpropagate the loss (to track gradients too).

    Example::

        >>> from unit_scaling.analysis import graph_to_dataframe
        >>> graph = scales_graph(uu.TransformerDecoder(64, 256, 2, 4))
        >>> df = graph_to_dataframe(graph)
        >>> sorted(df["direction"].unique())
        ['bwd', 'fwd']
    """
    if batch is None:
        batch = example_batch(device=_device_of(model))
    tracked = track_scales(model)
    loss = (loss_fn or language_model_loss)(tracked, batch)
    if backward:
        if not (isinstance(loss, Tensor) and loss.numel() == 1):
            raise ValueError(
                "loss_fn must return a scalar tensor to backpropagate, got "
                f"{type(loss).__name__}"
                + (f" of shape {tuple(loss.shape)}" if isinstance(loss, Tensor) else "")
            )
        loss.backward()  # type: ignore[no-untyped-call]
    graph: Graph = tracked.scales_graph()  # type: ignore[operator]
    return graph


def visualiser(
    model: nn.Module,
    batch: Tensor | None = None,
    *,
    loss_fn: LossFn | None = None,
    backward: bool = True,
    batch_size: int = 4,
    seq_len: int = 64,
    seed: int = 0,
    **plot_kwargs: Any,
) -> Axes:
    """Plot the scales of ``model`` on a batch of built-in text, offline.

    Builds an :func:`example_batch` (unless ``batch`` is given), runs
    :func:`scales_graph` and draws it with :func:`plot`.

    Args:
        model: a language model taking token ids ``(batch, seq)`` with a
            vocabulary of at least 256 (e.g. :class:`unit_scaling.TransformerDecoder`,
            a Hugging Face causal LM, or either after
            :func:`unit_scaling.transforms.unit_scale`).
        batch: token ids ``(batch, seq + 1)``; overrides the next three arguments.
        loss_fn, backward: see :func:`scales_graph`.
        batch_size, seq_len, seed: of the :func:`example_batch`.
        **plot_kwargs: passed to :func:`plot` (``title``, ``metric``, ...).

    Returns:
        The :class:`matplotlib.axes.Axes` of the plot.

    Example::

        >>> from transformers import GPT2Config, GPT2LMHeadModel
        >>> from unit_scaling.transforms import unit_scale
        >>> config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256)
        >>> model = unit_scale(GPT2LMHeadModel(config))
        >>> ax = visualiser(model, title="unit-scaled GPT-2")
        >>> ax.figure.savefig("gpt2_scales.png")
    """
    require_plot_extra()  # before the work, not after it
    if batch is None:
        batch = example_batch(batch_size, seq_len, seed=seed, device=_device_of(model))
    graph = scales_graph(model, batch, loss_fn=loss_fn, backward=backward)
    return plot(graph, **plot_kwargs)
