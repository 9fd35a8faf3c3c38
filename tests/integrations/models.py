"""Small Hugging Face models, data and gradient probes for the integration tests
(and ``experiments/training_loops.py``, which reports what they bound)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

import unit_scaling as uu
from tests.helpers import tiny_gpt2, tiny_llama
from unit_scaling.transforms import unit_scale

transformers = pytest.importorskip("transformers")

VOCAB, LENGTH = 256, 32


MODELS: dict[str, Callable[[], nn.Module]] = {"gpt2": tiny_gpt2, "llama": tiny_llama}


def scaled(name: str, seed: int = 0) -> nn.Module:
    """A ``unit_scale``d (u-μP) model of ``MODELS``, built after ``seed``."""
    torch.manual_seed(seed)
    return unit_scale(MODELS[name](), residual_scaling="u-μP")


class Tokens(Dataset[dict[str, Tensor]]):
    """``rows`` random sequences of ``LENGTH`` byte tokens, labels = inputs."""

    def __init__(self, rows: int = 64, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(VOCAB, (rows, LENGTH), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def grads(model: nn.Module) -> dict[str, Tensor]:
    """Every parameter's gradient, cloned."""
    return {
        n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
    }


def median_weight_rms(gradients: dict[str, Tensor]) -> float:
    """The median RMS over the weight matrices' gradients."""
    values = sorted(
        float(g.float().pow(2).mean().sqrt())
        for g in gradients.values()
        if g.dim() == 2
    )
    return values[len(values) // 2]


def worst_error(got: dict[str, Tensor], want: dict[str, Tensor]) -> tuple[float, str]:
    """The largest ``‖got - want‖ / ‖want‖`` over the parameters, and whose."""
    assert got.keys() == want.keys()
    errors = {n: float((got[n] - w).norm() / w.norm()) for n, w in want.items()}
    name = max(errors, key=errors.__getitem__)
    return errors[name], name


def whole_batch_grads(model: nn.Module, batches: list[Tensor]) -> dict[str, Tensor]:
    """The gradients of one call on the concatenated ``batches`` (labels =
    inputs), leaving the model's own ``.grad`` as they were."""
    saved = {n: p.grad for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    ids = torch.cat(batches)
    model(input_ids=ids, labels=ids).loss.backward()
    out = grads(model)
    for n, p in model.named_parameters():
        p.grad = saved[n]
    return out


class StepProbe(transformers.TrainerCallback):  # type: ignore[misc]
    """Records, at the first optimizer step, the accumulated gradients (after
    any clipping) and ``reference(model, batches)``, by default those of one
    call on the step's micro-batches, which a ``Trainer`` subclass records in
    ``batches`` (see :func:`recording`)."""

    def __init__(
        self,
        reference: Callable[[nn.Module, list[Tensor]], dict[str, Tensor]] | None = None,
    ) -> None:
        self.batches: list[Tensor] = []
        self.accumulated: dict[str, Tensor] | None = None
        self.whole: dict[str, Tensor] | None = None
        # the whole batch's gradients, computed at the step: one call by default
        self.reference = reference or whole_batch_grads

    def on_pre_optimizer_step(
        self, args: Any, state: Any, control: Any, **kwargs: Any
    ) -> None:
        if self.accumulated is None:
            model = kwargs["model"]
            self.accumulated = grads(model)
            self.whole = self.reference(model, self.batches)


def recording(base: type, probe: StepProbe) -> type:
    """``base`` (a Trainer class) recording each micro-batch's input_ids of the
    first step in ``probe.batches``."""

    class Recording(base):  # type: ignore[misc, valid-type]
        def compute_loss(
            self, model: Any, inputs: Any, *args: Any, **kwargs: Any
        ) -> Any:
            if model.training and probe.accumulated is None:
                probe.batches.append(inputs["input_ids"].detach().clone())
            return super().compute_loss(model, inputs, *args, **kwargs)

    return Recording


def arguments(directory: Any, **overrides: Any) -> Any:
    """``TrainingArguments`` for a few quick CPU steps, nothing reported."""
    settings: dict[str, Any] = {
        "per_device_train_batch_size": 8,
        "max_steps": 1,
        "report_to": [],
        "use_cpu": True,
        "save_strategy": "no",
        "logging_steps": 1,
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }
    settings.update(overrides)
    return transformers.TrainingArguments(str(directory), **settings)


# --- Accelerate ------------------------------------------------------------- #

ROWS = 16


def accelerate_step(
    accelerator: Any, model: nn.Module, rows: Tensor, micro: int, recipe: str
) -> dict[str, Tensor]:
    """One optimizer step of an Accelerate loop over ``rows`` in micro-batches
    of ``micro`` rows (shared out among the processes); returns the gradients
    at the step. ``recipe``: "mean"
    (each micro-batch's mean loss to ``backward``, Accelerate's recipe) or
    "count" (Hugging Face's: the loss over the step's count, times the steps
    and processes)."""
    optimizer = uu.optim.AdamW(model.parameters(), lr=0.5)
    loader = DataLoader(rows, batch_size=micro)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    steps = accelerator.gradient_accumulation_steps
    count = torch.tensor(float(rows[:, 1:].numel()))  # every process's, every step's
    seen: dict[str, Tensor] = {}
    for batch in loader:
        with accelerator.accumulate(model):
            if recipe == "mean":
                loss = model(input_ids=batch, labels=batch).loss
            else:
                out = model(input_ids=batch, labels=batch, num_items_in_batch=count)
                loss = out.loss * steps * accelerator.num_processes
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                seen = grads(accelerator.unwrap_model(model))
            optimizer.step()
            optimizer.zero_grad()
    return seen


def global_rows(seed: int = 0) -> Tensor:
    """``ROWS`` rows of tokens: the global batch of the Accelerate checks."""
    return Tokens(ROWS, seed).ids


def accelerate_environment(rank: int, world_size: int) -> None:
    """What Accelerate reads to join a process group that is already up (the
    launcher of ``tests.parallel._launch`` starts one on loopback)."""
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT="0",
        OMP_NUM_THREADS="1",
    )


def two_process_step(rank: int, world_size: int, recipe: str, k: int) -> dict[str, Any]:
    """One process's step over :func:`global_rows` through our ``Accelerator`` (run by
    ``tests.parallel._launch.run_distributed``): its gradients after the
    reduction."""
    accelerate_environment(rank, world_size)
    from unit_scaling.integrations.accelerate import Accelerator

    model = scaled("llama")
    data = global_rows()
    model(input_ids=data[:2], labels=data[:2])  # calibrate as the single process
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=k)
    assert accelerator.num_processes == world_size
    # (Accelerate's data loader gives each process every other micro-batch)
    step = accelerate_step(accelerator, model, data, ROWS // world_size // k, recipe)
    return {name: g.detach() for name, g in step.items()}


def single_process_whole_batch() -> dict[str, Tensor]:
    """One process's gradients of one call on :func:`global_rows`, calibrated as
    :func:`two_process_step` calibrates."""
    model = scaled("llama")
    data = global_rows()
    model(input_ids=data[:2], labels=data[:2])
    return whole_batch_grads(model, [data])
