"""A unit-scaled Hugging Face decoder from training to plain inference.

Trains ``unit_scale(LlamaForCausalLM)`` (built from a config: width 128, 2
layers, byte vocabulary) with ``uu.optim.AdamW`` on the built-in corpus, and on
the way:

1. **checkpoints** it half-way (``save_pretrained``, which writes the
   ``unit_scaling`` record into ``config.json``, and the optimizer's
   ``state_dict``);
2. **resumes** from that checkpoint in a fresh model and optimizer
   (``unit_scale(from_pretrained(...))`` keeps the trained weights and the
   recorded scales) and trains the second half again: the resumed losses against
   the uninterrupted run's, step by step;
3. **exports** the trained model (:func:`unit_scaling.export.to_plain`: every
   static scale folded into the weights) and saves it with ``save_pretrained``;
4. **loads the export in a fresh process where** ``unit_scaling`` **cannot be
   imported**, with plain ``transformers``, computes its validation loss and
   generates text from a prompt.

The check (issue 15's): the exported model's validation loss equals the trained
one's within 1e-4 relative; the resumed run follows the uninterrupted one within
1e-5 relative at every step. Writes ``checkpoint_export.md`` to ``--out``
(default ``docs/results/``); ``--quick`` is a smoke run of seconds::

    .venv/bin/python experiments/checkpoint_export.py
    .venv/bin/python experiments/checkpoint_export.py --quick --out /tmp/ckpt
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from _common import DOCS, LanguageModel, markdown_table, reflow, run_parser
from torch import Tensor, nn

import unit_scaling as uu
from unit_scaling.app.config import parse_config, setting
from unit_scaling.app.training import History, train
from unit_scaling.data import VOCAB_SIZE, Corpus
from unit_scaling.export import to_plain
from unit_scaling.transforms import unit_scale
from unit_scaling.zoo import hf_model

RESUME_TARGET = 1e-5  # relative, at each resumed step
EXPORT_TARGET = 1e-4  # relative, the validation loss
QUICK = {"width": 32, "layers": 1, "steps": 6, "batch_size": 4, "seq_len": 16}
PROMPT = "def __init__(self"


@dataclass(frozen=True)
class Config:
    width: int = setting(128, "model width (head size 32)")
    layers: int = setting(2, "decoder layers")
    steps: int = setting(200, "training steps (checkpointed half-way)")
    batch_size: int = setting(16, "sequences per step")
    seq_len: int = setting(64, "bytes per sequence (predicted)")
    lr: float = setting(2**-3, "uu.optim.AdamW learning rate (constant)")
    val_batches: int = setting(8, "validation batches")
    new_tokens: int = setting(160, "bytes to generate from the export")
    seed: int = 0
    quick: bool = setting(False, "a smoke run of seconds: " + str(QUICK))

    def __post_init__(self) -> None:
        if self.quick:
            for name, value in QUICK.items():
                object.__setattr__(self, name, value)
        if self.steps < 2 or self.steps % 2:
            raise ValueError(f"steps must be an even number >= 2, got {self.steps}")


def make_model(config: Config) -> nn.Module:
    torch.manual_seed(config.seed)
    heads = max(1, config.width // 32)
    return hf_model(
        "llama",
        hidden_size=config.width,
        intermediate_size=4 * config.width,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        num_hidden_layers=config.layers,
        vocab_size=VOCAB_SIZE,
    )


def validation_loss(model: nn.Module, batches: list[Tensor]) -> float:
    """Mean next-byte cross-entropy from the model's logits (what the plain
    process computes the same way)."""
    model.eval()
    with torch.no_grad():
        losses = [
            F.cross_entropy(
                model(input_ids=b).logits[:, :-1].flatten(0, 1).double(),
                b[:, 1:].flatten(),
            ).item()
            for b in batches
        ]
    return sum(losses) / len(losses)


def _train(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Iterator[Tensor],
    steps: int,
    validation: list[Tensor],
    description: str,
) -> History:
    return train(
        model,
        LanguageModel(model).loss,
        optimizer,
        batches,
        steps,
        validation,
        eval_every=0,
        description=description,
        progress=False,
    )


# What the plain process runs: no unit_scaling anywhere.
PLAIN = """
import json, sys
sys.modules["unit_scaling"] = None  # importing it now raises ImportError
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM
folder, batches, prompt, new_tokens = sys.argv[1:5]
model = AutoModelForCausalLM.from_pretrained(folder).eval()
losses = []
with torch.no_grad():
    for b in torch.load(batches, weights_only=True):
        logits = model(input_ids=b).logits[:, :-1].flatten(0, 1).double()
        losses.append(F.cross_entropy(logits, b[:, 1:].flatten()).item())
    ids = torch.tensor([list(prompt.encode())])
    torch.manual_seed(0)
    out = model.generate(
        ids,
        max_new_tokens=int(new_tokens),
        min_new_tokens=int(new_tokens),
        do_sample=True,
        temperature=0.7,
        top_k=0,
        pad_token_id=0,
    )
