"""Unit-scaled elementwise activations, ``softmax`` and ``dropout``.

Every activation here is "the torch op, plus an output scale, plus an input-gradient
scale, plus a constraint", applied by :func:`._scaling.scaled_unary` with the fewest
passes:
when the constraint makes both scales equal (the default ``"to_output_scale"``) the
op is ``c * f(x)`` with its true gradient, one multiply in each direction (plus the
temperature's when ``mult != 1``).

``inplace=True`` follows torch: the result is computed out of place (from a copy
where the backward needs the input) and written into ``input``, which is returned;
like torch, this raises for a leaf tensor that requires grad. Torch's flags are
checked (``inplace`` must be a bool, ``approximate`` one of torch's strings):
our ``mult`` follows them, so a temperature passed positionally, as in
``U.silu(x, 2.0)``, would otherwise be taken as ``inplace=True``.

Conventions for the scales, assuming a unit-normal input and a unit-normal output
gradient independent of it:

* an **output scale** divides by the output's *standard deviation* (a constant
  offset, such as the mean of ``relu`` or ``sigmoid``, is not counted: the next
  linear layer or normalisation absorbs it), except for ``softmax``, whose
  outputs are normalised by their RMS (in its flat limit the std is zero);
* a **gradient scale** divides by the input gradient's RMS, which equals its
  standard deviation because the incoming gradient has zero mean.

``mult`` is the u-μP temperature hyperparameter of an activation: 1 gives the
standard function, and it is tuned once on a small model and then transferred.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from .._autograd import Function
from .._kernels import in_memory
from ..core.functional import logarithmic_interpolation
from ._checks import check_dim, check_flag, check_mult, validate_constraint
from ._scaling import scaled_unary, sigmoid_of_log

__all__ = ["dropout", "gelu", "relu", "sigmoid", "silu", "silu_glu", "softmax", "tanh"]

# The ReLU limit of gelu/silu at large mult: relu(x) of a unit normal has std
# sqrt((1 - 1/pi) / 2), and its gradient mask keeps half of a unit-normal gradient.
_RELU_OUTPUT_SCALE = math.sqrt(2 / (1 - 1 / math.pi))  # 1.71286
_RELU_GRAD_SCALE = math.sqrt(2)
# E[f(x)²]-type integrals against the unit normal density, by quadrature (the
# tests recompute them): tanh(x) has std 0.627929 and tanh'(x) RMS 0.681471;
# sigmoid(x) has std 0.208276 (mean exactly 1/2) and sigmoid'(x) RMS 0.211746.
_TANH_OUTPUT_SCALE = 1.592537
_TANH_GRAD_SCALE = 1.467414
_SIGMOID_OUTPUT_SCALE = 4.801313
_SIGMOID_GRAD_SCALE = 4.722646
# torch's values of its flags, checked because our extras follow them.
_BOOLS = (False, True)
_GELU_APPROXIMATIONS = ("none", "tanh")


def _relu_like(
    op: str,
    f: Callable[[Tensor], Tensor],
    input: Tensor,
    mult: float,
    constraint: str | None,
    grad_weight_mult: float,
) -> Tensor:
    """``alpha f(m x) / m`` for an ``f`` that is ``x / 2`` near 0 and ReLU far
    from it (GELU, SiLU): each scale interpolates log-linearly from 2 at small
    ``m`` to ReLU's at large ``m``, the output's with weight
    ``sigmoid(ln 4m^2)`` and the gradient's with ``sigmoid(ln c m^2)``,
    ``c = grad_weight_mult``."""
    validate_constraint(constraint)
    check_mult(op, mult)
    output_scale = logarithmic_interpolation(
        sigmoid_of_log(4 * mult**2), lower=2.0, upper=_RELU_OUTPUT_SCALE
    )
    grad_scale = logarithmic_interpolation(
        sigmoid_of_log(grad_weight_mult * mult**2), lower=2.0, upper=_RELU_GRAD_SCALE
    )
    return scaled_unary(
        f,
        input,
        output_scale,
        grad_scale,
        constraint,
        input_mult=mult,
        output_mult=1 / mult,
    )


def gelu(
    input: Tensor,
    approximate: str = "none",
    mult: float = 1.0,
    constraint: str | None = "to_output_scale",
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.gelu` with a temperature ``mult``.

    .. math::
        y = \\alpha\\, \\mathrm{GELU}(m x) / m, \\qquad
        \\partial_x = \\beta\\, \\mathrm{GELU}'(m x)\\, \\partial_y

    The scales are empirical models for a unit-normal input. As ``m → 0`` the
    function tends to ``x / 2`` (both scales 2); as ``m → ∞`` it tends to ReLU
    (output :math:`\\sqrt{2 / (1 - 1/\\pi)}`, gradient :math:`\\sqrt 2`). With
    :math:`w = \\mathrm{sigmoid}(\\ln 4m^2) = 1 / (1 + 1/(4m^2))` the model
    interpolates log-linearly:

    .. math::
        \\alpha = 2^{1-w} \\left(\\tfrac{2}{1 - 1/\\pi}\\right)^{w/2}, \\qquad
        \\beta = 2^{1-w} (\\sqrt 2)^{w}

    then the constraint ties ``(alpha, beta)``.

    Args:
        input: any shape.
        approximate: ``"none"`` or ``"tanh"``, as in torch.
        mult: the temperature ``m > 0``.
        constraint: see :mod:`unit_scaling.constraints`.

    Example::

        >>> y = U.gelu(torch.randn(2**16), constraint=None)
        >>> round(y.std().item(), 1)
        1.0
    """
    check_flag(
        "gelu", "approximate", approximate, _GELU_APPROXIMATIONS, takes_mult=True
    )
    return _relu_like(
        "gelu",
        lambda x: F.gelu(x, approximate=approximate),
        input,
        mult,
        constraint,
        grad_weight_mult=4,
    )


