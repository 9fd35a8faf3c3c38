"""The demo: train a small u-μP decoder on the built-in corpus.

Run with ``python -m unit_scaling demo`` (or ``make demo``).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch

from . import optim
from .data import VOCAB_SIZE, Corpus
from .modules import TransformerDecoder
from .training import History, train

__all__ = ["DemoConfig", "add_arguments", "run"]


@dataclass(frozen=True)
class DemoConfig:
    """Settings of the demo run."""

    steps: int = 300
    width: int = 128
    layers: int = 4
    heads: int = 4
    batch_size: int = 16
    seq_len: int = 128
    lr: float = 2**-3
    seed: int = 0
    eval_every: int = 50
    validation_batches: int = 8


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the demo's options to ``parser``."""
    defaults = DemoConfig()
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--width", type=int, default=defaults.width)
    parser.add_argument("--layers", type=int, default=defaults.layers)
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument("--seed", type=int, default=defaults.seed)


def run(config: DemoConfig, progress: bool = True) -> History:
    """Train a u-μP ``TransformerDecoder`` with ``uu.optim.AdamW``; print the losses."""
    torch.manual_seed(config.seed)
    corpus = Corpus()
    validation = [
        corpus.get_batch("validation", config.batch_size, config.seq_len, generator=i)
        for i in range(config.validation_batches)
    ]
    model = TransformerDecoder(config.width, VOCAB_SIZE, config.layers, config.heads)
    optimizer = optim.AdamW(model.parameters(), lr=config.lr)
    history = train(
        model,
        model.loss,
        optimizer,
        corpus.batches("train", config.batch_size, config.seq_len, seed=config.seed),
        config.steps,
        validation,
        eval_every=config.eval_every,
        description="u-μP decoder",
        progress=progress,
    )
    print(
        f"u-μP TransformerDecoder: width {config.width}, {config.layers} layers, "
        f"{config.steps} steps of {config.batch_size}x{config.seq_len} tokens"
    )
    print("step  validation loss")
    for step, loss in zip(history.eval_steps, history.validation_loss, strict=True):
        print(f"{step:4d}  {loss:.3f}")
    print(f"throughput: {history.tokens_per_second:,.0f} tokens/s")
    return history
