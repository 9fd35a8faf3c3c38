"""Hugging Face ``Trainer`` with unit-scaled models: stock, and with
``unit_scaling.integrations.hf.UnitScalingTrainer``."""

from __future__ import annotations

import math
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import unit_scaling as uu
from tests.integrations.models import (
    StepProbe,
    Tokens,
    accelerate_environment,
    arguments,
    median_weight_rms,
    recording,
    scaled,
    transformers,
    whole_batch_grads,
    worst_error,
)
from tests.parallel._launch import run_distributed
from unit_scaling.app.baseline import StandardTransformerDecoder
from unit_scaling.float8 import convert_to_float8_training
from unit_scaling.integrations.hf import (
    TRAINER_DEFAULT_LR,
    CausalLM,
    UnitScalingTrainer,
)
from unit_scaling.parameter import is_unit_scaled
from unit_scaling.transforms import (
    checkpoint_record,
    load_checkpoint_record,
    simulate_fp8,
)

Trainer = transformers.Trainer

# One case of each claim in the default run; the rest under `integration`
# (tests/conftest.py).
DEFAULT_RUN = {
    "test_a_stock_trainer_trains_with_unit_scaled_gradients[llama-float]",
    "test_the_integration_accumulates_to_the_whole_batch[2-with-count]",
    "test_the_integration_builds_u_mup_optimizers",
    "test_the_integration_rejects_what_it_cannot_honour",
}


class _IntegerCount(Trainer):  # type: ignore[misc]
    """A Trainer passing num_items_in_batch as a Python int (custom loops do)."""

    def _get_num_items_in_batch(self, *args: Any, **kwargs: Any) -> Any:
        count = super()._get_num_items_in_batch(*args, **kwargs)
        return None if count is None else int(count)


def _first_step(
    trainer_class: type,
    model: Any,
    tmp_path: Path,
    reference: Any = None,
    **overrides: Any,
) -> StepProbe:
    """One optimizer step of ``trainer_class``; the probe's gradients."""
    probe = StepProbe(reference)
    optimizer = (
        uu.optim.AdamW(model.parameters(), lr=0.5)
        if is_unit_scaled(model)
        else torch.optim.AdamW(model.parameters(), lr=1e-3)
    )
    trainer = recording(trainer_class, probe)(
        model=model,
        args=arguments(tmp_path, max_grad_norm=0.0, **overrides),
        train_dataset=Tokens(),
        callbacks=[probe],
        optimizers=(optimizer, None),
    )
    trainer.train()
    assert probe.accumulated is not None and probe.whole is not None
    return probe


