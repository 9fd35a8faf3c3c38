"""What :func:`unit_scaling.export.to_plain` returns: the plain module and a
report of what was folded, what could not be, and where the two models agree."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from .._torch_internals import pytree

__all__ = [
    "PlainExport",
    "Unfolded",
    "errors_at_other_lengths",
    "evaluating",
    "length_note",
    "max_relative_error",
    "measured_export",
    "resized",
    "sequence_length",
]


@dataclasses.dataclass(frozen=True)
class Unfolded:
    """A static scale that could not be folded into the weights.

    Attributes:
        op: the op and the module it runs in, e.g.
            ``"U.scaled_dot_product_attention at model.layers.0.self_attn"``.
        reason: why its scale cannot be absorbed.
        factor: the multiplier the plain model would need at the op's output
            (``None`` where no single factor does it).
        fix: the smallest change to the plain model that keeps the function.

    Example::

        >>> from unit_scaling.export import to_plain
        >>> model = uu.TransformerDecoder(32, 64, layers=1, heads=2, loss_mult=2.0)
        >>> (loss,) = to_plain(model, seq_len=8).unfolded
        >>> loss.factor, loss.fix
        (2.0, "compute the plain model's loss on logits * 2")
    """

    op: str
    reason: str
    factor: float | None
    fix: str


@dataclasses.dataclass(frozen=True)
class PlainExport:
    """The plain model made by :func:`~unit_scaling.export.to_plain`, and its report.

    Attributes:
        module: the plain module: the original class (for a ``unit_scale``
            output) or :class:`~unit_scaling.export.PlainTransformerDecoder`
            (for a :class:`unit_scaling.TransformerDecoder`), weights rescaled.
        folded: each rescaled parameter (by its name in :attr:`module`) and the
            factor it was multiplied by (for a gain the model uses as
            ``c + w``, as Gemma's norms do, the factor of ``c + w``);
            parameters not listed are unchanged.
        unfolded: the scales that could not be folded (empty when the plain
            model computes the same function).
        anchored: ops with no scaling rule, where the two models must see the
            same values (plain ops that are not homogeneous, e.g. a rotary
            embedding or a masked fill), by op and module.
        max_rel_error: ``max |plain - unit| / max |unit|`` over the float outputs
            of the example batch (the worst output).
        seq_len: the sequence length the attention scales are folded at (the
            example's), or ``None`` where no sequence was found.
        attention_ratios: for other sequence lengths ``L``, the factor
            ``c(L) / c(seq_len)`` by which the unit-scaled attention output
            differs from the plain one (the site farthest from 1).
        length_errors: the measured :attr:`max_rel_error` at other lengths
            (the example cut or tiled along its sequence).
        length_note: the above in words.

    Example::

        >>> from unit_scaling.export import to_plain
        >>> model = uu.TransformerDecoder(32, 64, layers=1, heads=2)
        >>> export = to_plain(model, seq_len=8)
        >>> export.seq_len, sorted(export.attention_ratios), export.unfolded
        (8, [2, 4, 16, 32], ())
        >>> print(export.length_note[:71])
        folded at sequence length 8: the plain model equals the unit-scaled one
    """

    module: nn.Module
    folded: dict[str, float]
    unfolded: tuple[Unfolded, ...]
    anchored: tuple[str, ...]
    max_rel_error: float
    seq_len: int | None
    attention_ratios: dict[int, float]
    length_errors: dict[int, float]
    length_note: str

    def __str__(self) -> str:
        lines = [
            f"plain {type(self.module).__name__}: {len(self.folded)} parameters "
            f"rescaled, max relative error {self.max_rel_error:.2e} on the example",
            self.length_note,
        ]
        for u in self.unfolded:
            factor = "" if u.factor is None else f" (factor {u.factor:.6g})"
            lines.append(f"not folded: {u.op}: {u.reason}{factor}; {u.fix}")
        if self.anchored:
            lines.append(f"anchored (no ratio rule): {', '.join(self.anchored)}")
        return "\n".join(lines)


def _float_leaves(output: Any) -> list[Tensor]:
    if isinstance(output, dict):  # Hugging Face ModelOutput included
        output = list(output.values())
    return [
        x
        for x in pytree.tree_leaves(output)
        if isinstance(x, Tensor) and x.is_floating_point()
    ]


def max_relative_error(unit: Any, plain: Any) -> float:
    """``max |plain - unit| / max |unit|`` over matching float outputs (the
    worst output), for tensors, tuples, dicts and Hugging Face outputs.

    Example::

        >>> unit, plain = torch.tensor([2.0, -4.0]), torch.tensor([2.0, -3.0])
        >>> max_relative_error((unit,), (plain,))
        0.25
    """
    worst = 0.0
    for u, p in zip(_float_leaves(unit), _float_leaves(plain), strict=True):
        if u.shape != p.shape:
            return float("inf")
        scale = float(u.detach().abs().max()) if u.numel() else 0.0
        if scale > 0:
            diff = float((p.detach().double() - u.detach().double()).abs().max())
            worst = max(worst, diff / scale)
    return worst


@contextmanager
def evaluating(module: nn.Module) -> Iterator[None]:
    """``module`` in eval mode and without autograd, its modes restored after."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for m, mode in modes:
            m.training = mode


def _sequences(args: Any, kwargs: Any) -> list[Tensor]:
    """The integer or boolean tensors of a call (token ids, masks)."""
    return [
        x
        for x in pytree.tree_leaves((args, kwargs))
        if isinstance(x, Tensor) and not x.is_floating_point() and x.dim() >= 1
    ]


def sequence_length(args: Any, kwargs: Any) -> int | None:
    """The last dimension of the first integer tensor of the call (the token
    ids of a language model), if any."""
    found = _sequences(args, kwargs)
    return int(found[0].shape[-1]) if found else None


def resized(args: Any, kwargs: Any, old: int, new: int) -> tuple[Any, Any] | None:
    """The call with every integer or boolean tensor whose last dimension is
    ``old`` cut or tiled to ``new``; ``None`` if a float input has that length
    (then the sequence cannot be changed here)."""
    leaves, spec = pytree.tree_flatten((args, kwargs))
    out = []
    for x in leaves:
        if isinstance(x, Tensor) and x.dim() >= 1 and x.shape[-1] == old:
            if x.is_floating_point():
                return None
            reps = -(-new // old)
            x = x.repeat(*([1] * (x.dim() - 1)), reps)[..., :new]
        out.append(x)
    new_args, new_kwargs = pytree.tree_unflatten(out, spec)
    return new_args, new_kwargs


def errors_at_other_lengths(
    unit: nn.Module,
    plain: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    seq_len: int,
) -> dict[int, float]:
    """:func:`max_relative_error` of the two models on the example cut to half
    its length and tiled to twice it (none if its sequence cannot be resized)."""
    errors = {}
    for length in (seq_len // 2, 2 * seq_len):
        call = resized(args, kwargs, seq_len, length) if length else None
        if call is not None:
            with evaluating(unit), evaluating(plain):
                errors[length] = max_relative_error(
                    unit(*call[0], **call[1]), plain(*call[0], **call[1])
                )
    return errors


def length_note(
    seq_len: int | None,
    error: float,
    ratios: dict[int, float],
    errors: dict[int, float],
    extra: Sequence[str] = (),
) -> str:
    """The report's sentence on where the two models agree."""
    if seq_len is None:
        head = f"max relative error {error:.2e} on the example (no sequence found)"
    else:
        head = (
            f"folded at sequence length {seq_len}: the plain model equals the "
            f"unit-scaled one there (max relative error {error:.2e})"
        )
    parts = [head]
    if ratios:
        table = ", ".join(f"L={n}: {r:.4f}" for n, r in sorted(ratios.items()))
        parts.append(
            "unit-scaled attention scales its output by c(L), which depends on the "
            f"key length L and the mask; the plain model keeps c({seq_len}), so at "
            f"another length the unit-scaled attention output is c(L)/c({seq_len}) "
            f"times the plain one's: {table}"
        )
    if errors:
        table = ", ".join(f"L={n}: {e:.2e}" for n, e in sorted(errors.items()))
        parts.append(f"measured max relative error at other lengths: {table}")
    return "; ".join([*parts, *extra])


def measured_export(
    unit: nn.Module,
    plain: nn.Module,
    example: tuple[tuple[Any, ...], dict[str, Any]],
    unit_output: Any,
    seq_len: int | None,
    ratios: dict[int, float],
    *,
    folded: dict[str, float],
    unfolded: Sequence[Unfolded],
    anchored: Iterable[str] = (),
    notes: Sequence[str] = (),
) -> PlainExport:
    """The :class:`PlainExport` of ``plain``, folded from ``unit``, with where
    the two agree measured: on the ``example`` call (``(args, kwargs)``, on
    which ``unit`` returned ``unit_output``) and, given its sequence length
    ``seq_len``, at other lengths; ``ratios`` are the attention ratios there,
    and each op of ``anchored`` is listed once."""
    args, kwargs = example
    with evaluating(plain):
        error = max_relative_error(unit_output, plain(*args, **kwargs))
    errors: dict[int, float] = {}
    if seq_len is not None:
        errors = errors_at_other_lengths(unit, plain, args, kwargs, seq_len)
    return PlainExport(
        module=plain,
        folded=folded,
        unfolded=tuple(unfolded),
        anchored=tuple(dict.fromkeys(anchored)),
        max_rel_error=error,
        seq_len=seq_len,
        attention_ratios=ratios,
        length_errors=errors,
        length_note=length_note(seq_len, error, ratios, errors, notes),
    )
