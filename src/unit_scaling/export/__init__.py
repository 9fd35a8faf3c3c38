"""Export a unit-scaled model to plain PyTorch: :func:`to_plain`.

A unit-scaled model computes, in its forward pass, its architecture's function
with a static scale on each op (``U.linear`` is ``alpha * F.linear``, a
residual add ``a r + b s``, attention ``c * sdpa`` at another temperature).
Folding those scales into the weights gives a model of the original
architecture that computes the same function without ``unit_scaling``
installed: a Hugging Face model that ``save_pretrained`` /
``from_pretrained`` handle as any other, or the plain twin of
:class:`unit_scaling.TransformerDecoder`.

How: write ``R(v) = log(plain value / unit-scaled value)`` for every value of
the captured graph. Each op relates the ``R`` of its inputs, outputs and
parameters linearly (``R_y = R_x + R_W - log alpha`` for a linear layer;
``R_x = 0`` where an op, e.g. a GELU, needs the very same input); the
constants are measured by running each unit-scaled op against its torch
counterpart on the example batch, and how plain ops scale is measured by
running them on scaled inputs. A union-find and a weighted least-squares solve
the equations, preferring to change parameters rather than activations; each
parameter is then multiplied by ``exp(R)``. A scale that no parameter can
absorb (one after a nonlinearity, with nothing to fold it into) is reported in
:attr:`PlainExport.unfolded` with the factor it needs and where.

Attention's output scale depends on the sequence length (and the mask), so
the plain model equals the unit-scaled one at the example's length only;
:attr:`PlainExport.length_note` says by how much they differ at others.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from ..modules.transformer import TransformerDecoder
from ._decoder import PlainTransformerDecoder, export_decoder
from ._report import PlainExport, Unfolded
from ._transformed import export_transformed, is_unit_scaled

__all__ = ["PlainExport", "PlainTransformerDecoder", "Unfolded", "to_plain"]


def to_plain(
    module: nn.Module,
    args: Any = (),
    kwargs: dict[str, Any] | None = None,
    *,
    seq_len: int | None = None,
) -> PlainExport:
    """Fold the static scales of a unit-scaled model into its weights.

    For the output of :func:`unit_scaling.transforms.unit_scale` the plain
    module is a deep copy of the original model (its own class: a Hugging Face
    model stays one, with no ``unit_scaling`` entry in its config), each
    parameter multiplied by its factor. For a :class:`unit_scaling.TransformerDecoder`
    it is a :class:`PlainTransformerDecoder` holding its rescaled weights.
    The plain module computes the unit-scaled model's forward function, in eval
    mode, at the example's sequence length, to float rounding (and to the
    norms' ``eps``); :attr:`PlainExport.max_rel_error` is measured there.
    ``module`` itself is never changed. A model trained in real FP8
    (:func:`unit_scaling.float8.convert_to_float8_training`) exports its
    high-precision master weights: the plain module computes the unit-scaled
    function in full precision, and :attr:`PlainExport.max_rel_error`, measured
    against the FP8 model, includes FP8's rounding.

    Args:
        module: a ``unit_scale`` output that has been called at least once (it
            initialises some parameters at its first call), or a
            ``TransformerDecoder``.
        args: the example's positional arguments (a tensor counts as one),
            as for :func:`torch.export.export`.
        kwargs: the example's keyword arguments.
        seq_len: for a ``TransformerDecoder`` without an example: the sequence
            length to fold the attention scale at.

    Returns:
        A :class:`PlainExport`: the plain ``module`` and the report.

    Raises:
        TypeError: if ``module`` is neither a ``unit_scale`` output nor a
            ``TransformerDecoder``.
        ValueError: for a ``unit_scale`` output not called yet, or without an
            example, or running as several graphs (graph breaks); for a decoder
            without an example or ``seq_len``.

    Example::

        >>> model = uu.TransformerDecoder(64, 256, layers=2, heads=4)
        >>> tokens = torch.randint(256, (2, 16))
        >>> export = to_plain(model, (tokens,))
        >>> type(export.module).__name__, export.max_rel_error < 1e-4
        ('PlainTransformerDecoder', True)
        >>> plain_logits = export.module(tokens)
    """
    args = (args,) if isinstance(args, Tensor) else tuple(args)
    kwargs = dict(kwargs or {})
    if is_unit_scaled(module):
        if seq_len is not None:
            raise ValueError(
                "seq_len is for a TransformerDecoder without an example; a "
                "unit_scale output needs its example inputs (args, kwargs)"
            )
        if not args and not kwargs:
            raise ValueError(
                f"to_plain({type(module).__name__}) needs an example batch to "
                "measure the scales on: to_plain(model, args, kwargs), with "
                "the inputs of a forward call"
            )
        return export_transformed(module, args, kwargs)
    if isinstance(module, TransformerDecoder):
        return export_decoder(module, args, kwargs, seq_len)
    raise TypeError(
        f"to_plain expects a model made by unit_scaling.transforms.unit_scale or "
        f"a unit_scaling.TransformerDecoder, got {type(module).__name__}; apply "
        "unit_scale (and train) first"
    )
