"""What FP8 training runs in FP8, and in which formats: :class:`Float8Config`,
and how an op reads it (its checks, its output dtype)."""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch
from torch import Tensor

from ._gemm import FP8


@dataclasses.dataclass(frozen=True)
class Float8Config:
    """How :func:`convert_to_float8_training` runs the linear layers in FP8.

    Args:
        forward_dtype: format of the forward operands (``x`` and ``W``).
        gradient_dtype: format of the output gradient.
        output: run the forward GEMM in FP8.
        grad_input: run the input-gradient GEMM in FP8.
        grad_weight: run the weight-gradient GEMM in FP8.
        output_dtype: dtype of the layer's output (and of the input gradient);
            ``None``: the input's, or autocast's where autocast is on.
        save_fp8_inputs: save FP8 copies of ``x`` and ``W`` for the backward
            pass (a quarter of the float32 activation memory, half of bf16's);
            a backward GEMM kept in high precision then sees the FP8 values.
        unsupported_shapes: what to do with a layer whose ``in_features`` or
            ``out_features`` is not a multiple of 16 (what cuBLAS takes):
            ``"keep"`` it in high precision, or ``"pad"`` its operands with zeros.
        fsdp_fp8_all_gather: under :func:`unit_scaling.parallel.fully_shard`,
            gather the weights in FP8 (a quarter of float32's bytes, cast with
            the static scale 1 before the all-gather: no amax all-reduce).
        attention: run attention's matrix products in FP8 too (off by default:
            they stay in high precision): :func:`scaled_dot_product_attention`
            in place of the unit-scaled attention, for ``QKᵀ``, ``PV`` and their
            four gradient products. The ``output``/``grad_*`` fields are the
            linear layers' only.

    Example::

        >>> Float8Config(grad_weight=False).grad_weight
        False
    """

    forward_dtype: torch.dtype = torch.float8_e4m3fn
    gradient_dtype: torch.dtype = torch.float8_e5m2
    output: bool = True
    grad_input: bool = True
    grad_weight: bool = True
    output_dtype: torch.dtype | None = None
    save_fp8_inputs: bool = False
    unsupported_shapes: Literal["keep", "pad"] = "keep"
    fsdp_fp8_all_gather: bool = True
    attention: bool = False

    def __post_init__(self) -> None:
        for name in ("forward_dtype", "gradient_dtype"):
            value = getattr(self, name)
            if value not in FP8:
                raise ValueError(
                    f"Float8Config: {name} must be torch.float8_e4m3fn or "
                    f"torch.float8_e5m2, got {value!r}"
                )
        if self.forward_dtype == self.gradient_dtype == torch.float8_e5m2 and (
            self.grad_weight or self.attention
        ):
            raise ValueError(
                "Float8Config: the weight-gradient GEMM (and attention's backward) "
                "would be E5M2 x E5M2, which cuBLAS does not run; use "
                "forward_dtype=torch.float8_e4m3fn, or grad_weight=False and "
                "attention=False"
            )
        if self.output_dtype is not None and not (
            isinstance(self.output_dtype, torch.dtype)
            and self.output_dtype.is_floating_point
            and self.output_dtype not in FP8
        ):
            raise ValueError(
                "Float8Config: output_dtype must be None or a floating-point "
                "dtype wider than FP8 (float32, bfloat16, float16), got "
                f"{self.output_dtype!r}"
            )
        if self.unsupported_shapes not in ("keep", "pad"):
            raise ValueError(
                'Float8Config: unsupported_shapes must be "keep" or "pad", got '
                f"{self.unsupported_shapes!r}"
            )
        for name in (
            "output",
            "grad_input",
            "grad_weight",
            "save_fp8_inputs",
            "fsdp_fp8_all_gather",
            "attention",
        ):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"Float8Config: {name} must be a bool")


def check_config(op: str, config: Float8Config | None) -> Float8Config:
    """``config``, or the default one; a ``TypeError`` naming ``op`` for anything
    else."""
    if config is None:
        return Float8Config()
    if not isinstance(config, Float8Config):
        raise TypeError(f"{op}: config must be a Float8Config, got {config!r}")
    return config


def output_dtype(input: Tensor, config: Float8Config) -> torch.dtype:
    """The dtype of an FP8 op's output: ``config.output_dtype``, else
    autocast's where autocast is on, else ``input``'s."""
    if config.output_dtype is not None:
        return config.output_dtype
    device = input.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return input.dtype
