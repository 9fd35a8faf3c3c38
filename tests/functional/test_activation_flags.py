"""Torch's flags (``inplace``, ``approximate``) are checked before anything runs.

Our activations keep torch's positional order with the temperature ``mult``
after torch's flags, while Graphcore's unit-scaling library has ``silu(x, mult)``.
A temperature passed positionally therefore lands in a flag; unchecked,
``U.silu(x, 2.0)`` ran in place (2.0 is truthy) with ``mult=1``. These tests fail
if that silent wrong answer comes back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import unit_scaling as uu
import unit_scaling.functional as U


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    """A unit-normal tensor that does not require grad, so in place is allowed."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# Each function with an `inplace` flag, with its flag given a temperature.
INPLACE_GIVEN_A_NUMBER: list[tuple[str, Callable[[torch.Tensor], Any]]] = [
    ("silu", lambda x: U.silu(x, 2.0)),
    ("relu", lambda x: U.relu(x, 2.0)),
    ("dropout", lambda x: U.dropout(x, 0.5, True, 2.0)),  # type: ignore[arg-type]
]


def _type_error_leaves_input_alone(
    call: Callable[[torch.Tensor], Any], match: str
) -> None:
    x = randn(4, 8, seed=0)
    before = x.clone()
    with pytest.raises(TypeError, match=match):
        call(x)
    torch.testing.assert_close(x, before, rtol=0, atol=0)


@pytest.mark.parametrize(("op", "call"), INPLACE_GIVEN_A_NUMBER)
def test_a_number_for_inplace_is_a_type_error_and_leaves_input_alone(
    op: str, call: Callable[[torch.Tensor], Any]
) -> None:
    _type_error_leaves_input_alone(call, rf"U\.{op}: inplace must be a bool, got 2\.0")


def test_silu_with_a_positional_temperature_says_how_to_pass_it() -> None:
    with pytest.raises(TypeError, match=r"\(float\).*U\.silu\(x, mult=2\.0\)"):
        U.silu(randn(4, 8), 2.0)  # type: ignore[arg-type]


def test_gelu_with_a_positional_temperature_is_a_type_error() -> None:
    with pytest.raises(
        TypeError,
        match=r"U\.gelu: approximate must be one of 'none', 'tanh', got 2\.0 "
        r"\(float\); pass the temperature by keyword: U\.gelu\(x, mult=2\.0\)",
    ):
        U.gelu(randn(4, 8), 2.0)  # type: ignore[arg-type]


def test_gelu_rejects_an_approximation_torch_does_not_know() -> None:
    with pytest.raises(ValueError, match=r"U\.gelu: approximate='erf' is not valid"):
        U.gelu(randn(4, 8), "erf")


def test_functions_without_a_temperature_give_no_temperature_advice() -> None:
    with pytest.raises(TypeError) as relu_error:
        U.relu(randn(4, 8), 1)  # type: ignore[arg-type]
    assert "mult" not in str(relu_error.value)


def test_silu_true_positionally_still_runs_in_place_like_torch() -> None:
    x = randn(4, 8, seed=0)
    expected = U.silu(x.clone())
    assert U.silu(x, True) is x
    torch.testing.assert_close(x, expected, rtol=0, atol=0)
    h = randn(4, 8, seed=1)
    assert F.silu(h, True) is h  # the torch behaviour mirrored


def test_keyword_temperature_still_works() -> None:
    x = randn(2**12, seed=0)
    torch.testing.assert_close(
        U.silu(x, mult=2.0, constraint=None),
        U.silu(x, False, 2.0, constraint=None),
    )
    assert not torch.equal(U.silu(x, mult=2.0), U.silu(x))
    torch.testing.assert_close(
        U.gelu(x, mult=2.0, constraint=None),
        U.gelu(x, "none", 2.0, constraint=None),
    )


@pytest.mark.parametrize(
    ("module", "op"),
    [(uu.SiLU(2.0), "silu"), (uu.GELU(2.0), "gelu")],  # type: ignore[arg-type]
    ids=["SiLU", "GELU"],
)
def test_modules_given_a_positional_temperature_fail_at_the_first_call(
    module: torch.nn.Module, op: str
) -> None:
    _type_error_leaves_input_alone(module, rf"U\.{op}: .*U\.{op}\(x, mult=2\.0\)")
