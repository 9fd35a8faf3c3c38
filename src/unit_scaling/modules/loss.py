"""Unit-scaled loss modules."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from .. import functional as U

__all__ = ["CrossEntropyLoss"]


class CrossEntropyLoss(nn.CrossEntropyLoss):
    """Unit-scaled :class:`torch.nn.CrossEntropyLoss` with logit multiplier ``mult``.

    The loss value is torch's (times ``mult`` on the logits); the logits gradient
    is rescaled to unit scale. See :func:`unit_scaling.functional.cross_entropy`.
    Class ``weight``, ``label_smoothing`` and the deprecated ``size_average`` /
    ``reduce`` are not supported and raise ``ValueError`` here, at construction.

    Example::

        >>> loss = CrossEntropyLoss()(torch.randn(8, 10), torch.randint(10, (8,)))
        >>> loss.shape
        torch.Size([])
    """

    def __init__(
        self,
        weight: Any = None,
        size_average: Any = None,
        ignore_index: int = -100,
        reduce: Any = None,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
        mult: float = 1.0,
    ) -> None:
        unsupported = {
            "weight": weight is not None,
            "size_average": size_average is not None,
            "reduce": reduce is not None,
            "label_smoothing": label_smoothing != 0.0,
        }
        for name, given in unsupported.items():
            if given:
                raise ValueError(
                    f"CrossEntropyLoss: the {name!r} argument has not been "
                    "implemented; leave it at its default"
                )
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(
                f"reduction={reduction!r} is not valid; expected 'mean', 'sum' or "
                "'none'"
            )
        super().__init__(ignore_index=ignore_index, reduction=reduction)
        self.mult = mult

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return U.cross_entropy(
            input,
            target,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
            mult=self.mult,
        )

    def extra_repr(self) -> str:
        return (
            f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
            f"mult={self.mult}"
        )
