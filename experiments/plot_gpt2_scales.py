"""Scale plots of a small GPT-2, as built and after ``unit_scale``.

Builds a Hugging Face ``GPT2LMHeadModel`` from a config (random weights, nothing
downloaded), tracks the scale of every tensor through one forward and backward
pass on the built-in corpus, and writes
``docs/results/img/scales_plain_gpt2.png`` and
``docs/results/img/scales_unit_scaled_gpt2.png``::

    python experiments/plot_gpt2_scales.py
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from unit_scaling.analysis import example_batch, visualiser
from unit_scaling.transforms import unit_scale

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=256,
        n_positions=128,
        n_embd=128,
        n_layer=2,
        n_head=4,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(config).eval()  # eval: no dropout noise in the scales
    # Name the loss: otherwise transformers logs a warning inside forward, which
    # TorchDynamo cannot trace (a graph break).
    model.loss_type = "ForCausalLM"
    batch = example_batch(batch_size=4, seq_len=64)
    models = {
        "plain": (model, "GPT-2 (2 layers, width 128), as built: standard init"),
        "unit_scaled": (unit_scale(model), "The same GPT-2 after unit_scale"),
    }
    for name, (m, title) in models.items():
        ax = visualiser(m, batch, title=title)
        path = ROOT / "docs" / "results" / "img" / f"scales_{name}_gpt2.png"
        ax.figure.savefig(path, dpi=120)
        plt.close(ax.figure)
        print("wrote", path.relative_to(ROOT))


if __name__ == "__main__":
    main()
