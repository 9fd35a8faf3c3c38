"""Transformed modules under ``torch.compile`` and the ``compile`` transform.

Plain ``torch.compile`` of each model family runs with the ``eager`` backend
(Dynamo's capture, which is where the transforms' replay must hold up, without
the cost of code generation); AOTAutograd (``aot_eager``) and Inductor are
exercised on smaller models. Every test checks that the compiled graph really
contains the transformed ops, so a silent fallback to eager execution cannot
pass.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import torch
from torch import Tensor, nn
from torch.fx import GraphModule

from tests.helpers import parameter_grads, unit_backward
from tests.transforms.models import CASES, MLP, ModelCase, NanoGPT
from unit_scaling.transforms import compile, simulate_fp8, track_scales, unit_scale


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    # Compiled frames of earlier tests count towards Dynamo's recompile limit.
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Recorder:
    """A ``torch.compile`` backend that remembers the graphs it compiles."""

    def __init__(self, backend: str = "aot_eager") -> None:
        self.backend = backend
        self.graphs: list[GraphModule] = []

    def __call__(self, gm: GraphModule, example_inputs: Sequence[Any]) -> Any:
        self.graphs.append(gm)
        return torch._dynamo.lookup_backend(self.backend)(gm, list(example_inputs))

    def calls(self) -> int:
        """Function calls in the compiled graphs (0 if the model ran eagerly)."""
        return sum(
            node.op == "call_function" for gm in self.graphs for node in gm.graph.nodes
        )

    def custom_functions(self) -> int:
        """Calls of custom autograd functions (unit-scaled ops, quantisers)."""
        return sum(
            "autograd_function_apply" in str(node.target)
            for gm in self.graphs
            for node in gm.graph.nodes
        )


def _zero_grads(model: nn.Module) -> None:
    for p in model.parameters():
        p.grad = None


def _compare(
    case: ModelCase,
    transform: Callable[[nn.Module], nn.Module],
    backend: str = "aot_eager",
    check: Callable[[Tensor, Tensor], None] | None = None,
    eager_first: bool = False,
    eager_reference: bool = True,
) -> Recorder:
    """Outputs and gradients of ``torch.compile(transform(model))`` equal eager.

    Without ``eager_reference``, the reference is the first compiled call: no
    graph is captured yet, so it runs eagerly (saving a capture on big models).
    """
    check = check or (lambda a, b: torch.testing.assert_close(a, b))
    compiled_module = transform(case.make())
    if eager_reference:
        eager = copy.deepcopy(compiled_module)
        expected = case.run(eager)
        unit_backward(expected)
        expected_grads = parameter_grads(eager)

    recorder = Recorder(backend)
    compiled = torch.compile(compiled_module, backend=recorder)
    if eager_first:
        compiled_module(*case.inputs(1)[0], **case.inputs(1)[1])
    first = case.run(compiled)  # compile called before any eager call
    if eager_reference:
        check(first.detach(), expected.detach())
    else:
        expected = first
        unit_backward(expected)
        expected_grads = parameter_grads(compiled_module)
    _zero_grads(compiled_module)
    second = case.run(compiled)
    unit_backward(second)
    check(second.detach(), expected.detach())
    grads = parameter_grads(compiled_module)
    assert len(grads) == len(expected_grads)
    for got, want in zip(grads, expected_grads, strict=True):
        check(got, want)
    assert recorder.custom_functions() > 0, "torch.compile ran the model eagerly"
    return recorder


@pytest.mark.parametrize("name", list(CASES))
def test_torch_compile_unit_scale(name: str) -> None:
    _compare(CASES[name], unit_scale, backend="eager", eager_reference=name == "mlp")


def test_aot_autograd_simulate_fp8() -> None:
    one_layer = dataclasses.replace(CASES["nanogpt"], build=lambda: NanoGPT(layers=1))
    _compare(one_layer, lambda m: simulate_fp8(unit_scale(m)))


def test_torch_compile_after_eager_call() -> None:
    _compare(CASES["mlp"], unit_scale, backend="eager", eager_first=True)


def test_torch_compile_new_input_shape() -> None:
    model = unit_scale(MLP())
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend=Recorder("eager"))
    for rows in (4, 4, 7, 7):
        x = torch.randn(rows, 32)
        torch.testing.assert_close(compiled(x), reference(x))


def _close_up_to_fp8_rounding(got: Tensor, want: Tensor) -> None:
    """Equal, except where a last-bit difference crossed an FP8 rounding
    boundary (at most 1% of elements, each by less than an E4M3 step)."""
    off = (got - want).abs() > 1e-5 * (1 + want.abs())
    assert off.float().mean().item() <= 0.01
    torch.testing.assert_close(got, want, rtol=2**-3, atol=2**-3 * want.abs().max())


def test_inductor_unit_scale() -> None:
    _compare(
        CASES["mlp"],
        unit_scale,
        backend="inductor",
        check=lambda a, b: torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5),
    )


def test_inductor_simulate_fp8() -> None:
    _compare(
        CASES["mlp"],
        lambda m: simulate_fp8(unit_scale(m)),
        backend="inductor",
        check=_close_up_to_fp8_rounding,
    )


# --------------------------------------------------------------------------- #
# The compile transform.
# --------------------------------------------------------------------------- #


def test_compile_transform_composes() -> None:
    case = CASES["mlp"]
    eager = simulate_fp8(unit_scale(case.make()))
    compiled = compile(simulate_fp8(unit_scale(case.make())))
    expected = case.run(eager)
    unit_backward(expected)
    for seed in (0, 0):  # the second call runs the compiled code again
        _zero_grads(compiled)
        got = case.run(compiled, seed)
        unit_backward(got)
        _close_up_to_fp8_rounding(got.detach(), expected.detach())
        for a, b in zip(parameter_grads(compiled), parameter_grads(eager), strict=True):
            _close_up_to_fp8_rounding(a, b)


def test_compile_after_track_scales_raises() -> None:
    with pytest.raises(ValueError, match="track_scales"):
        compile(track_scales(unit_scale(MLP())))


def test_compile_non_module_raises() -> None:
    with pytest.raises(TypeError, match=r"nn\.Module"):
        compile(lambda x: x)  # type: ignore[arg-type]


def test_torch_compile_many_transformed_modules() -> None:
    x = torch.randn(4, 32)
    for index in range(9):
        model = unit_scale(MLP())
        model(x)
        recorder = Recorder("eager")
        torch.compile(model, backend=recorder)(x)
        assert recorder.calls() > 0, f"module {index} ran eagerly"


_TORCH_NN_MODULES = {
    "Linear": lambda: nn.Linear(32, 32),
    "Sequential": lambda: nn.Sequential(nn.Linear(32, 64), nn.GELU()),
    "TransformerEncoder": lambda: nn.TransformerEncoder(
        nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True),
        2,
        enable_nested_tensor=False,
    ),
}


@pytest.mark.parametrize("name", list(_TORCH_NN_MODULES))
def test_torch_compile_torch_nn_module(name: str) -> None:
    model = unit_scale(_TORCH_NN_MODULES[name]())
    reference = copy.deepcopy(model)
    x = torch.randn(4, 8, 32)
    recorder = Recorder("eager")
    compiled = torch.compile(model, backend=recorder)
    for _ in range(2):
        torch.testing.assert_close(compiled(x), reference(x))
    assert recorder.calls() > 0, "torch.compile ran the model eagerly"
