"""Helpers shared by the tests: unit-normal inputs, scale checks, gradient checks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.fx import GraphModule

from unit_scaling.scale import scale_bwd


def randn(
    *shape: int, dtype: torch.dtype = torch.float32, seed: int | None = None
) -> Tensor:
    """A unit-normal tensor that requires grad."""
    gen = None if seed is None else torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen, dtype=dtype).requires_grad_()


def unit_backward(output: Tensor, seed: int = 0) -> Tensor:
    """Backpropagate a unit-normal gradient through ``output``; return that gradient."""
    gen = torch.Generator().manual_seed(seed)
    grad = torch.randn(output.shape, generator=gen).to(output.dtype)
    output.backward(grad)
    return grad


def grads(*tensors: Tensor) -> list[Tensor]:
    """The gradients of ``tensors`` (each must have one)."""
    out = [t.grad for t in tensors]
    assert all(g is not None for g in out), "a tensor has no gradient"
    return out  # type: ignore[return-value]


def parameter_grads(model: nn.Module) -> list[Tensor]:
    """Copies of the gradients of ``model``'s parameters that have one."""
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def rms(t: Tensor) -> float:
    """Root mean square of ``t`` (in float32, detached)."""
    return t.detach().float().pow(2).mean().sqrt().item()


def assert_unit_scale(t: Tensor, rtol: float = 0.1, name: str = "tensor") -> None:
    """Assert the RMS of ``t`` is within ``rtol`` of 1 (relative)."""
    value = rms(t)
    assert abs(value - 1) <= rtol, f"{name}: RMS {value:.4f} not within {rtol} of 1"


def gradcheck_scaled(
    fn: Callable[..., Tensor],
    inputs: Sequence[Tensor],
    output_scale: float,
    grad_scales: Sequence[float],
) -> bool:
    """``torch.autograd.gradcheck`` for an op whose gradients are deliberately scaled.

    A unit-scaled op computes ``output_scale * f(x)`` forwards but scales each input's
    gradient by its own ``grad_scales[i]``. Pre-multiplying each input's gradient by
    ``output_scale / grad_scales[i]`` makes the backward the true derivative of the
    forward again, so ``gradcheck`` (float64) verifies both passes numerically.
    """

    def unscaled(*xs: Tensor) -> Tensor:
        xs = tuple(
            scale_bwd(x, output_scale / s) if x.requires_grad else x
            for x, s in zip(xs, grad_scales, strict=True)
        )
        return fn(*xs)

    return bool(torch.autograd.gradcheck(unscaled, tuple(inputs)))


def in_place_function(base: type[torch.autograd.Function]) -> Any:
    """A ``base`` subclass computing ``y = s (x + 1)`` with the product taken in
    place (as ``U.residual_add`` does): the case torch 2.11's Dynamo drops the
    gradient of."""

    class InPlace(base):  # type: ignore[misc,valid-type]
        @staticmethod
        def forward(x: Tensor, scale: float) -> Tensor:
            return torch.add(x, 1).mul_(scale)

        @staticmethod
        def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
            ctx.scale = inputs[1]

        @staticmethod
        def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
            return grad * ctx.scale, None

    return InPlace


def compiled_grad(function: Any, graphs: list[GraphModule] | None = None) -> Tensor:
    """The gradient of ``x = ones(3)`` through ``function.apply(x, 2.0)`` under
    ``torch.compile`` with an eager backend (recording Dynamo's graphs in
    ``graphs`` when given)."""

    def backend(gm: GraphModule, example_inputs: Sequence[Any]) -> Any:
        if graphs is not None:
            graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    x = torch.ones(3, requires_grad=True)
    compiled = torch.compile(lambda t: function.apply(t, 2.0) * 1.0, backend=backend)
    compiled(x).sum().backward()
    torch._dynamo.reset()
    assert x.grad is not None
    return x.grad


class _BreaksInInit:
    """Breaks Dynamo's graph in its constructor, which then calls ``super()``
    (as transformers' caches do: the ``__class__`` cell is part of the case)."""

    def __init__(self) -> None:
        torch._dynamo.graph_break()
        super().__init__()


def _kept(*values: object) -> tuple[object, ...]:
    return values


class BreaksInsideANestedCall(nn.Module):
    """A layer whose forward breaks Dynamo's graph inside a constructor called
    as an argument, after two ops (the shape of transformers' Speech2Text
    decoder making ``EncoderDecoderCache(DynamicCache(config=...), ...)``): the
    case torch 2.11's nested graph breaks resume with the forward's locals mixed
    up (an error, or another value in ``y``'s place)."""

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        y = self.linear(x).sin() * 2.0
        _kept(_BreaksInInit())
        return y * 3.0


def tiny_gpt2(width: int = 64, layers: int = 2, vocab: int = 256) -> nn.Module:
    """A Hugging Face GPT-2 of ``layers`` blocks at ``width``, dropout off, its
    loss type set (else ``transformers`` logs in forward: a graph break)."""
    import transformers

    config = transformers.GPT2Config(
        n_layer=layers,
        n_embd=width,
        n_head=4,
        vocab_size=vocab,
        n_positions=64,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    model = transformers.GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"
    return model


def tiny_llama(width: int = 64, layers: int = 2, vocab: int = 256) -> nn.Module:
    """A Hugging Face Llama of ``layers`` blocks at ``width`` (grouped-query
    attention, 4 heads, 2 key/value heads), its loss type set."""
    import transformers

    config = transformers.LlamaConfig(
        num_hidden_layers=layers,
        hidden_size=width,
        intermediate_size=2 * width,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=vocab,
        max_position_embeddings=64,
    )
    model = transformers.LlamaForCausalLM(config)
    model.loss_type = "ForCausalLM"
    return model


# Fast zoo models that between them take every path that makes stand-ins: norm
# recognition (Llama's hand-written RMSNorm), calibrated regions, gradient
# calibration, library rewrites (nn.MultiheadAttention), routed experts, adaLN
# (tests/test_devices.py and tests/test_standin_device.py).
STANDIN_PATHS = [
    "mlp",
    "gpt2",
    "llama",
    "bert",
    "vit",
    "resnet",
    "t5",
    "mixtral",
    "dit",
    "transformer-encoder",
    "nn-transformer",
]
