"""Cost of the Hugging Face ``Trainer`` integration: a ``UnitScalingTrainer``
step against a stock ``Trainer`` step of the same ``unit_scale``d model.

The model: ``LlamaForCausalLM`` of width 256, 4 layers, 4 heads, vocabulary 256,
made u-μP by ``unit_scale``; batch 8 × 128 tokens; eager, on the CPU. Both
trainers step the same ``uu.optim.AdamW`` and clip (the stock one by norm, the
integration by RMS), so the difference is what the integration adds per step:
its loss bookkeeping, the reduction divisor, the RMS clipping bound. Each round
runs a few ``train()`` steps of each trainer in rotating order; a round's time
is the median of its steps after the first (which sets up the optimizer's
state), and the ratio is the median of the same-round ratios. Target ≤ 1.05.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

import unit_scaling as uu

from ._measure import paired_ratio, table

HIDDEN, VOCAB, LAYERS, HEADS = 256, 256, 4, 4
BATCH, SEQ = 8, 128
STEPS_PER_ROUND = 8


class _Tokens(Dataset[dict[str, Tensor]]):
    def __init__(self, rows: int) -> None:
        self.ids = torch.randint(
            VOCAB, (rows, SEQ), generator=torch.Generator().manual_seed(0)
        )

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _model() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    from unit_scaling.transforms import unit_scale

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=4 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=SEQ,
    )
    model = LlamaForCausalLM(config)
    model.loss_type = "ForCausalLM"
    return unit_scale(model, residual_scaling="u-μP")


class _StepTimes:
    """A ``TrainerCallback`` timing each optimizer step (begin to end)."""

    def __init__(self) -> None:
        from transformers import TrainerCallback

        owner = self

        class Callback(TrainerCallback):  # type: ignore[misc]
            def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
                owner.start = time.perf_counter()

            def on_step_end(self, *args: Any, **kwargs: Any) -> None:
                owner.times.append(time.perf_counter() - owner.start)

        self.callback = Callback()
        self.start = 0.0
        self.times: list[float] = []


def _trainers(directory: str) -> dict[str, tuple[Any, _StepTimes]]:
    from transformers import Trainer, TrainingArguments

    from unit_scaling.integrations.hf import UnitScalingTrainer

    lr = uu.RECOMMENDED.unit_scale_lr
    out: dict[str, tuple[Any, _StepTimes]] = {}
    for name in ("stock", "integration"):
        args = TrainingArguments(
            f"{directory}/{name}",
            per_device_train_batch_size=BATCH,
            max_steps=STEPS_PER_ROUND,
            learning_rate=lr,
            report_to=[],
            use_cpu=True,
            save_strategy="no",
            logging_strategy="no",
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        model = _model()
        timer = _StepTimes()
        data = _Tokens(BATCH * STEPS_PER_ROUND)
        if name == "stock":
            optimizer = uu.optim.AdamW(model.parameters(), lr=lr)
            trainer: Any = Trainer(
                model=model,
                args=args,
                train_dataset=data,
                optimizers=(optimizer, None),
                callbacks=[timer.callback],
            )
        else:
            trainer = UnitScalingTrainer(
                model=model, args=args, train_dataset=data, callbacks=[timer.callback]
            )
        out[name] = (trainer, timer)
    return out


def measure(rounds: int) -> dict[str, list[float]]:
    """Per round, the median step time of each trainer (seconds)."""
    times: dict[str, list[float]] = {"stock": [], "integration": []}
    with tempfile.TemporaryDirectory() as directory:
        trainers = _trainers(directory)
        for trainer, _ in trainers.values():  # capture and calibrate once
            trainer.train()
        names = list(trainers)
        for r in range(rounds):
            for name in names[r % 2 :] + names[: r % 2]:
                trainer, timer = trainers[name]
                timer.times.clear()
                trainer.train()
                times[name].append(statistics.median(timer.times[1:]))
    return times


def run(rounds: int = 20) -> str:
    """The section's table (``python -m benchmarks trainer_step``)."""
    try:
        import transformers  # noqa: F401
    except ImportError:  # pragma: no cover - transformers is a dev extra
        return "Trainer step: skipped (transformers not installed)"
    times = measure(rounds)
    stock = statistics.median(times["stock"])
    ours = statistics.median(times["integration"])
    ratio = paired_ratio(times, "integration", "stock")
    ratios = [a / b for a, b in zip(times["integration"], times["stock"], strict=True)]
    rows = [
        (
            "Trainer step, eager (ms)",
            f"{1e3 * stock:.1f}",
            f"{1e3 * ours:.1f}",
            f"{ratio:.3f}",
            f"{min(ratios):.3f}–{max(ratios):.3f}",
            "≤ 1.05",
        )
    ]
    header = (
        f"Hugging Face Trainer: unit_scale'd Llama-style hidden={HIDDEN} "
        f"layers={LAYERS} heads={HEADS} vocab={VOCAB}, batch=({BATCH}, {SEQ}), "
        f"{torch.get_num_threads()} threads; {rounds} interleaved rounds of "
        f"{STEPS_PER_ROUND} steps, each round's median step; ratio: median of the "
        "same-round ratios"
    )
    headers = (
        "measure",
        "stock Trainer",
        "UnitScalingTrainer",
        "ratio",
        "range",
        "target",
    )
    return header + "\n" + table(rows, headers)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    print(run(parser.parse_args().rounds))
