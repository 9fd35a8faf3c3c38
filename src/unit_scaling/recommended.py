"""u-μP's recommended hyperparameters: where a new model should start.

The library's own defaults follow the seed library and the u-μP paper's
notation: every multiplier of :class:`~unit_scaling.TransformerDecoder` is 1 and
:mod:`unit_scaling.optim`'s learning rate is torch's. Those are the *origin* of
u-μP's search space, not a good place to train from: on a 2-layer byte-level
decoder (200 steps of 16×64 tokens) lr 2⁻³ with every multiplier at 1 ends at a
validation loss of 2.55 at every width, and lr 2⁰ at 2.24–2.32, no better at
width 512 than at width 64.

:data:`RECOMMENDED` holds the values chosen instead, found by u-μP's cheap
search on a width-64 proxy (``docs/results/umup_search_sequential.md``) and
checked on other widths, depths, sequence lengths and training lengths
(``docs/results/umup_defaults.md``, which also says what was not measured):

- ``lr = 2⁰``, the learning rate of :mod:`unit_scaling.optim`'s optimizers for a
  :class:`~unit_scaling.TransformerDecoder` built with
- ``residual_mult = 2⁻¹``: the residual branches weigh half as much against the
  embedding (the skip path), and
- ``loss_mult = 2²``: the loss's softmax sees logits 4× larger; u-μP's readout
  (``1/fan_in``) leaves them too small to be confident otherwise;
- ``unit_scale_lr = 2⁻¹``, the learning rate for a model made u-μP by
  :func:`unit_scaling.transforms.unit_scale` (``residual_scaling="u-μP"``), which
  has neither multiplier: it was the best of a ×2 grid at every width (64 to
  512) for a Llama-style decoder (``docs/results/hf_transfer.md``).

They are a start, not an optimum everywhere. On the deepest configuration
measured (8 layers, 500 steps of 32×128 tokens), u-μP at these values gains from
width but trails SP with its lr tuned at width 512 (validation loss 1.346 against
1.319, 3 seeds each), and lr 2¹ beats 2⁰ there by 0.06–0.09 at widths 64–256;
on the 4-layer configuration 2¹ is worse, so tune the lr on a proxy of your own.

Every page and example that starts a u-μP model reads its values from here, so
changing one value here changes them all.

Example::

    >>> model = uu.TransformerDecoder(64, 256, layers=2, heads=2,
    ...                               **RECOMMENDED.multipliers)
    >>> opt = uu.optim.AdamW(model.parameters(), lr=RECOMMENDED.lr)
    >>> RECOMMENDED.multipliers
    {'residual_mult': 0.5, 'loss_mult': 4.0}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["RECOMMENDED", "Recommended"]


@dataclass(frozen=True)
class Recommended:
    """A set of u-μP hyperparameters to start from (see the module docstring).

    Args:
        lr: the learning rate of a :mod:`unit_scaling.optim` optimizer for a
            :class:`~unit_scaling.TransformerDecoder` built with these
            multipliers.
        residual_mult: :class:`~unit_scaling.TransformerDecoder`'s
            ``residual_mult`` (u-μP's α_res).
        loss_mult: :class:`~unit_scaling.TransformerDecoder`'s ``loss_mult``
            (u-μP's α_loss-softmax).
        unit_scale_lr: the learning rate for a model made u-μP by
            :func:`~unit_scaling.transforms.unit_scale`.

    Raises:
        ValueError: a value that is not a positive, finite number.

    Example::

        >>> Recommended(lr=0.5).multipliers
        {'residual_mult': 0.5, 'loss_mult': 4.0}
    """

    lr: float = 2.0**0
    residual_mult: float = 2.0**-1
    loss_mult: float = 2.0**2
    unit_scale_lr: float = 2.0**-1

    def __post_init__(self) -> None:
        for name in ("lr", "residual_mult", "loss_mult", "unit_scale_lr"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{name} must be a number, got {type(value).__name__}")
            if not (0 < value < float("inf")):
                raise ValueError(f"{name} must be positive and finite, got {value!r}")

    @property
    def multipliers(self) -> dict[str, Any]:
        """The keyword arguments of :class:`~unit_scaling.TransformerDecoder`
        these values set (those not at their default of 1): floats, typed
        ``Any`` so that ``**RECOMMENDED.multipliers`` type-checks beside the
        decoder's other keyword arguments."""
        return {"residual_mult": self.residual_mult, "loss_mult": self.loss_mult}


RECOMMENDED = Recommended()
"""The recommended values: lr 2⁰, ``residual_mult`` 2⁻¹, ``loss_mult`` 2², and
lr 2⁻¹ for :func:`~unit_scaling.transforms.unit_scale`'d models."""