print(json.dumps({
    "class": type(model).__name__,
    "validation_loss": sum(losses) / len(losses),
    "text": bytes(out[0].tolist()).decode("utf-8", errors="replace"),
    "unit_scaling_importable": "unit_scaling" in sys.modules
    and sys.modules["unit_scaling"] is not None,
}))
"""


def run_plain(folder: Path, batches: Path, config: Config) -> dict[str, Any]:
    """Load the export with plain transformers in a fresh process."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            PLAIN,
            str(folder),
            str(batches),
            PROMPT,
            str(config.new_tokens),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    config, args = parse_config(Config, argv, parser=run_parser(__doc__.split("\n")[0]))
    torch.set_num_threads(1)
    start = time.perf_counter()
    corpus = Corpus()
    stream = corpus.batches("train", config.batch_size, config.seq_len, config.seed)
    batches = [next(stream) for _ in range(config.steps)]
    validation = [
        corpus.get_batch("validation", config.batch_size, config.seq_len, generator=i)
        for i in range(config.val_batches)
    ]
    half = config.steps // 2
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        # 1. Train the first half, checkpoint.
        model = unit_scale(make_model(config))
        optimizer = uu.optim.AdamW(model.parameters(), lr=config.lr)
        first = _train(model, optimizer, iter(batches[:half]), half, validation, "1st")
        model.save_pretrained(work / "checkpoint")
        torch.save(optimizer.state_dict(), work / "optimizer.pt")
        # 2. The uninterrupted run's second half...
        second = _train(model, optimizer, iter(batches[half:]), half, validation, "2nd")
        # ... and the same half again, from the checkpoint.
        from transformers import AutoModelForCausalLM

        resumed = unit_scale(AutoModelForCausalLM.from_pretrained(work / "checkpoint"))
        resumed_optimizer = uu.optim.AdamW(resumed.parameters(), lr=config.lr)
        resumed_optimizer.load_state_dict(
            torch.load(work / "optimizer.pt", weights_only=True)
        )
        again = _train(
            resumed,
            resumed_optimizer,
            iter(batches[half:]),
            half,
            validation,
            "resumed",
        )
        gaps = [
            abs(b / a - 1)
            for a, b in zip(second.train_loss, again.train_loss, strict=True)
        ]
        # 3. Export, save; 4. load with plain transformers elsewhere.
        trained_loss = validation_loss(model, validation)
        export = to_plain(model, kwargs={"input_ids": validation[0]})
        export.module.save_pretrained(work / "export")
        config_text = (work / "export" / "config.json").read_text()
        torch.save(validation, work / "validation.pt")
        plain = run_plain(work / "export", work / "validation.pt", config)
    seconds = time.perf_counter() - start
    outcome = {
        "first_half": first,
        "second_half": second,
        "resumed": again,
        "resume_gap": max(gaps),
        "trained_loss": trained_loss,
        "export": export,
        "plain": plain,
        "config_mentions_unit_scaling": "unit_scaling" in config_text,
        "seconds": seconds,
    }
    out = Path(args.out) if args.out else DOCS
    out.mkdir(parents=True, exist_ok=True)
    (out / "checkpoint_export.md").write_text(report(config, outcome))
    print(f"wrote {out / 'checkpoint_export.md'}")
    return outcome


