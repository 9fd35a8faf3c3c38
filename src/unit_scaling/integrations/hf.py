"""Hugging Face ``Trainer`` for unit-scaled and u-μP models.

A stock ``transformers.Trainer`` already trains a model made by
:func:`~unit_scaling.transforms.unit_scale` with unit-scaled gradients: the
model keeps its forward's signature, and ``unit_scale`` recognises the loss's
division by ``num_items_in_batch`` (the tokens of the whole step, which
``Trainer`` counts over micro-batches and processes) as
:func:`unit_scaling.functional.step_mean`, so accumulated micro-batches add up
to one call's gradient on the whole step. What a stock ``Trainer`` cannot know
about such a model, :class:`UnitScalingTrainer` adds (two lines: import it,
and construct it where ``Trainer`` was):

* **u-μP's learning rates.** ``create_optimizer`` builds
  :class:`unit_scaling.optim.AdamW` (or ``SGD`` for ``optim="sgd"``) from the
  ``TrainingArguments``: one learning rate per parameter by its u-μP type,
  fan-in and depth; betas, eps and weight decay as given (weight decay in
  torch's sense, ``lr · weight_decay`` per step).
* **The learning rate left at ``Trainer``'s default.** ``5e-5`` is a
  fine-tuning value of the standard parametrisation, about ``10⁴`` below
  u-μP's; nobody who left it unset meant it for a u-μP model, and training
  at it barely moves the weights. The optimizer takes
  :data:`unit_scaling.RECOMMENDED`'s value instead (``unit_scale_lr`` for a
  ``unit_scale`` output, ``lr`` for a native ``uu`` model), with one warning
  saying so. Any other ``learning_rate`` is used as given.
* **Clipping.** A unit-scaled gradient has RMS about 1, so its norm is about
  ``√(parameters)``: ``max_grad_norm=1.0`` would shrink every step by a factor
  of hundreds. ``max_grad_norm`` is read as a bound on the gradient's RMS
  (clip when the norm exceeds ``max_grad_norm · √(parameters)``), which means
  the same at every model size; the logs gain ``grad_rms`` beside
  ``grad_norm``. ``max_grad_norm=0`` still turns clipping off.
* **Accumulation without ``num_items_in_batch``** (a model that takes no
  ``**kwargs``, or a dataset without labels): ``Trainer`` divides each
  micro-batch's loss by the accumulation steps ``k``; here its gradient is
  scaled by ``k^-½`` instead (:func:`unit_scaling.functional.micro_batch_loss`).
* **Data parallelism.** The ``Trainer``'s accelerator becomes
  :class:`unit_scaling.integrations.accelerate.Accelerator`: DDP reduces with
  ``sum / √W`` when each process's loss counts its own tokens, and with the
  mean when ``Trainer``'s count already covers every process
  (``average_tokens_across_devices``, the default: ``Trainer`` multiplies each
  loss by ``W`` to undo the mean); FSDP2 keeps the u-μP tags. The model's
  first call (a training step's, or an evaluation's) starts with a call on
  process 0's inputs on every process
  (:func:`unit_scaling.parallel.calibrate_at_first_call`), so that what
  ``unit_scale`` measures at its first call is the same everywhere.
* **Checks.** A model that is not unit-scaled, DeepSpeed, an optimizer that is
  not a :mod:`unit_scaling.optim` one, or ``optim`` names with no u-μP rule are
  errors; a loss computed outside the model (``compute_loss_func``, label
  smoothing) is a warning, as its gradient is not unit-scaled.

:class:`UnitScalingMixin` is the same for another ``Trainer`` subclass
(``class MyTrainer(UnitScalingMixin, SFTTrainer)``). :class:`CausalLM` lets
this library's own decoders (``uu.TransformerDecoder`` and the standard
baseline) go into a ``Trainer``.

Example::

    from unit_scaling.integrations.hf import UnitScalingTrainer

    trainer = UnitScalingTrainer(
        model=unit_scale(model, residual_scaling="u-μP"),
        args=TrainingArguments("out", per_device_train_batch_size=8),
        train_dataset=dataset,
    )
    trainer.train()
"""

from __future__ import annotations

