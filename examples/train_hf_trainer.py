"""A unit-scaled Llama-style model trained by Hugging Face ``Trainer``, in
simulated FP8 and in FP32, on the built-in byte corpus.

    python examples/train_hf_trainer.py            # about 35 s on 2 CPU cores
    python examples/train_hf_trainer.py --steps 20

The model is ``LlamaForCausalLM`` from a small config with random weights, made
u-μP by ``unit_scale(model, residual_scaling="u-μP")``; the FP8 run wraps it in
``simulate_fp8`` (E4M3 inputs and E5M2 gradients at every matrix product, no
loss scaling). Both train with ``UnitScalingTrainer`` — ``transformers.Trainer``
with u-μP's per-parameter learning rates from ``uu.RECOMMENDED``, the gradient
of each step equal to one call's on the whole step (micro-batches accumulated
by ``num_items_in_batch``, see ``unit_scaling.functional.steps``), and
``max_grad_norm`` read as an RMS bound. They start from the same weights and
read the same batches; the script prints both validation losses and the gap.
"""

from __future__ import annotations

import argparse
import math
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments

import unit_scaling as uu
from unit_scaling.data import VOCAB_SIZE, Corpus
from unit_scaling.integrations.hf import UnitScalingTrainer
from unit_scaling.transforms import simulate_fp8, unit_scale


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16, help="per step")
    parser.add_argument("--accumulate", type=int, default=2, help="micro-batches")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument(
        "--lr",
        type=float,
        default=uu.RECOMMENDED.unit_scale_lr,
        help="uu.RECOMMENDED.unit_scale_lr",
    )
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


class Windows(Dataset[dict[str, torch.Tensor]]):
    """``rows`` random windows of the corpus, each its own labels (the model
    shifts them)."""

    def __init__(self, split: str, rows: int, seq_len: int, seed: int) -> None:
        self.ids = Corpus(max_bytes=2**21).get_batch(split, rows, seq_len, seed)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def make_model(args: argparse.Namespace) -> torch.nn.Module:
    torch.manual_seed(args.seed)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=args.width,
        intermediate_size=4 * args.width,
        num_hidden_layers=args.layers,
        num_attention_heads=args.width // 32,
        num_key_value_heads=args.width // 64 or 1,
        max_position_embeddings=args.seq_len + 1,
    )
    model = LlamaForCausalLM(config)
    model.loss_type = "ForCausalLM"  # else transformers logs in forward
    return unit_scale(model, residual_scaling="u-μP")


def train(model: torch.nn.Module, args: argparse.Namespace, label: str) -> float:
    micro = args.batch_size // args.accumulate
    with tempfile.TemporaryDirectory() as out:
        arguments = TrainingArguments(
            out,
            learning_rate=args.lr,
            max_steps=args.steps,
            per_device_train_batch_size=micro,
            gradient_accumulation_steps=args.accumulate,
            warmup_steps=args.steps // 10,
            lr_scheduler_type="cosine",
            logging_steps=max(args.steps // 5, 1),
            report_to=[],
            use_cpu=True,
            save_strategy="no",
            disable_tqdm=True,
            seed=args.seed,
        )
        windows = args.steps * args.batch_size
        trainer = UnitScalingTrainer(
            model=model,
            args=arguments,
            train_dataset=Windows("train", windows, args.seq_len, args.seed),
            eval_dataset=Windows("validation", 64, args.seq_len, args.seed + 1),
        )
        trainer.train()
        loss = float(trainer.evaluate()["eval_loss"])
    print(f"{label}: validation loss {loss:.3f}", flush=True)
    return loss


def main() -> None:
    args = parse_args()
    fp32 = train(make_model(args), args, "u-μP FP32")
    fp8 = train(simulate_fp8(make_model(args)), args, "u-μP simulated FP8")
    if not (math.isfinite(fp32) and math.isfinite(fp8)):
        raise SystemExit("a run diverged")
    print(f"FP8 - FP32: {100 * (fp8 - fp32) / fp32:+.2f}%")


if __name__ == "__main__":
    main()
