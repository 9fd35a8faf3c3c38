"""The small u-μP model, data and single-process run that distributed runs match."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

import unit_scaling as uu
from unit_scaling.data import VOCAB_SIZE, Corpus
from unit_scaling.parameter import TAG_NAMES

WIDTH, LAYERS, HEADS = 32, 2, 4
BATCH, SEQ, STEPS, LR = 4, 32, 5, 2**-4


def make_model(seed: int = 0) -> uu.TransformerDecoder:
    torch.manual_seed(seed)
    return uu.TransformerDecoder(WIDTH, VOCAB_SIZE, LAYERS, HEADS)


def global_batches(steps: int = STEPS, seed: int = 0) -> list[Tensor]:
    """The same global batches on every process, from the built-in corpus."""
    stream = Corpus(max_bytes=2**16).batches("train", BATCH, SEQ, seed)
    return [next(stream) for _ in range(steps)]


def local_part(batch: Tensor) -> Tensor:
    """This rank's equal share of a global batch (the whole batch without a group)."""
    if not dist.is_initialized():
        return batch
    return batch.chunk(dist.get_world_size())[dist.get_rank()]


def tags(model: nn.Module) -> dict[str, tuple[Any, ...]]:
    """``name -> (mup_type, mup_scaling_depth, mup_fan_in)`` (every tag a
    parameter carries, ``TAG_NAMES``); ``None`` for each that is missing."""
    return {
        name: tuple(getattr(p, tag, None) for tag in TAG_NAMES)
        for name, p in model.named_parameters()
    }


def lrs(optimizer: torch.optim.Optimizer) -> dict[str, float]:
    """Each parameter's learning rate, by name (one u-μP param group per parameter)."""
    return {
        name: float(group["lr"])
        for group in optimizer.param_groups
        for name in group["param_names"]
    }


def full(tensor: Tensor) -> Tensor:
    """The global value of a (possibly sharded) tensor, on the CPU."""
    gather = getattr(tensor, "full_tensor", None)
    return (gather() if gather is not None else tensor).detach().clone()


def checkpoint_state(
    model: nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, Any]:
    """What a distributed checkpoint saves: the model's and the optimizer's
    state dicts, as ``torch.distributed.checkpoint`` sees them."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    return {
        "model": get_model_state_dict(model),
        "optim": get_optimizer_state_dict(model, optimizer),
    }


def train(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: list[Tensor],
    loss_fn: Any = None,
) -> dict[str, Any]:
    """One step per batch on this rank's part: global losses and first gradients.

    ``loss_fn`` (default ``model.loss``) may go through a wrapper of ``model``.
    """
    loss_fn = loss_fn if loss_fn is not None else model.loss
    losses, first_grads = [], {}
    for step, batch in enumerate(batches):
        value = loss_fn(local_part(batch))
        value.backward()
        if step == 0:
            first_grads = {n: full(p.grad) for n, p in model.named_parameters()}
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        value = value.detach()
        if dist.is_initialized():
            dist.all_reduce(value)
            value /= dist.get_world_size()
        losses.append(value.item())
    return {"losses": losses, "grads": first_grads}


def single_process_run(steps: int = STEPS) -> dict[str, Any]:
    """The run every distributed run must reproduce: one process, global batches."""
    model = make_model()
    optimizer = uu.optim.AdamW(model.named_parameters(), lr=LR)
    result = train(model, optimizer, global_batches(steps))
    return {**result, "lrs": lrs(optimizer), "tags": tags(model)}
