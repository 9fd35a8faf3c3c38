"""The step rule in the loops people train with: what a stock Hugging Face
``Trainer``, ``UnitScalingTrainer``, Accelerate and our own loop compute.

Measures, for ``unit_scale``d GPT-2- and Llama-style models (2 layers, width 64,
vocabulary 256, 32-token rows, u-μP residuals), with the probes of
``tests/integrations/models.py`` (so the page reports what the tests bound):

1. the median RMS of the weight gradients at a stock ``Trainer``'s first step,
   before clipping, with ``num_items_in_batch`` as ``Trainer`` passes it (a float
   tensor) and as an int;
2. for ``k = 2, 4`` equal micro-batches (batch 8, clipping off, one calibrated
   model), the largest ``‖Δ‖/‖g‖`` over the parameters between the step's
   gradient and one call's on the concatenated batch, through each loop;
3. the same for unequal micro-batches (5 + 3 rows; 4 + 4 rows with the first
   half's labels half padded), with a count, token shares or ``1/k`` shares;
4. two gloo processes through Accelerate against one process on the global batch;
5. a resumed ``UnitScalingTrainer`` run against the uninterrupted one;
6. a LoRA adapter's effect on the output at initialisation.

Writes ``training_loops.md`` to ``--out`` (default ``docs/results/``)::

    .venv/bin/python experiments/training_loops.py
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _common import DOCS, markdown_table, reflow

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tests' probes (tests/integrations/models.py)

import unit_scaling as uu  # noqa: E402
import unit_scaling.functional as U  # noqa: E402
from tests.integrations import models as M  # noqa: E402
from tests.parallel._launch import run_distributed  # noqa: E402
from unit_scaling.integrations.accelerate import Accelerator  # noqa: E402
from unit_scaling.integrations.hf import UnitScalingTrainer  # noqa: E402

transformers = M.transformers


class _IntegerCount(transformers.Trainer):  # type: ignore[misc]
    def _get_num_items_in_batch(self, *args: Any, **kwargs: Any) -> Any:
        count = super()._get_num_items_in_batch(*args, **kwargs)
        return None if count is None else int(count)


class _WithoutCount(UnitScalingTrainer):
    """No num_items_in_batch: Trainer divides each loss by the steps."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.model_accepts_loss_kwargs = False


class _StockWithoutCount(transformers.Trainer):  # type: ignore[misc]
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.model_accepts_loss_kwargs = False


def first_step_rms(name: str, trainer_class: type, out: str) -> float:
    """Median weight-gradient RMS before clipping at a default Trainer's first step."""
    model = M.scaled(name)
    seen: list[float] = []
    trainer = trainer_class(
        model=model,
        args=M.arguments(out),
        train_dataset=M.Tokens(),
        optimizers=(uu.optim.AdamW(model.parameters(), lr=0.5), None),
    )
    clip = trainer.accelerator.clip_grad_norm_

    def before_clipping(parameters: Any, *args: Any, **kwargs: Any) -> Any:
        gradients = {str(i): p.grad for i, p in enumerate(model.parameters())}
        seen.append(
            M.median_weight_rms({k: g for k, g in gradients.items() if g is not None})
        )
        return clip(parameters, *args, **kwargs)

    trainer.accelerator.clip_grad_norm_ = before_clipping
    trainer.train()
    return seen[0]


def trainer_error(name: str, trainer_class: type, k: int, out: str) -> float:
    """Worst relative difference between a Trainer step of ``k`` micro-batches
    and one call on their concatenation."""
    model = M.scaled(name)
    probe = M.StepProbe()
    trainer = M.recording(trainer_class, probe)(
        model=model,
        args=M.arguments(
            out,
            max_grad_norm=0.0,
            gradient_accumulation_steps=k,
            per_device_train_batch_size=8 // k,
        ),
        train_dataset=M.Tokens(),
        callbacks=[probe],
        optimizers=(uu.optim.AdamW(model.parameters(), lr=0.5), None),
    )
    trainer.train()
    return M.worst_error(probe.accumulated, probe.whole)[0]  # type: ignore[arg-type]