def report(config: Config, outcome: dict[str, Any]) -> str:
    plain = outcome["plain"]
    export = outcome["export"]
    trained = outcome["trained_loss"]
    export_gap = abs(plain["validation_loss"] / trained - 1)
    resume_gap = outcome["resume_gap"]
    met = export_gap <= EXPORT_TARGET and resume_gap <= RESUME_TARGET
    second: History = outcome["second_half"]
    again: History = outcome["resumed"]
    half = config.steps // 2
    picks = sorted({0, 1, half // 2, half - 1})
    rows = [
        (
            half + i + 1,
            f"{second.train_loss[i]:.6f}",
            f"{again.train_loss[i]:.6f}",
            f"{abs(again.train_loss[i] / second.train_loss[i] - 1):.1e}",
        )
        for i in picks
    ]
    table = markdown_table(
        ("step", "uninterrupted", "resumed from the checkpoint", "relative gap"), rows
    )
    folded, unfolded = export.folded, export.unfolded
    ratios = ", ".join(
        f"L={n}: {r:.2f}" for n, r in sorted(export.attention_ratios.items())
    )
    length_errors = ", ".join(
        f"{e:.0%} at L={n}" for n, e in sorted(export.length_errors.items())
    )
    settings = "\n".join(f"- {k}: {v}" for k, v in asdict(config).items())
    # (a code block of its own: no backticks, no blank line)
    text = "\n".join(
        line for line in plain["text"].replace("`", "'").splitlines() if line.strip()
    )
    command = "python experiments/checkpoint_export.py" + (
        " --quick" if config.quick else ""
    )
    return reflow(f"""# From training to plain inference: checkpoint, resume, export

`{command}` trains `unit_scale(LlamaForCausalLM)` (width {config.width},
{config.layers} layer(s), byte vocabulary, built from a config) with
`uu.optim.AdamW` (lr {config.lr:g}, constant) for {config.steps} steps of
{config.batch_size}×{config.seq_len} bytes of the built-in corpus, checkpointing
with `save_pretrained` at step {half}; resumes from that checkpoint in a fresh
model and optimizer; exports the trained model with
`unit_scaling.export.to_plain` and loads the export in a fresh Python process in
which `unit_scaling` cannot be imported, with plain `transformers`. {
        outcome["seconds"]:.0f} s on one CPU thread.

**Result: {"both targets met" if met else "not both targets met"}.** The
exported model's validation loss is {plain["validation_loss"]:.6f} against the
trained model's {trained:.6f} (relative gap {export_gap:.1e}; target
{EXPORT_TARGET:g}). Resumed from the checkpoint, training follows the
uninterrupted run to a largest relative gap of {resume_gap:.1e} over the
{half} resumed steps (target {RESUME_TARGET:g} at each).

## Resuming

{table}

`unit_scale(AutoModelForCausalLM.from_pretrained(...))` logged that the model
records it was trained unit-scaled and kept its weights and the recorded scales
(the checkpoint's `config.json` carries the record under `unit_scaling`); the
optimizer's state dict carried the rest, with u-μP's per-parameter learning
rates unchanged.

## The export

`to_plain` returned a `{plain["class"]}` of the original class with
{len(folded)} parameter(s) rescaled and {len(unfolded)} scale(s) it could not
fold; its saved `config.json` {
        "mentions" if outcome["config_mentions_unit_scaling"] else "does not mention"
    } `unit_scaling`. Largest relative difference of the logits from the
unit-scaled model's on the example batch:
{export.max_rel_error:.1e}.

Unit-scaled attention multiplies its output by a scale `c(L)` that depends on the
key length `L` (and the mask), which no fixed weight can follow: the export folds
`c` at the training length ({export.seq_len} tokens) and computes the trained
model's function there. At other lengths the unit-scaled model's attention
outputs are `c(L)/c({export.seq_len})` times the export's ({ratios}), and their
logits differ by {length_errors} (largest relative difference). Which of the two
is the better model away from the training length is open; the export at least
treats every length alike.

Sampled text (temperature 0.7, seed 0) from the export in the plain process,
after the prompt `{PROMPT!r}` ({config.new_tokens} bytes):

```text
{text}
```

## Settings

{settings}
""")


if __name__ == "__main__":
    main()