@pytest.mark.parametrize(
    "trainer_class", [Trainer, _IntegerCount], ids=["float", "int"]
)
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_a_stock_trainer_trains_with_unit_scaled_gradients(
    name: str, trainer_class: type, tmp_path: Path
) -> None:
    """Default arguments (column pruning, num_items_in_batch, clipping on): the
    gradients before clipping are unit-scaled at the first step."""
    model = scaled(name)
    seen: list[float] = []
    trainer = trainer_class(
        model=model,
        args=arguments(tmp_path),
        train_dataset=Tokens(),
        optimizers=(uu.optim.AdamW(model.parameters(), lr=0.5), None),
    )
    clip = trainer.accelerator.clip_grad_norm_

    def before_clipping(parameters: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(
            median_weight_rms(
                {
                    str(i): p.grad
                    for i, p in enumerate(model.parameters())
                    if p.grad is not None
                }
            )
        )
        return clip(parameters, *args, **kwargs)

    trainer.accelerator.clip_grad_norm_ = before_clipping
    result = trainer.train()
    assert math.isfinite(result.training_loss)
    assert 0.5 <= seen[0] <= 2, seen


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_a_stock_trainer_accumulates_to_the_whole_batch(
    name: str, k: int, tmp_path: Path
) -> None:
    probe = _first_step(
        Trainer,
        scaled(name),
        tmp_path,
        gradient_accumulation_steps=k,
        per_device_train_batch_size=8 // k,
    )
    assert len(probe.batches) == k
    error, where = worst_error(probe.accumulated, probe.whole)  # type: ignore[arg-type]
    assert error <= 1e-5, where


def _without_count(trainer_class: type) -> type:
    """``trainer_class`` whose model is said not to take loss kwargs: Trainer
    passes no num_items_in_batch and divides each loss by the steps."""

    class WithoutCount(trainer_class):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.model_accepts_loss_kwargs = False

    return WithoutCount


def test_without_a_count_a_stock_trainer_is_k_to_the_minus_half_off(
    tmp_path: Path,
) -> None:
    probe = _first_step(
        _without_count(Trainer),
        scaled("llama"),
        tmp_path,
        gradient_accumulation_steps=4,
        per_device_train_batch_size=2,
    )
    name = "lm_head.weight"
    ratio = probe.accumulated[name].norm() / probe.whole[name].norm()  # type: ignore[index]
    assert float(ratio) == pytest.approx(0.5, rel=1e-4)


@pytest.mark.parametrize("count", [True, False], ids=["with-count", "without-count"])
@pytest.mark.parametrize("k", [2, 4])
def test_the_integration_accumulates_to_the_whole_batch(
    k: int, count: bool, tmp_path: Path
) -> None:
    trainer_class = UnitScalingTrainer if count else _without_count(UnitScalingTrainer)
    probe = _first_step(
        trainer_class,
        scaled("gpt2"),
        tmp_path,
        gradient_accumulation_steps=k,
        per_device_train_batch_size=8 // k,
    )
    error, where = worst_error(probe.accumulated, probe.whole)  # type: ignore[arg-type]
    assert error <= 1e-5, where


def test_the_integration_builds_u_mup_optimizers(tmp_path: Path) -> None:
    model = scaled("llama")
    with pytest.warns(UserWarning, match="Trainer's default.*RECOMMENDED's 0.5"):
        trainer = UnitScalingTrainer(model=model, args=arguments(tmp_path))
        optimizer = trainer.create_optimizer()
    assert isinstance(optimizer, uu.optim.AdamW)
    assert TRAINER_DEFAULT_LR == 5e-5
    reference = uu.optim.AdamW(model.parameters(), lr=uu.RECOMMENDED.unit_scale_lr)
    assert sorted(g["lr"] for g in optimizer.param_groups) == sorted(
        g["lr"] for g in reference.param_groups
    )
    given = UnitScalingTrainer(
        model=model,
        args=arguments(tmp_path, learning_rate=0.25, optim="sgd", weight_decay=0.1),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sgd = given.create_optimizer()
    assert isinstance(sgd, uu.optim.SGD)
    assert max(g["lr"] for g in sgd.param_groups) <= 0.25
    assert {g["weight_decay"] for g in sgd.param_groups} == {0.0, 0.1}  # torch's sense


def test_the_integration_rejects_what_it_cannot_honour(tmp_path: Path) -> None:
    model = scaled("llama")
    with pytest.raises(ValueError, match=r"optimizers=.AdamW.*unit_scaling.optim"):
        UnitScalingTrainer(
            model=model,
            args=arguments(tmp_path),
            optimizers=(torch.optim.AdamW(model.parameters()), None),
        )
    with pytest.raises(ValueError, match="no u-μP tags"):
        UnitScalingTrainer(
            model=transformers.GPT2LMHeadModel(
                transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)
            ),
            args=arguments(tmp_path),
        )
    trainer = UnitScalingTrainer(
        model=model, args=arguments(tmp_path, optim="adafactor")
    )
    with pytest.raises(ValueError, match="optim='adafactor' has no u-μP"):
        trainer.create_optimizer()
    with pytest.warns(UserWarning, match="loss is computed outside the model"):
        UnitScalingTrainer(
            model=model,
            args=arguments(tmp_path),
            compute_loss_func=lambda *a, **k: torch.tensor(0.0),
        )


def test_max_grad_norm_bounds_the_gradients_rms(tmp_path: Path) -> None:
    model = scaled("llama")
    probe = StepProbe()
    trainer = recording(UnitScalingTrainer, probe)(
        model=model,
        args=arguments(tmp_path, max_grad_norm=0.25, learning_rate=0.5),
        train_dataset=Tokens(),
        callbacks=[probe],
    )
    trainer.train()
    clipped = torch.cat([g.flatten() for g in probe.accumulated.values()])  # type: ignore[union-attr]
    assert float(clipped.pow(2).mean().sqrt()) == pytest.approx(0.25, rel=1e-4)
    logged = next(h for h in trainer.state.log_history if "grad_rms" in h)
    assert logged["grad_rms"] > 0.25  # before clipping
    size = clipped.numel()
    assert logged["grad_norm"] == pytest.approx(
        logged["grad_rms"] * math.sqrt(size), rel=1e-5
    )


def test_a_resumed_run_follows_the_uninterrupted_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """GPT-2 (its readout tied to the embedding): save at step 2 of 4, resume a
    fresh unit_scale'd model from there."""

    def run(resume: str | None) -> tuple[list[float], Any]:
        model = scaled("gpt2")
        args = arguments(
            tmp_path,
            max_steps=4,
            save_strategy="steps",
            save_steps=2,
            learning_rate=0.5,
            seed=0,
        )
        trainer = UnitScalingTrainer(model=model, args=args, train_dataset=Tokens())
        trainer.train(resume_from_checkpoint=resume)
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        return losses, model

    whole, _ = run(None)
    with caplog.at_level("WARNING"):
        resumed, model = run(str(tmp_path / "checkpoint-2"))
    assert (tmp_path / "checkpoint-2" / "unit_scaling.json").is_file()
    assert max(abs(a - b) for a, b in zip(whole[2:], resumed[2:], strict=True)) <= 1e-6
    assert not [r for r in caplog.records if "missing keys" in r.getMessage()]
    assert model.lm_head.weight is model.transformer.wte.weight


@pytest.mark.parametrize(
    "variant", ["bf16", "simulate_fp8", "convert_to_float8_training", "torch_compile"]
)
def test_the_integration_trains_evaluates_and_predicts(
    variant: str, tmp_path: Path
) -> None:
    model = scaled("llama")
    options: dict[str, Any] = {}
    if variant == "simulate_fp8":
        model = simulate_fp8(model)
    elif variant == "convert_to_float8_training":
        model = convert_to_float8_training(model)
    else:
        options[variant] = True
    args = arguments(tmp_path, max_steps=3, learning_rate=0.5, **options)
    trainer = UnitScalingTrainer(
        model=model, args=args, train_dataset=Tokens(), eval_dataset=Tokens(16, seed=1)
    )
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert losses[-1] < losses[0]
    assert math.isfinite(trainer.evaluate()["eval_loss"])
    predictions = trainer.predict(Tokens(8, seed=2)).predictions
    logits = predictions[0] if isinstance(predictions, tuple) else predictions
    assert logits.shape == (8, 32, 256)


def _own_loss_grads(lm: Any, batches: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """The gradients of the decoder's own ``.loss`` on the concatenated batches
    (what our training loop computes), keyed as in the adapter."""
    saved = {n: p.grad for n, p in lm.named_parameters()}
    lm.zero_grad(set_to_none=True)
    lm.decoder.loss(torch.cat(batches)).backward()
    out = {n: p.grad.clone() for n, p in lm.named_parameters() if p.grad is not None}
    for n, p in lm.named_parameters():
        p.grad = saved[n]
    return out


@pytest.mark.parametrize("plain", [False, True], ids=["uu", "plain-baseline"])
def test_our_decoders_train_in_trainer_as_in_our_loop(
    plain: bool, tmp_path: Path
) -> None:
    """Two micro-batches in Trainer step with the gradient of the decoder's own
    .loss on their concatenation: u-μP in UnitScalingTrainer, the plain
    baseline in a stock Trainer."""
    torch.manual_seed(0)
    if plain:
        lm, trainer_class = CausalLM(StandardTransformerDecoder(64, 256, 2, 4)), Trainer
    else:
        decoder = uu.TransformerDecoder(64, 256, 2, 4, **uu.RECOMMENDED.multipliers)
        lm, trainer_class = CausalLM(decoder), UnitScalingTrainer
    probe = _first_step(
        trainer_class,
        lm,
        tmp_path,
        _own_loss_grads,
        gradient_accumulation_steps=2,
        per_device_train_batch_size=4,
    )
    error, where = worst_error(probe.accumulated, probe.whole)  # type: ignore[arg-type]
    assert error <= 1e-5, where


def test_the_plain_baseline_is_not_for_the_integration(tmp_path: Path) -> None:
    lm = CausalLM(StandardTransformerDecoder(64, 256, layers=2, heads=4))
    with pytest.raises(ValueError, match="no u-μP tags"):
        UnitScalingTrainer(model=lm, args=arguments(tmp_path))


def test_a_lora_adapter_after_unit_scale_trains_in_the_integration(
    tmp_path: Path,
) -> None:
    peft = pytest.importorskip("peft")
    model = scaled("llama")
    ids = Tokens(8).ids
    before = model(input_ids=ids).logits
    lora = peft.get_peft_model(
        model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    )
    assert torch.equal(lora(input_ids=ids).logits, before)
    args = arguments(tmp_path, max_steps=4, learning_rate=2**-4)
    rows = Tokens(8)  # one batch, seen at every step
    trainer = UnitScalingTrainer(
        model=lora, args=args, train_dataset=rows, eval_dataset=rows
    )
    start = trainer.evaluate()["eval_loss"]
    trainer.train()
    assert trainer.evaluate()["eval_loss"] < start
    trained = [n for n, p in lora.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in n for n in trained)


def test_the_example_trains_in_fp8_and_fp32() -> None:
    root = Path(__file__).resolve().parents[2]
    command = [sys.executable, str(root / "examples" / "train_hf_trainer.py")]
    command += ["--steps", "4", "--width", "64", "--batch-size", "4"]
    done = subprocess.run(
        command, cwd=root, capture_output=True, text=True, check=True, timeout=600
    )
    lines = done.stdout.splitlines()
    assert any(line.startswith("u-μP FP32: validation loss") for line in lines)
    assert any(line.startswith("u-μP simulated FP8: validation loss") for line in lines)
    assert lines[-1].startswith("FP8 - FP32: ")


def _measured(model: nn.Module) -> dict[str, Any]:
    """``model``'s weights and what ``unit_scale`` measured at its first call
    (which draws its initial weights from the random state of that moment)."""
    weights = {n: t.detach().clone() for n, t in model.state_dict().items()}
    return {"weights": weights, "record": checkpoint_record(model)}


def _trainer_step(
    rank: int, world_size: int, directory: str, average_tokens: bool
) -> dict[str, Any]:
    """One UnitScalingTrainer step on ``rank`` of two (DDP over gloo, 2
    micro-batches of 2 rows each): the micro-batches it saw and its reduced
    gradients."""
    accelerate_environment(rank, world_size)
    probe = StepProbe(reference=lambda model, batches: _measured(model))
    trainer = recording(UnitScalingTrainer, probe)(
        model=scaled("gpt2"),
        args=arguments(
            f"{directory}/{rank}",
            max_grad_norm=0.0,
            per_device_train_batch_size=2,
            gradient_accumulation_steps=2,
            average_tokens_across_devices=average_tokens,
            ddp_backend="gloo",
            learning_rate=0.5,
        ),
        train_dataset=Tokens(),
        callbacks=[probe],
    )
    trainer.train()
    assert probe.accumulated is not None
    return {"batches": probe.batches, "grads": probe.accumulated, **probe.whole}


@pytest.mark.distributed
@pytest.mark.parametrize("average_tokens", [True, False], ids=["global", "per-rank"])
def test_two_trainer_processes_step_as_one_on_the_global_batch(
    average_tokens: bool, tmp_path: Path
) -> None:
    """Trainer's count over every process (the default: Trainer scales each
    loss by W, the reduction takes the mean) and its count per process (the
    reduction takes sum / sqrt(W)) both give one call's gradient."""
    ranks = run_distributed(_trainer_step, str(tmp_path), average_tokens)
    # The ranks' model as they measured it, and called as Trainer calls it (the
    # key/value cache off: its outputs make another graph, measured anew).
    model = scaled("gpt2")
    model.load_state_dict(ranks[0]["weights"])
    load_checkpoint_record(model, ranks[0]["record"])
    model.config.use_cache = False
    whole = whole_batch_grads(model, [b for r in ranks for b in r["batches"]])
    for rank in ranks:
        assert len(rank["batches"]) == 2
        error, where = worst_error(rank["grads"], whole)
        assert error <= 1e-5, (where, error)


def test_deepspeed_is_an_error(tmp_path: Path) -> None:
    class WithDeepSpeed(UnitScalingTrainer):
        def create_accelerator_and_postprocess(self) -> None:
            super().create_accelerator_and_postprocess()
            self.is_deepspeed_enabled = True  # what Trainer sets for a DeepSpeed config

    with pytest.raises(ValueError, match="DeepSpeed scales and reduces"):
        WithDeepSpeed(model=scaled("llama"), args=arguments(tmp_path))


def test_unequal_micro_batches_without_a_count_get_one_warning(tmp_path: Path) -> None:
    """6 rows in micro-batches of 4: the step's second micro-batch has 2."""

    class WithoutCount(UnitScalingTrainer):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.model_accepts_loss_kwargs = False

    args = arguments(
        tmp_path,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        max_steps=2,
        learning_rate=0.5,
    )
    trainer = WithoutCount(model=scaled("llama"), args=args, train_dataset=Tokens(6))
    with pytest.warns(UserWarning, match="micro-batches of one step differ") as seen:
        trainer.train()
    assert len([w for w in seen if "differ" in str(w.message)]) == 1