def accelerate_error(name: str, k: int, recipe: str) -> float:
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    model = M.scaled(name)
    rows = M.Tokens(8).ids
    model(input_ids=rows[:2], labels=rows[:2])
    whole = M.whole_batch_grads(model, [rows])
    # Hugging Face's count recipe needs no integration: the stock Accelerator
    import accelerate

    cls = Accelerator if recipe == "mean" else accelerate.Accelerator
    accelerator = cls(cpu=True, gradient_accumulation_steps=k)
    step = M.accelerate_step(accelerator, model, rows, 8 // k, recipe)
    return M.worst_error(step, whole)[0]


def split_error(name: str, parts: list[int], how: str, pad: bool = False) -> float:
    """One step over micro-batches of ``parts`` rows (of a batch of 8) against
    one call on the whole batch. ``how`` each micro-batch enters the step:
    ``"count"``, normalised by the step's label count in the model (Trainer's
    ``num_items_in_batch``); ``"tokens"``, ``U.micro_batch_loss`` with its share
    of the label tokens; ``"equal"``, with ``1 / len(parts)`` (our loop's
    default). ``pad``: the first half's rows lose half their labels (-100)."""
    model = M.scaled(name)
    rows = M.Tokens(8).ids
    labels = rows.clone()
    if pad:
        labels[:4, 16:] = -100
    model(input_ids=rows[:2], labels=labels[:2])
    model.zero_grad()
    model(input_ids=rows, labels=labels).loss.backward()
    whole = M.grads(model)
    model.zero_grad()
    total = (labels[:, 1:] != -100).sum()
    start = 0
    for size in parts:
        ids, lab = rows[start : start + size], labels[start : start + size]
        start += size
        if how == "count":
            loss = model(
                input_ids=ids, labels=lab, num_items_in_batch=total.float()
            ).loss
        else:
            share = (
                float((lab[:, 1:] != -100).sum() / total)
                if how == "tokens"
                else 1 / len(parts)
            )
            loss = U.micro_batch_loss(model(input_ids=ids, labels=lab).loss, share)
        loss.backward()
    return M.worst_error(M.grads(model), whole)[0]


def resume_gap(out: str) -> float:
    def run(resume: str | None) -> list[float]:
        args = M.arguments(
            out,
            max_steps=4,
            save_strategy="steps",
            save_steps=2,
            learning_rate=0.5,
            seed=0,
        )
        trainer = UnitScalingTrainer(
            model=M.scaled("gpt2"), args=args, train_dataset=M.Tokens()
        )
        trainer.train(resume_from_checkpoint=resume)
        return [h["loss"] for h in trainer.state.log_history if "loss" in h]

    whole = run(None)
    resumed = run(str(Path(out) / "checkpoint-2"))
    return max(abs(a - b) for a, b in zip(whole[2:], resumed[2:], strict=True))


def lora_change(name: str) -> float:
    import peft

    model = M.scaled(name)
    ids = M.Tokens(8).ids
    before = model(input_ids=ids).logits
    targets = ["q_proj", "v_proj"] if name == "llama" else ["c_attn"]
    lora = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=targets))
    after = lora(input_ids=ids).logits
    return float((after - before).abs().max() / before.abs().max())


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DOCS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    start = time.perf_counter()
    out = tempfile.mkdtemp()
    names = ("gpt2", "llama")
    rms = {
        (n, kind): first_step_rms(n, cls, out)
        for n in names
        for kind, cls in (("float", transformers.Trainer), ("int", _IntegerCount))
    }
    loops = {
        "stock Trainer, num_items_in_batch": lambda n, k: trainer_error(
            n, transformers.Trainer, k, out
        ),
        "stock Trainer, no count (Trainer's 1/k)": lambda n, k: trainer_error(
            n, _StockWithoutCount, k, out
        ),
        "UnitScalingTrainer, num_items_in_batch": lambda n, k: trainer_error(
            n, UnitScalingTrainer, k, out
        ),
        "UnitScalingTrainer, no count": lambda n, k: trainer_error(
            n, _WithoutCount, k, out
        ),
        "Accelerate, our Accelerator, mean losses": lambda n, k: accelerate_error(
            n, k, "mean"
        ),
        "Accelerate, stock, Hugging Face's count recipe": lambda n, k: accelerate_error(
            n, k, "count"
        ),
        "our loop (U.micro_batch_loss)": lambda n, k: split_error(
            n, [8 // k] * k, "equal"
        ),
    }
    accumulation = {
        (loop, n, k): fn(n, k)
        for loop, fn in loops.items()
        for n in names
        for k in (2, 4)
    }
    cases = {
        "5 + 3 rows, num_items_in_batch": ([5, 3], "count", False),
        "5 + 3 rows, token shares": ([5, 3], "tokens", False),
        "5 + 3 rows, 1/k each": ([5, 3], "equal", False),
        "4 + 4 rows, half the labels of the first padded, num_items_in_batch": (
            [4, 4],
            "count",
            True,
        ),
        "4 + 4 rows, half the labels of the first padded, 1/k each": (
            [4, 4],
            "equal",
            True,
        ),
    }
    unequal = {
        (case, n): split_error(n, parts, how, pad)
        for n in names
        for case, (parts, how, pad) in cases.items()
    }
    whole = M.single_process_whole_batch()
    two = {
        recipe: max(
            M.worst_error(r, whole)[0]
            for r in run_distributed(M.two_process_step, recipe, 2)
        )
        for recipe in ("mean", "count")
    }
    gap = resume_gap(out)
    lora = {n: lora_change(n) for n in names}
    seconds = time.perf_counter() - start
    text = report(rms, accumulation, unequal, two, gap, lora, seconds)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "training_loops.md").write_text(text)
    print(text)
    return text