import json
import logging
import math
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import functional as U
from .. import optim as uu_optim
from ..optim import mup_tags
from ..parallel import calibrate_at_first_call
from ..parameter import is_unit_scaled
from ..recommended import RECOMMENDED
from ..transforms import (
    checkpoint_record,
    load_checkpoint_record,
    tag_added_parameters,
)
from ._hf_monitor import MonitorCallback, add_monitor
from ._models import base_model, made_by_unit_scale
from .accelerate import Accelerator

try:
    import transformers
    from transformers.modeling_outputs import CausalLMOutput
except ImportError as error:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "unit_scaling.integrations.hf needs transformers (>= 5.0) and accelerate: "
        "pip install 'torch-unit-scaling[hf]'"
    ) from error

__all__ = [
    "RECORD_FILE",
    "CausalLM",
    "MonitorCallback",
    "UnitScalingMixin",
    "UnitScalingTrainer",
    "add_monitor",
]

logger = logging.getLogger(__name__)

RECORD_FILE = "unit_scaling.json"
"""The file beside a ``Trainer`` checkpoint's weights holding what ``unit_scale``
measured (:func:`unit_scaling.transforms.checkpoint_record`)."""

# TrainingArguments' default learning rate (what a user who set none gets).
TRAINER_DEFAULT_LR: float = transformers.TrainingArguments.__dataclass_fields__[
    "learning_rate"
].default  # type: ignore[assignment]

_UNIT_SCALED_OPTIMIZERS = (uu_optim.AdamW, uu_optim.Adam, uu_optim.SGD)