def silu(
    input: Tensor,
    inplace: bool = False,
    mult: float = 1.0,
    constraint: str | None = "to_output_scale",
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.silu` with a temperature ``mult``.

    .. math::
        y = \\alpha\\, \\mathrm{SiLU}(m x) / m = \\alpha\\, x\\, \\sigma(m x), \\qquad
        \\partial_x = \\beta\\, \\mathrm{SiLU}'(m x)\\, \\partial_y

    The same empirical models as :func:`gelu` (limits 2 at small ``m``, ReLU's
    :math:`\\sqrt{2 / (1 - 1/\\pi)}` and :math:`\\sqrt 2` at large ``m``), except that
    SiLU approaches ReLU more slowly, so the gradient weight is
    :math:`w_\\beta = \\mathrm{sigmoid}(\\ln m^2)`:

    .. math::
        w_\\alpha = \\mathrm{sigmoid}(\\ln 4m^2), \\quad
        \\alpha = 2^{1-w_\\alpha} \\left(\\tfrac{2}{1 - 1/\\pi}\\right)^{w_\\alpha/2},
        \\quad \\beta = 2^{1-w_\\beta} (\\sqrt 2)^{w_\\beta}

    then the constraint ties ``(alpha, beta)``.

    Args:
        input: any shape.
        inplace: overwrite ``input`` with the result and return it, as in torch.
        mult: the temperature ``m > 0``.
        constraint: see :mod:`unit_scaling.constraints`.

    Example::

        >>> y = U.silu(torch.randn(2**16), mult=2.0, constraint=None)
        >>> round(y.std().item(), 1)
        1.0
    """
    check_flag("silu", "inplace", inplace, _BOOLS, takes_mult=True)
    # SiLU's backward needs its input, which the in-place write would overwrite.
    source = input.clone() if inplace and mult == 1 else input
    out = _relu_like("silu", F.silu, source, mult, constraint, grad_weight_mult=1)
    return input.copy_(out) if inplace else out


def silu_glu(input: Tensor, gate: Tensor, mult: float = 1.0) -> Tensor:
    """Unit-scaled SiLU-gated linear unit (the SwiGLU nonlinearity).

    .. math::
        y = s\\, x \\cdot \\mathrm{SiLU}(m g) / m, \\qquad
        s = 2^{1-w} (\\sqrt 2)^{w}, \\quad w = \\mathrm{sigmoid}(\\ln m^2)

    As ``m → 0`` the product tends to ``x g / 2`` (scale 2), as ``m → ∞`` to
    ``x · relu(g)`` (scale :math:`\\sqrt 2`). The single scale ``s`` serves the
    output and both input gradients, so the backward pass is the true gradient of
    the forward.

    Args:
        input: the linear branch ``x``.
        gate: the gate ``g``, of the same shape as ``input``.
        mult: the temperature ``m > 0``.

    Example::

        >>> y = U.silu_glu(torch.randn(2**16), torch.randn(2**16))
        >>> round(y.std().item(), 1)
        1.0
    """
    check_mult("silu_glu", mult)
    if input.shape != gate.shape:
        raise ValueError(
            "U.silu_glu: input and gate must have the same shape, got "
            f"{tuple(input.shape)} and {tuple(gate.shape)}"
        )
    scale = logarithmic_interpolation(
        sigmoid_of_log(mult**2), lower=2.0, upper=_RELU_GRAD_SCALE
    )
    out, _ = _SiluGluFn.apply(input, gate, mult, scale / mult)
    return cast(Tensor, out)


# 0-d zeros by device and dtype: the `self` of the addcmul that computes a scaled
# product in one pass. A fresh one per call would cost a kernel (a fill) each.
_ZEROS: dict[tuple[torch.device, torch.dtype], Tensor] = {}


def _zero(like: Tensor) -> Tensor:
    """A 0-d zero of ``like``'s device and dtype, never written to.

    Made once per device and dtype for plain tensors on the CPU or a CUDA device;
    made afresh for anything else (fake, meta and functorch-wrapped tensors,
    traces, other devices) and while a CUDA graph is being captured (a tensor
    made then would live in the graph's memory, unfilled until replayed).
    """
    device = like.device
    cached = in_memory(like) and (
        device.type == "cpu"
        or (device.type == "cuda" and not torch.cuda.is_current_stream_capturing())
    )
    if not cached:
        return like.new_zeros(())
    zero = _ZEROS.get((device, like.dtype))
    if zero is None:
        with torch.inference_mode(False):  # usable outside inference mode too
            zero = like.new_zeros(())
        if device.type == "cuda":  # filled before any stream reads it
            torch.cuda.current_stream(device).synchronize()
        _ZEROS[device, like.dtype] = zero
    return zero


class _SiluGluFn(Function):
    """``y = v · x · silu(m g)`` with its true gradient, every product scaled in
    the pass that computes it (``addcmul`` with a 0-d zero ``self``, made once:
    :func:`_zero`), so neither direction makes an extra pass or keeps an extra
    tensor: it saves what ``x * F.silu(g)`` saves (``x``, ``g``, ``silu(m g)``).
    ``silu(m g)`` is also returned, non-differentiable, so that
    ``setup_context`` can save it. Under ``create_graph`` the backward recomputes
    it from ``g`` to stay differentiable.
    """

    @staticmethod
    def forward(
        input: Tensor, gate: Tensor, mult: float, value: float
    ) -> tuple[Tensor, Tensor]:
        activated = F.silu(gate if mult == 1 else gate * mult)
        out = torch.addcmul(_zero(input), input, activated, value=value)
        return out, activated

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        input, gate, mult, value = inputs
        activated = output[1]
        ctx.mark_non_differentiable(activated)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(input, gate, activated)
        ctx.mult, ctx.value = mult, value

    @staticmethod
    def backward(
        ctx: Any, grad: Tensor | None, _: Any
    ) -> tuple[Tensor | None, Tensor | None, None, None]:
        if grad is None:
            return None, None, None, None
        input, gate, activated = ctx.saved_tensors
        mult, value = ctx.mult, ctx.value
        tempered = gate if mult == 1 else gate * mult
        differentiable = torch.is_grad_enabled()  # double backward (create_graph)
        if differentiable:
            activated = F.silu(tempered)
        zero = _zero(grad)
        grad_input = grad_gate = None
        # The gate's gradient first, written over its own temporary: at most two
        # new tensors are alive at once, as in the backward of x * F.silu(g).
        if ctx.needs_input_grad[1]:
            scaled = torch.addcmul(zero, grad, input, value=value * mult)
            if differentiable:  # aten's silu_backward has no derivative
                sig = torch.sigmoid(tempered)
                grad_gate = scaled * sig * (1 + tempered * (1 - sig))
            else:
                grad_gate = torch.ops.aten.silu_backward.grad_input(
                    scaled, tempered, grad_input=scaled
                )
        if ctx.needs_input_grad[0]:
            grad_input = torch.addcmul(zero, grad, activated, value=value)
        return grad_input, grad_gate, None, None


def relu(
    input: Tensor, inplace: bool = False, constraint: str | None = "to_output_scale"
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.relu`.

    .. math::
        y = \\alpha\\, \\mathrm{relu}(x), \\quad
        \\alpha = \\sqrt{\\tfrac{2}{1 - 1/\\pi}} \\approx 1.7129, \\qquad
        \\partial_x = \\beta\\, 1[x > 0]\\, \\partial_y, \\quad \\beta = \\sqrt 2

    ``relu(x)`` of a unit normal has mean :math:`1/\\sqrt{2\\pi}` and standard
    deviation :math:`\\sqrt{(1 - 1/\\pi)/2}`; ``alpha`` normalises the latter. The
    mask keeps half of the gradient's variance. The constraint ties
    ``(alpha, beta)``.

    Args:
        input: any shape.
        inplace: overwrite ``input`` with the result and return it, as in torch.
        constraint: see :mod:`unit_scaling.constraints`.

    Example::

        >>> y = U.relu(torch.randn(2**16))
        >>> round(y.std().item(), 1)
        1.0
    """
    check_flag("relu", "inplace", inplace, _BOOLS, takes_mult=False)
    validate_constraint(constraint)
    # relu's backward needs only its output, so input may be overwritten.
    out = scaled_unary(
        torch.relu, input, _RELU_OUTPUT_SCALE, _RELU_GRAD_SCALE, constraint
    )
    return input.copy_(out) if inplace else out


def tanh(input: Tensor, constraint: str | None = "to_output_scale") -> Tensor:
    """Unit-scaled :func:`torch.tanh`.

    .. math::
        y = \\alpha \\tanh(x), \\quad \\alpha = 1/\\mathrm{std}[\\tanh x]
        \\approx 1.592537, \\qquad
        \\partial_x = \\beta (1 - \\tanh^2 x)\\, \\partial_y, \\quad
        \\beta = 1/\\mathrm{RMS}[1 - \\tanh^2 x] \\approx 1.467414

    for unit-normal ``x``: :math:`E[\\tanh^2 x] = 0.394294` and
    :math:`E[(1 - \\tanh^2 x)^2] = 0.464403` (numerical integrals). The constraint
    ties ``(alpha, beta)``.

    Args:
        input: any shape.
        constraint: see :mod:`unit_scaling.constraints`.

    Example::

        >>> y = U.tanh(torch.randn(2**16))
        >>> round(y.std().item(), 1)
        1.0
    """
    validate_constraint(constraint)
    return scaled_unary(
        torch.tanh, input, _TANH_OUTPUT_SCALE, _TANH_GRAD_SCALE, constraint
    )


def sigmoid(input: Tensor, constraint: str | None = "to_output_scale") -> Tensor:
    """Unit-scaled :func:`torch.sigmoid`.

    .. math::
        y = \\alpha\\, \\sigma(x), \\quad \\alpha = 1/\\mathrm{std}[\\sigma(x)]
        \\approx 4.801313, \\qquad
        \\partial_x = \\beta\\, \\sigma(x)(1 - \\sigma(x))\\, \\partial_y, \\quad
        \\beta = 1/\\mathrm{RMS}[\\sigma'(x)] \\approx 4.722646

    for unit-normal ``x``: :math:`\\sigma(x)` has mean 1/2 and variance 0.043379,
    and :math:`E[\\sigma'(x)^2] = 0.044836` (numerical integrals). The output's
    mean of 1/2 becomes ``alpha / 2 ≈ 2.4`` and is not normalised away. The
    constraint ties ``(alpha, beta)``.

    Args:
        input: any shape.
        constraint: see :mod:`unit_scaling.constraints`.

    Example::

        >>> y = U.sigmoid(torch.randn(2**16))
        >>> round(y.std().item(), 1), round(y.mean().item(), 1)
        (1.0, 2.4)
    """
    validate_constraint(constraint)
    return scaled_unary(
        torch.sigmoid, input, _SIGMOID_OUTPUT_SCALE, _SIGMOID_GRAD_SCALE, constraint
    )


def _implicit_softmax_dim(ndim: int) -> int:
    # torch's (deprecated) rule when no dim is given.
    return 0 if ndim in (0, 1, 3) else 1


def softmax(
    input: Tensor,
    dim: int | None = None,
    _stacklevel: int | torch.dtype = 3,
    dtype: torch.dtype | None = None,
    constraint: str | None = "to_output_scale",
    mult: float = 1.0,
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.softmax` with a temperature ``mult``.

    .. math::
        y = \\alpha\\, \\mathrm{softmax}(m x), \\qquad
        \\partial_x = \\beta\\, \\partial_x \\mathrm{softmax}(m x)

    With ``n`` the size of ``dim``, the empirical models interpolate log-linearly
    with weight :math:`w = \\mathrm{sigmoid}(\\ln(m^2/4)) = m^2 / (m^2 + 4)` between
    the flat limit (``m → 0``: every output ``1/n``, gradient RMS ``m/n``) and the
    one-hot limit (``m → ∞``):

    .. math::
        \\alpha = n^{1-w} (\\sqrt n)^{w}, \\qquad
        \\beta = (n/m)^{1-w} (\\sqrt{n/m})^{w}

    ``alpha`` normalises the output's RMS (its entries are all positive). The
    constraint then ties ``(alpha, beta)``.

    Args:
        input: any shape.
        dim: the dimension to normalise over; ``None`` uses torch's deprecated
            implicit choice (with a warning).
        _stacklevel: accepted for compatibility with torch and ignored; a
            ``torch.dtype`` here is taken as ``dtype``, which is where
            :func:`torch.softmax` and ``Tensor.softmax`` take it.
        dtype: if given, the input is cast to it before the softmax.
        constraint: see :mod:`unit_scaling.constraints`.
        mult: the temperature ``m > 0``.

    Example::

        >>> y = U.softmax(torch.randn(1024, 256), dim=-1)
        >>> round(y.pow(2).mean().sqrt().item(), 1)  # the model is exact at the limits
        0.9
    """
    validate_constraint(constraint)
    check_mult("softmax", mult)
    if isinstance(_stacklevel, torch.dtype):
        dtype = _stacklevel
    if dim is None:
        warnings.warn(
            "U.softmax: implicit dimension choice for softmax has been deprecated; "
            "pass dim explicitly",
            UserWarning,
            stacklevel=2,
        )
        dim = _implicit_softmax_dim(input.dim())
    check_dim("softmax", dim, input)
    n = max(input.shape[dim], 1) if input.dim() > 0 else 1  # empty: any scale
    w = sigmoid_of_log(mult**2 / 4)
    output_scale = logarithmic_interpolation(w, lower=n, upper=math.sqrt(n))
    grad_scale = logarithmic_interpolation(w, lower=n / mult, upper=math.sqrt(n / mult))
    return scaled_unary(
        lambda x: F.softmax(x, dim, dtype=dtype),
        input,
        output_scale,
        grad_scale,
        constraint,
        input_mult=mult,
    )


def dropout(
    input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.dropout`.

    .. math::
        y = \\sqrt{1 - p}\\; \\mathrm{dropout}(x, p)
          = \\frac{\\mathrm{mask} \\odot x}{\\sqrt{1 - p}}, \\qquad
        \\partial_x = \\frac{\\mathrm{mask} \\odot \\partial_y}{\\sqrt{1 - p}}

    Torch's dropout divides kept values by ``1 - p``, which preserves the mean but
    raises the variance to ``1 / (1 - p)``; the extra ``sqrt(1 - p)`` restores unit
    variance in both passes. With ``training=False`` (or ``p = 0``) this is the
    identity.

    Args:
        input: any shape.
        p: probability of zeroing an element, in ``[0, 1]``.
        training: apply dropout only when ``True``.
        inplace: overwrite ``input`` with the result and return it, as in torch.

    Example::

        >>> y = U.dropout(torch.randn(2**16), p=0.5)
        >>> round(y.std().item(), 1)
        1.0
    """
    check_flag("dropout", "inplace", inplace, _BOOLS, takes_mult=False)
    if not 0 <= p <= 1:
        raise ValueError(
            f"U.dropout: p must be a probability between 0 and 1, got p={p!r}"
        )
    if not training or p == 0:
        return input
    # The mask is all dropout's backward needs, so input may be overwritten.
    out = F.dropout(input * math.sqrt(1 - p), p, training)
    return input.copy_(out) if inplace else out
