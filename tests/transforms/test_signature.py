"""A transformed module reports its own forward's signature.

Tools read a model's arguments with :func:`inspect.signature`: Hugging Face's
``Trainer`` keeps only the dataset columns the forward names (and passes
``num_items_in_batch`` only to a forward that takes ``**kwargs``), PEFT and
Accelerate inspect it too. A transform's forward must therefore say what the
wrapped forward takes, not ``(*args, **kwargs)``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest
from torch import Tensor, nn

from unit_scaling.float8 import convert_to_float8_training
from unit_scaling.formats import FPFormat
from unit_scaling.transforms import (
    compile,
    simulate_format,
    simulate_fp8,
    track_scales,
    unit_scale,
)

transformers = pytest.importorskip("transformers")


class _Keywords(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(
        self, x: Tensor, *, scale: float = 1.0, mask: Tensor | None = None
    ) -> Tensor:
        return self.proj(x) * scale


def _fp8(module: nn.Module) -> nn.Module:
    return convert_to_float8_training(unit_scale(module))


TRANSFORMS: dict[str, Callable[[nn.Module], nn.Module]] = {
    "unit_scale": unit_scale,
    "track_scales": track_scales,
    "simulate_fp8": simulate_fp8,
    "simulate_format": lambda m: simulate_format(m, FPFormat(4, 3), FPFormat(5, 2)),
    "compile": compile,
    "convert_to_float8_training": _fp8,
    "chain": lambda m: track_scales(simulate_fp8(unit_scale(m))),
}


def _gpt2() -> nn.Module:
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)
    return transformers.GPT2LMHeadModel(config)


@pytest.mark.parametrize("name", list(TRANSFORMS))
@pytest.mark.parametrize("make", [_Keywords, _gpt2], ids=["keywords", "gpt2"])
def test_the_forward_signature_is_the_wrapped_one(
    name: str, make: Callable[[], nn.Module]
) -> None:
    original = make()
    transformed = TRANSFORMS[name](original)
    assert inspect.signature(transformed.forward) == inspect.signature(original.forward)


def test_trainer_keeps_the_columns_the_model_takes() -> None:
    """What ``Trainer``'s column pruning reads: the forward's parameter names."""
    scaled = unit_scale(_gpt2())
    names = list(inspect.signature(scaled.forward).parameters)
    assert {"input_ids", "labels", "attention_mask"} <= set(names)
    kinds = [p.kind for p in inspect.signature(scaled.forward).parameters.values()]
    assert inspect.Parameter.VAR_KEYWORD in kinds  # so Trainer passes loss kwargs