def report(
    rms: dict[Any, float],
    accumulation: dict[Any, float],
    unequal: dict[Any, float],
    two: dict[str, float],
    gap: float,
    lora: dict[str, float],
    seconds: float,
) -> str:
    first = markdown_table(
        ["model", "float count (Trainer's)", "int count"],
        [
            (n, f"{rms[(n, 'float')]:.3f}", f"{rms[(n, 'int')]:.3f}")
            for n in ("gpt2", "llama")
        ],
    )
    loops = list(dict.fromkeys(loop for loop, _, _ in accumulation))
    acc = markdown_table(
        ["loop", "GPT-2 k=2", "GPT-2 k=4", "Llama k=2", "Llama k=4"],
        [
            (
                loop,
                *(
                    f"{accumulation[(loop, n, k)]:.1e}"
                    for n in ("gpt2", "llama")
                    for k in (2, 4)
                ),
            )
            for loop in loops
        ],
    )
    cases = list(dict.fromkeys(case for case, _ in unequal))
    uneq = markdown_table(
        ["micro-batches", "GPT-2", "Llama"],
        [
            (c, f"{unequal[(c, 'gpt2')]:.1e}", f"{unequal[(c, 'llama')]:.1e}")
            for c in cases
        ],
    )
    return reflow(f"""# The step rule in Trainer, Accelerate and our loop

`python experiments/training_loops.py` measures what each loop computes for
`unit_scale`d GPT-2- and Llama-style models (2 layers, width 64, vocabulary 256,
rows of 32 tokens, `residual_scaling="u-μP"`), with the probes the tests use
(`tests/integrations/`). The rule: a step's gradient is the gradient of one call
on the step's whole batch ([Trainer and Accelerate](../training-loops.md)).
{seconds / 60:.1f} min on 2 CPU cores.

## A stock `Trainer`, default arguments

Median RMS of the weight gradients at the first step, before clipping (8 × 32
tokens; before the rule: 0.006 with `Trainer`'s float count, and a gradient
scaled by whatever the first call's int count was):

{first}

## Accumulation: equal micro-batches against one call on the whole batch

Largest `‖Δ‖/‖g‖` over the parameters (batch 8, clipping off, one calibrated
model). The second row is what a stock `Trainer` still does when it has no
count to pass (a model whose forward takes no `**kwargs`): `k^-½` of the
whole batch's gradient, so its error is `1 - k^-½` (0.29 and 0.50).

{acc}

## Unequal micro-batches

A parameter gradient's `batch^-½` counts rows, padding included, while a count
(or a share) counts label tokens: the step is exact when each micro-batch's share
of the counted tokens is its share of the rows (unequal micro-batches of unpadded
rows, with a count or token shares), and off by as much as the two differ
otherwise (equal `1/k` shares for unequal micro-batches; a count when padding is
spread unevenly, where equal rows with `1/k` shares are exact).

{uneq}

## Two processes, resume, adapters

- Two gloo processes through Accelerate (2 micro-batches each) against one
  process on the global batch: {two["mean"]:.1e} (our `Accelerator`, mean losses),
  {two["count"]:.1e} (Hugging Face's count recipe).
- A `UnitScalingTrainer` run (GPT-2-style, tied readout) saved at step 2 of 4 and
  resumed in a fresh `unit_scale`d model: largest loss gap over steps 3 and 4,
  {gap:.1e}.
- A LoRA adapter attached after `unit_scale` (rank 4): largest change of the
  logits at initialisation, relative to their largest value: GPT-2-style
  {lora["gpt2"]:.1e}, Llama-style {lora["llama"]:.1e} (0.43 and 0.68 before
  adapters were recognised).
""")


if __name__ == "__main__":
    main(sys.argv[1:])