class UnitScalingMixin:
    """What :class:`UnitScalingTrainer` adds to ``transformers.Trainer``, for any
    ``Trainer`` subclass: put it first, ``class T(UnitScalingMixin, Trainer)``.
    See the module docstring for what each part does.

    Raises:
        ValueError: at construction, for a model that is not unit-scaled, for
            DeepSpeed, or for ``optimizers=`` holding an optimizer that is not
            one of :mod:`unit_scaling.optim`'s; when the optimizer is made,
            for an ``optim`` with no u-μP rule here.
    """

    # (what Trainer defines, for the type checker)
    args: Any
    model: Any
    optimizer: Any
    accelerator: Any
    compute_loss_func: Any
    label_smoother: Any
    model_accepts_loss_kwargs: Any
    is_deepspeed_enabled: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        model = base_model(self.model)
        if made_by_unit_scale(model):
            # an adapter attached after unit_scale: tagged before its first call
            tag_added_parameters(model)
            if self.args.world_size > 1:
                calibrate_at_first_call(self.model)
        if not is_unit_scaled(model):
            raise ValueError(
                f"{type(self).__name__} trains unit-scaled models, and "
                f"{type(model).__name__}'s parameters carry no u-μP tags: pass "
                "unit_scaling.transforms.unit_scale(model) (or a unit_scaling "
                "model), or use transformers.Trainer"
            )
        if self.is_deepspeed_enabled:
            raise ValueError(
                f"{type(self).__name__}: DeepSpeed scales and reduces gradients "
                "itself, which the unit-scaled rule cannot follow; use DDP or "
                "FSDP2 (TrainingArguments(fsdp=..., fsdp_config={'version': 2}))"
            )
        if self.optimizer is not None and not isinstance(
            self.optimizer, _UNIT_SCALED_OPTIMIZERS
        ):
            raise ValueError(
                f"{type(self).__name__}: optimizers=({type(self.optimizer).__name__}"
                ", ...) does not apply u-μP's per-parameter learning rates; pass a "
                "unit_scaling.optim optimizer (uu.optim.AdamW(model.parameters(), "
                "lr=...)), or none to have one made from the TrainingArguments"
            )
        if self.compute_loss_func is not None or self.label_smoother is not None:
            warnings.warn(
                f"{type(self).__name__}: the loss is computed outside the model "
                "(compute_loss_func or label_smoothing_factor), with torch's ops: "
                "its gradient is not unit-scaled (a mean over N tokens divides it "
                "by N). Let the model compute its loss (labels=...), or compute it "
                "with unit_scaling.functional.cross_entropy and U.step_mean",
                UserWarning,
                stacklevel=2,
            )
        self._tags = mup_tags(self.model)
        self._grad_elements: int | None = None
        self._step_sizes: dict[int, tuple[int, ...]] = {}
        self._warned_unequal = False
        if getattr(self.args, "max_grad_norm", 0):
            logger.info(
                "%s: max_grad_norm=%g is read as a bound on the gradient's RMS "
                "(clipping when its norm exceeds max_grad_norm * sqrt(parameters))",
                type(self).__name__,
                self.args.max_grad_norm,
            )

    def create_accelerator_and_postprocess(self) -> None:
        """``Trainer``'s, with its accelerator made a
        :class:`unit_scaling.integrations.accelerate.Accelerator`."""
        super().create_accelerator_and_postprocess()  # type: ignore[misc]
        Accelerator.adopt(self.accelerator)
        # Trainer accumulates itself (its accelerator's steps are 1) and keeps
        # the reduction in step with its own loss scaling (compute_loss).
        self.accelerator.infer_reduction = False
        self.accelerator.clip_by_rms = True

    # -- the optimizer ------------------------------------------------------ #
    def create_optimizer(self, model: nn.Module | None = None) -> torch.optim.Optimizer:
        """A :mod:`unit_scaling.optim` optimizer from the ``TrainingArguments``
        (see the module docstring), unless one was given."""
        if self.optimizer is None:
            self.optimizer = self._unit_scaled_optimizer(model or self.model)
        optimizer: torch.optim.Optimizer = self.optimizer
        return optimizer

    def _unit_scaled_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        args = self.args
        if made_by_unit_scale(model):
            tag_added_parameters(base_model(model))
        name = str(getattr(args.optim, "value", args.optim))
        lr = self._learning_rate(model)
        decay = set(self.get_decay_parameter_names(model))  # type: ignore[attr-defined]
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        groups = [
            {
                "params": [(n, p) for n, p in named if n in decay],
                "weight_decay": args.weight_decay,
            },
            {
                "params": [(n, p) for n, p in named if n not in decay],
                "weight_decay": 0.0,
            },
        ]
        groups = [g for g in groups if g["params"]]
        common: dict[str, Any] = {"independent_weight_decay": False, "tags": self._tags}
        if name.startswith("adamw"):
            betas = (args.adam_beta1, args.adam_beta2)
            return uu_optim.AdamW(
                groups, lr=lr, betas=betas, eps=args.adam_epsilon, **common
            )
        if name == "sgd":
            return uu_optim.SGD(groups, lr=lr, **common)
        raise ValueError(
            f"{type(self).__name__}: optim={name!r} has no u-μP learning-rate rule "
            "here; use optim='adamw_torch' (unit_scaling.optim.AdamW) or 'sgd' "
            "(unit_scaling.optim.SGD), or pass optimizers=(a unit_scaling.optim "
            "optimizer, None)"
        )

    def _learning_rate(self, model: nn.Module) -> float:
        lr = float(self.args.learning_rate)
        if lr != TRAINER_DEFAULT_LR:
            return lr
        recommended = (
            RECOMMENDED.unit_scale_lr if made_by_unit_scale(model) else RECOMMENDED.lr
        )
        warnings.warn(
            f"{type(self).__name__}: learning_rate is Trainer's default, {lr:g}, a "
            "standard-parametrisation value about 10^4 below u-μP's: training at "
            f"unit_scaling.RECOMMENDED's {recommended:g} instead. Set "
            "TrainingArguments(learning_rate=...) to choose another",
            UserWarning,
            stacklevel=3,
        )
        return recommended

    # -- the loss ----------------------------------------------------------- #
    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Tensor | int | None = None,
    ) -> Any:
        """``Trainer``'s, keeping the step's gradient the whole step's (see the
        module docstring): the data-parallel divisor for this step, and
        ``k^-½`` in place of ``1/k`` where ``Trainer`` divides the loss."""
        result = super().compute_loss(  # type: ignore[misc]
            model,
            inputs,
            return_outputs=return_outputs,
            num_items_in_batch=num_items_in_batch,
        )
        if not model.training:
            return result
        loss, outputs = result if return_outputs else (result, None)
        counted = num_items_in_batch is not None and (
            self.model_accepts_loss_kwargs or self.compute_loss_func is not None
        )
        processes = int(self.accelerator.num_processes)
        global_count = counted and bool(self.args.average_tokens_across_devices)
        # Trainer multiplies a loss over every process's tokens by W: the mean
        # undoes it; else the unit-scaled sum / sqrt(W).
        self.accelerator.set_reduction_divisor(
            float(processes) if global_count and processes > 1 else None
        )
        if self._trainer_divides(counted):
            steps = int(getattr(self, "current_gradient_accumulation_steps", 1) or 1)
            if steps > 1:
                self._check_equal_micro_batches(inputs)
                loss = U.micro_batch_loss(loss, 1 / steps) * steps
        return (loss, outputs) if return_outputs else loss

    def _trainer_divides(self, counted: bool) -> bool:
        """Whether ``Trainer.training_step`` divides this loss by the
        accumulation steps (its rule, in transformers 5.0 to 5.24)."""
        scaled = getattr(self, "loss_is_scaled_for_ga", None)
        if scaled is not None:
            return not scaled
        return not counted and self.compute_loss_func is None

    def _check_equal_micro_batches(self, inputs: dict[str, Any]) -> None:
        step = int(getattr(getattr(self, "state", None), "global_step", 0))
        shape = next(
            (tuple(v.shape) for v in inputs.values() if isinstance(v, Tensor)), ()
        )
        first = self._step_sizes.setdefault(step, shape)
        self._step_sizes = {step: first}
        if shape != first and not self._warned_unequal:
            self._warned_unequal = True
            warnings.warn(
                f"{type(self).__name__}: micro-batches of one step differ in size "
                f"({first} and {shape}); without num_items_in_batch each counts "
                "as 1/k of the step, which is the whole batch's gradient only for "
                "equal micro-batches. A model whose forward takes **kwargs gets "
                "Trainer's token count, which weighs them by their tokens",
                UserWarning,
                stacklevel=3,
            )

    # -- checkpoints -------------------------------------------------------- #
    def _save(self, output_dir: str | None = None, state_dict: Any = None) -> None:
        """``Trainer``'s, and beside the weights :data:`RECORD_FILE`: what
        ``unit_scale`` measured, which a resumed run must reuse rather than
        measure again on the trained weights."""
        super()._save(output_dir, state_dict)  # type: ignore[misc]
        model = base_model(self.accelerator.unwrap_model(self.model))
        if made_by_unit_scale(model):
            path = Path(output_dir or self.args.output_dir, RECORD_FILE)
            path.write_text(json.dumps(checkpoint_record(model)))

    def _load_from_checkpoint(
        self, resume_from_checkpoint: str, model: nn.Module | None = None
    ) -> None:
        """``Trainer``'s, then the checkpoint's :data:`RECORD_FILE` given to the
        model (:func:`unit_scaling.transforms.load_checkpoint_record`): resumed
        training follows the uninterrupted run."""
        super()._load_from_checkpoint(resume_from_checkpoint, model)  # type: ignore[misc]
        path = Path(resume_from_checkpoint, RECORD_FILE)
        target = base_model(self.accelerator.unwrap_model(model or self.model))
        if path.is_file() and made_by_unit_scale(target):
            load_checkpoint_record(target, json.loads(path.read_text()))

    def _issue_warnings_after_load(self, load_result: Any) -> None:
        """``Trainer``'s, without the keys of tied parameters: a checkpoint
        holds a tied tensor once (GPT-2's readout is its embedding)."""
        named = dict(self.model.named_parameters(remove_duplicate=False))
        missing = set(load_result.missing_keys)
        loaded = {id(p) for n, p in named.items() if n not in missing}
        kept = [k for k in load_result.missing_keys if id(named.get(k)) not in loaded]
        super()._issue_warnings_after_load(load_result._replace(missing_keys=kept))  # type: ignore[misc]

    # -- logs --------------------------------------------------------------- #
    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        """``Trainer``'s, with ``grad_rms`` (``grad_norm / √(parameters)``,
        about 1 for a unit-scaled gradient) beside ``grad_norm``."""
        norm = logs.get("grad_norm")
        if norm is not None:
            if self._grad_elements is None:
                self._grad_elements = sum(
                    p.numel() for p in self.model.parameters() if p.requires_grad
                )
            logs = {
                **logs,
                "grad_rms": float(norm) / math.sqrt(max(self._grad_elements, 1)),
            }
        super().log(logs, *args, **kwargs)  # type: ignore[misc]


