"""Scale primitives: multiply a tensor in the forward or the backward pass only.

These are the two building blocks of unit scaling. Every unit-scaled op is
"the torch op, plus an output scale (:func:`scale_fwd`), plus one scale per input
gradient (:func:`scale_bwd`)". Both are single autograd functions that allocate
nothing beyond their product, never synchronise with the host, and trace under
``torch.compile(fullgraph=True)``.
"""

from __future__ import annotations

from torch import Tensor

from ._twoway import Scale, scale_twoway

__all__ = ["scale_bwd", "scale_fwd"]


def scale_fwd(input: Tensor, scale: Scale) -> Tensor:
    """Multiply by ``scale`` in the forward pass; the gradient passes unchanged.

    .. math:: y = s\\,x, \\qquad \\partial L/\\partial x = \\partial L/\\partial y

    Args:
        input: the tensor to scale.
        scale: a Python number or a tensor broadcastable to ``input``.

    Example::

        >>> x = torch.ones(3, requires_grad=True)
        >>> y = scale_fwd(x, 2.0)
        >>> y.sum().backward()
        >>> y.tolist(), x.grad.tolist()
        ([2.0, 2.0, 2.0], [1.0, 1.0, 1.0])
    """
    return scale_twoway(input, scale, 1.0)


def scale_bwd(input: Tensor, scale: Scale) -> Tensor:
    """Identity in the forward pass; multiply the gradient by ``scale``.

    .. math:: y = x, \\qquad \\partial L/\\partial x = s\\,\\partial L/\\partial y

    Args:
        input: the tensor whose gradient is scaled.
        scale: a Python number or a tensor broadcastable to the gradient.

    Example::

        >>> x = torch.ones(3, requires_grad=True)
        >>> scale_bwd(x, 2.0).sum().backward()
        >>> x.grad.tolist()
        [2.0, 2.0, 2.0]
    """
    return scale_twoway(input, 1.0, scale)
