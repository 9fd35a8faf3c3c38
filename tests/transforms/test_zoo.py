"""The transforms on every architecture of the zoo (``unit_scaling.zoo``).

For each model: ``unit_scale`` puts ≥ 90% of parameter gradients and of tracked
tensors at unit scale, at the traced shapes and at a second set of shapes;
``track_scales`` and ``simulate_fp8(unit_scale(m))`` run forward and backward with
finite results; ``torch.compile(unit_scale(m))`` matches eager; the user's module
is never modified. At least one model per family runs by default, the rest under
``-m slow`` (for run time only).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import Tensor, nn

from unit_scaling import zoo
from unit_scaling.analysis.coverage import unit_scale_coverage
from unit_scaling.transforms import simulate_fp8, track_scales, unit_scale

MIN_FRACTION = 0.9

# Architectures that do not reach MIN_FRACTION yet (issue 11 stays open for
# them): name -> (floor, why). The floor is the measured minimum over both shape
# sets of the parameter and tensor fractions, less a margin, so that a
# regression fails here; docs/results/zoo.md has the full table. Each entry is removed
# once the architecture reaches MIN_FRACTION.
SHORTFALL: dict[str, tuple[float, str]] = {
    "gemma2": (
        0.84,
        "at the second shapes (past the sliding window) layer 0's "
        "query and key gradients fall to 0.04",
    ),
    "gptj": (
        0.78,
        "since transformers 5.24 (5.23 reached 0.9): the query and key gradients "
        "of its partial rotary embedding at 0.40-0.49",
    ),
    "phi": (
        0.80,
        "query and key gradients at 0.44-0.49 (partial rotary, "
        "parallel attention and MLP branches)",
    ),
    "switch-transformers": (
        0.85,
        "Dynamo breaks its graph 20 times and each piece is calibrated from a "
        "unit gradient at its own output: the relative-position bias tables' "
        "gradients come out at 40-60",
    ),
    "deberta-v2": (0.76, "disentangled attention's relative-position terms; Post-LN"),
    "speech-to-text": (
        0.84,
        "the convolutional front end's gradients; sinusoidal positions",
    ),
    "unet2d": (
        0.77,
        "skip connections concatenate down-path activations whose "
        "gradients differ in scale from the up path's",
    ),
    "unet2d-condition": (0.70, "as unet2d, with cross-attention on the encoder states"),
    "dit": (
        0.82,
        "adaLN modulation vectors: their broadcast gradients are scaled, but "
        "the six pieces of one projection share one factor",
    ),
    "mamba": (
        0.51,
        "the selective scan runs as one frozen vmap/scan piece; 42 "
        "ops inside it are left as is (reported)",
    ),
    "mamba2": (
        0.44,
        "the SSD chunked scan's internals (cumulative sums, "
        "exponentials of segment sums) are calibrated only at its outputs",
    ),
    "sequential": (
        0.82,
        "global average pooling after ReLU: the pooled mean and the "
        "batch-norm gradients at the second shapes",
    ),
}

# One or more per family in the default run; the rest are marked slow.
DEFAULT = {
    "gpt2",
    "llama",
    "gpt-neox",
    "bloom",
    "mixtral",
    "bert",
    "t5",
    "whisper",
    "vit",
    "resnet",
    "convnext",
    "dit",
    "mamba2",
    "user-inplace",
    "sequential",
    "nn-transformer",
}


def _params(names: list[str]) -> list[object]:
    params = []
    for name in names:
        model = zoo.get(name)
        marks = []
        if name not in DEFAULT:
            marks.append(pytest.mark.slow)
        if not model.available():
            marks.append(pytest.mark.skip(reason=f"needs {', '.join(model.requires)}"))
        params.append(pytest.param(name, marks=marks, id=name))
    return params


ALL = _params(zoo.names())


def test_every_family_runs_by_default() -> None:
    families = {zoo.get(name).family for name in DEFAULT}
    assert families == {m.family for m in zoo.MODELS.values()}


def _backward(output: Tensor, seed: int = 0) -> None:
    grad = torch.randn(output.shape, generator=torch.Generator().manual_seed(seed))
    output.backward(grad.to(output))


def _finite_grads(model: nn.Module) -> bool:
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return bool(grads) and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("name", ALL)
def test_unit_scale_coverage(name: str) -> None:
    model = zoo.get(name)
    reports = unit_scale_coverage(
        model.make(0), model.example(0, 0), model.example(0, 1), output=model.output
    )
    floor = SHORTFALL[name][0] if name in SHORTFALL else MIN_FRACTION
    for shapes, report in zip(("traced", "second"), reports, strict=True):
        assert report.parameter_fraction >= floor, (
            f"{name} ({shapes} shapes): {report.describe()}"
        )
        assert report.tensor_fraction >= floor, (
            f"{name} ({shapes} shapes): {report.describe()}"
        )


def test_shortfalls_are_named_and_below_the_target() -> None:
    assert set(SHORTFALL) <= set(zoo.names())
    for name, (floor, why) in SHORTFALL.items():
        assert floor < MIN_FRACTION and why, name


@pytest.mark.parametrize("name", ALL)
def test_transforms_run_and_leave_the_model_alone(
    name: str, capfd: pytest.CaptureFixture[str]
) -> None:
    model = zoo.get(name)
    original = model.make(0)
    capfd.readouterr()
    state = {k: v.clone() for k, v in original.state_dict().items()}
    modules = dict(original.named_modules())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        tracked = track_scales(original)
        output = model.run(tracked, 0, 0)
        _backward(output)
        assert torch.isfinite(output).all() and _finite_grads(tracked)
        assert any("metrics" in n.meta for n in tracked.scales_graph().nodes)

        fp8 = simulate_fp8(unit_scale(original))
        output = model.run(fp8, 0, 0)
        _backward(output)
        assert torch.isfinite(output).all() and _finite_grads(fp8)
    after = original.state_dict()
    assert state.keys() == after.keys()
    for key, value in state.items():
        assert torch.equal(value, after[key]), f"{name}: {key} was modified"
    assert dict(original.named_modules()) == modules
    assert all(p.grad is None for p in original.parameters())
    # Nothing on stderr: no traceback torch.fx prints for an error a transform
    # catches (each becomes a report entry instead).
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize(
    "backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)]
)
@pytest.mark.parametrize("name", ALL)
def test_compile_matches_eager(name: str, backend: str) -> None:
    model = zoo.get(name)
    scaled = unit_scale(model.make(0))
    eager = model.run(scaled, 0, 0)
    compiled = torch.compile(scaled, backend=backend)
    # Compiled graphs decompose, fuse and reorder float arithmetic: over a deep
    # net (MobileNet's 50 convolutions; Switch Transformers' 20 graph pieces)
    # elements move by up to ~7e-4. A graph left untransformed would differ by
    # O(1).
    torch.testing.assert_close(model.run(compiled, 0, 0), eager, rtol=1e-3, atol=1e-3)