class UnitScalingTrainer(UnitScalingMixin, transformers.Trainer):
    """``transformers.Trainer`` for unit-scaled and u-μP models: the same
    arguments, with u-μP's learning rates, the unit-scaled step, an RMS
    clipping bound and the unit-scaled data-parallel reduction (see the module
    docstring).

    Example::

        >>> from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments
        >>> from unit_scaling.transforms import unit_scale
        >>> config = LlamaConfig(num_hidden_layers=1, hidden_size=32,
        ...                      intermediate_size=64, num_attention_heads=2,
        ...                      vocab_size=64)
        >>> model = unit_scale(LlamaForCausalLM(config), residual_scaling="u-μP")
        >>> args = TrainingArguments("/tmp/out", learning_rate=0.5, max_steps=1,
        ...                          report_to=[], use_cpu=True)
        >>> trainer = UnitScalingTrainer(model=model, args=args)
        >>> type(trainer.create_optimizer()).__name__
        'AdamW'
    """


class CausalLM(nn.Module):
    """One of this library's decoders (:class:`unit_scaling.TransformerDecoder`,
    or the plain baseline of :mod:`unit_scaling.app.baseline`) as a Hugging
    Face causal LM, for ``Trainer``: ``forward(input_ids, labels=None, ...)``
    returns a ``CausalLMOutput`` whose ``loss`` is the next-token cross-entropy
    (labels shifted inside, ``-100`` ignored), the decoder's own ``.loss`` on
    ``labels == input_ids``: as there, the decoder then runs on all tokens but
    the last, which is only a target, so ``logits`` has one position fewer
    than ``input_ids`` (all of them without ``labels``). ``num_items_in_batch``
    (the step's token count, which ``Trainer`` passes) normalises a unit-scaled
    decoder's loss with :func:`unit_scaling.functional.step_mean` and a plain
    one's as a sum over it. The decoder is kept as ``.decoder``; its state
    dict keys gain the ``decoder.`` prefix.

    Args:
        decoder: the decoder; its ``forward(input_ids)`` returns the logits.

    Example::

        >>> lm = CausalLM(uu.TransformerDecoder(32, 64, layers=1, heads=2,
        ...                                     **uu.RECOMMENDED.multipliers))
        >>> ids = torch.randint(64, (2, 9))
        >>> out = lm(ids, labels=ids)
        >>> torch.allclose(out.loss, lm.decoder.loss(ids))
        True
    """

    # Trainer: pass num_items_in_batch, and count the shifted labels for it.
    accepts_loss_kwargs = True
    loss_type = "ForCausalLM"

    def __init__(self, decoder: nn.Module) -> None:
        super().__init__()
        self.decoder = decoder
        self.unit_scaled = is_unit_scaled(decoder)

    def forward(
        self,
        input_ids: Tensor,
        labels: Tensor | None = None,
        attention_mask: Tensor | None = None,
        num_items_in_batch: Tensor | int | None = None,
        **kwargs: Any,
    ) -> CausalLMOutput:
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError(
                "CausalLM: the decoder attends causally to every token, so an "
                "attention_mask with zeros cannot be honoured; mark padding with "
                "labels=-100 instead (it is left out of the loss)"
            )
        if labels is None:
            return CausalLMOutput(logits=self.decoder(input_ids))
        # As .loss(batch): the last token is only a target (and the decoder
        # sees the length it is trained at there).
        logits = self.decoder(input_ids[:, :-1])
        flat = logits.flatten(end_dim=-2)
        targets = labels[:, 1:].flatten()
        if self.unit_scaled:
            mult = getattr(self.decoder, "loss_mult", 1.0)
            total = U.cross_entropy(flat, targets, reduction="sum", mult=mult)
            count = (targets != -100).sum()
            step = count if num_items_in_batch is None else num_items_in_batch
            loss = U.step_mean(total, count, step)
        elif num_items_in_batch is None:
            loss = F.cross_entropy(flat, targets)
        else:
            loss = F.cross_entropy(flat, targets, reduction="sum") / num_items_in_batch
        return CausalLMOutput(loss=loss, logits=logits)
