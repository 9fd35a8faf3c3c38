"""Data-parallel u-μP training on the built-in corpus, with DDP or FSDP2.

    torchrun --standalone --nproc_per_node=2 examples/train_ddp.py          # DDP
    torchrun --standalone --nproc_per_node=2 examples/train_ddp.py --fsdp   # FSDP2
    torchrun --standalone --nproc_per_node=2 examples/train_ddp.py --dtype fp16
    python examples/train_ddp.py                                            # 1 process

Every process draws the same global batch and trains on its own slice of it.
Gradients are reduced the unit-scaled way (``sum / sqrt(world_size)``, see
:mod:`unit_scaling.parallel`), so the run computes what one process would on the
global batch: the losses do not depend on the number of processes. ``--dtype
fp16`` trains under fp16 autocast with no ``GradScaler``: unit-scaled gradients
sit near 1, well inside fp16's range.

The model and the learning rate start from :data:`unit_scaling.RECOMMENDED`.
Uses NCCL and one GPU per process when CUDA is available, gloo on CPU otherwise.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

import unit_scaling as uu
import unit_scaling.functional as U
from unit_scaling.data import VOCAB_SIZE, Corpus
from unit_scaling.parallel import allreduce_hook, fully_shard

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=16, help="global batch")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument(
        "--lr", type=float, default=uu.RECOMMENDED.lr, help="uu.RECOMMENDED.lr"
    )
    parser.add_argument("--dtype", choices=DTYPES, default="fp32", help="autocast")
    parser.add_argument("--fsdp", action="store_true", help="FSDP2 instead of DDP")
    parser.add_argument("--log-every", type=int, default=20)
    parser.add_argument("--max-bytes", type=int, default=2**22, help="corpus size")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def mean_over_processes(value: Tensor) -> float:
    value = value.detach().float().clone()
    if dist.is_initialized():
        dist.all_reduce(value)
        value /= dist.get_world_size()
    return value.item()


def main() -> None:
    args = parse_args()
    distributed = "RANK" in os.environ  # set by torchrun
    cuda = torch.cuda.is_available()
    if distributed:
        dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank() if distributed else 0
    world_size = dist.get_world_size() if distributed else 1
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', 0)}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    if args.batch_size % world_size:
        raise SystemExit(f"--batch-size must be a multiple of {world_size} processes")
    local = slice(
        rank * args.batch_size // world_size, (rank + 1) * args.batch_size // world_size
    )

    torch.manual_seed(args.seed)  # the same initial weights on every process
    model = uu.TransformerDecoder(
        args.width, VOCAB_SIZE, args.layers, args.heads, **uu.RECOMMENDED.multipliers
    )
    model.to(device)
    forward: nn.Module = model  # what the loss calls: the model or its DDP wrapper
    if args.fsdp:
        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)  # model's parameters are now tagged DTensor shards
    elif distributed:
        ddp = DistributedDataParallel(model)
        ddp.register_comm_hook(None, allreduce_hook)
        forward = ddp
    optimizer = uu.optim.AdamW(model.parameters(), lr=args.lr)

    def loss_fn(batch: Tensor) -> Tensor:
        # Through `forward`, the wrapper, so that DDP reduces the gradients.
        with torch.autocast(device.type, DTYPES[args.dtype], args.dtype != "fp32"):
            logits = forward(batch[:, :-1])
        targets = batch[:, 1:]
        flat = logits.float().flatten(end_dim=-2)
        return U.cross_entropy(flat, targets.flatten(), mult=model.loss_mult)

    corpus = Corpus(max_bytes=args.max_bytes)
    batches = corpus.batches(
        "train", args.batch_size, args.seq_len, seed=args.seed, device=device
    )
    validation = [
        corpus.get_batch(
            "validation", args.batch_size, args.seq_len, generator=i, device=device
        )[local]
        for i in range(4)
    ]
    if rank == 0:
        how = "FSDP2" if args.fsdp else "DDP" if distributed else "one process"
        print(
            f"u-μP decoder, width {args.width}, {args.layers} layers, {how} on "
            f"{world_size} x {device.type}, {args.dtype}, global batch "
            f"{args.batch_size}x{args.seq_len}"
        )

    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        loss = loss_fn(next(batches)[local])
        loss.backward()  # no GradScaler, even in fp16
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        mean_loss = mean_over_processes(loss)  # every process joins the collective
        if rank == 0 and (step == 1 or step % args.log_every == 0):
            print(f"step {step:5d}  train loss {mean_loss:.4f}")

    with torch.no_grad():
        validation_loss = sum(mean_over_processes(loss_fn(b)) for b in validation)
    elapsed = time.perf_counter() - start
    if rank == 0:
        tokens = args.steps * args.batch_size * args.seq_len
        print(f"validation loss {validation_loss / len(validation):.4f}")
        print(f"{tokens / elapsed:,.0f} tokens/s over all processes")
    if distributed:
        # torch 2.13 + gloo: destroying the group while a gloo thread still frees
        # the last collective's tensors deadlocks (the destructor joins that
        # thread holding the GIL the thread needs). Give the threads a moment.
        dist.barrier()
        time.sleep(0.1)
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
