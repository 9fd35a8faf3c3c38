"""Tests for the constraints that tie an op's output and gradient scales."""

from __future__ import annotations

import math

import pytest

from unit_scaling.constraints import (
    VALID_CONSTRAINTS,
    amean,
    apply_constraint,
    gmean,
    hmean,
    to_grad_input_scale,
    to_left_grad_scale,
    to_output_scale,
    to_right_grad_scale,
    validate_constraint,
)


def test_means() -> None:
    assert gmean(4.0, 1.0) == pytest.approx(2.0)
    assert gmean(8.0, 2.0, 0.5) == pytest.approx(2.0)
    assert hmean(1.0, 3.0) == pytest.approx(1.5)
    assert hmean(2.0, 2.0, 2.0) == pytest.approx(2.0)
    assert amean(1.0, 2.0, 6.0) == pytest.approx(3.0)
    assert gmean(5.0) == pytest.approx(5.0)


def test_selectors() -> None:
    assert to_output_scale(1.0, 2.0, 3.0) == 1.0
    assert to_output_scale(7.0) == 7.0
    assert to_grad_input_scale(1.0, 2.0) == 2.0
    assert to_left_grad_scale(1.0, 2.0, 3.0) == 2.0
    assert to_right_grad_scale(1.0, 2.0, 3.0) == 3.0


@pytest.mark.parametrize(
    ("constraint", "scales", "shared"),
    [
        ("gmean", (4.0, 1.0), 2.0),
        ("hmean", (4.0, 1.0), 1.6),
        ("amean", (4.0, 1.0), 2.5),
        ("to_output_scale", (4.0, 1.0), 4.0),
        ("to_grad_input_scale", (4.0, 1.0), 1.0),
        ("gmean", (8.0, 1.0, 0.125), 1.0),
        ("hmean", (1.0, 2.0, 4.0), 3 / 1.75),
        ("amean", (1.0, 2.0, 6.0), 3.0),
        ("to_output_scale", (8.0, 1.0, 0.125), 8.0),
        ("to_left_grad_scale", (8.0, 1.0, 0.125), 1.0),
        ("to_right_grad_scale", (8.0, 1.0, 0.125), 0.125),
        ("gmean", (16.0, 1.0, 1.0, 1.0), 2.0),
    ],
)
def test_apply_constraint_gives_every_scale_the_shared_value(
    constraint: str, scales: tuple[float, ...], shared: float
) -> None:
    result = apply_constraint(constraint, *scales)
    assert result == pytest.approx((shared,) * len(scales))


@pytest.mark.parametrize("constraint", [None, ""])
def test_unconstrained_returns_scales_unchanged(constraint: str | None) -> None:
    assert apply_constraint(constraint, 4.0, 1.0, 0.5) == (4.0, 1.0, 0.5)
    assert apply_constraint(constraint, 3.0) == (3.0,)


def test_every_valid_constraint_is_accepted() -> None:
    assert set(VALID_CONSTRAINTS) == {
        "gmean",
        "hmean",
        "amean",
        "to_output_scale",
        "to_grad_input_scale",
        "to_left_grad_scale",
        "to_right_grad_scale",
    }
    for constraint in VALID_CONSTRAINTS:
        n = {"to_grad_input_scale": 2}.get(constraint, 3)
        shared = apply_constraint(constraint, *([2.0] * n))
        assert shared == pytest.approx((2.0,) * n)
        validate_constraint(constraint)


@pytest.mark.parametrize(
    ("constraint", "scales", "arity"),
    [
        ("to_grad_input_scale", (1.0, 2.0, 3.0), 2),
        ("to_grad_input_scale", (1.0,), 2),
        ("to_left_grad_scale", (1.0, 2.0), 3),
        ("to_right_grad_scale", (1.0, 2.0, 3.0, 4.0), 3),
    ],
)
def test_arity_errors_name_the_constraint_and_count(
    constraint: str, scales: tuple[float, ...], arity: int
) -> None:
    with pytest.raises(ValueError, match=rf"{constraint}'.*exactly {arity} scales"):
        apply_constraint(constraint, *scales)


@pytest.mark.parametrize("name", ["mean", "to_input_scale", "GMEAN"])
def test_unknown_constraint_lists_the_valid_ones(name: str) -> None:
    for call in (
        lambda: apply_constraint(name, 1.0, 2.0),
        lambda: validate_constraint(name),
    ):
        with pytest.raises(
            ValueError, match=r"not a known constraint.*'gmean'"
        ) as info:
            call()
        assert all(c in str(info.value) for c in VALID_CONSTRAINTS)


def test_no_scales_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one scale"):
        apply_constraint("gmean")


def test_gmean_of_powers_is_exact_in_log_space() -> None:
    # gmean(k^-1/2, n^-1/2, m^-1/2) = (k n m)^-1/6, as used by matmul.
    k, n, m = 512, 128, 256
    (shared, *_) = apply_constraint("gmean", k**-0.5, n**-0.5, m**-0.5)
    assert shared == pytest.approx(math.prod((k, n, m)) ** (-1 / 6))
