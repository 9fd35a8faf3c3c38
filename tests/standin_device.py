"""A stand-in device for the tests: tensors that say they live on another
device, computed on the CPU.

On a CPU-only machine a tensor the library makes on the wrong device (a
stand-in drawn on ``"cpu"``, a mask made without ``device=``) meets the model's
CPU tensors and works, so device bugs hide until a user runs on a GPU. Here the
model, its inputs and everything made "like" them live on the ``standin``
device (torch's ``PrivateUse1`` backend, registered from Python): a
:class:`StandIn` tensor wraps a CPU tensor and reports ``standin:0``, factory
calls naming that device make one, and ``.to("standin")``/``.cpu()`` move
between the two. An op mixing a stand-in with a CPU tensor of one or more
dimensions raises torch's device-mismatch error, as a CUDA op given a CPU
tensor does (0-dim CPU tensors pass, as on CUDA). The values are the CPU's,
bit for bit, so a transform on the stand-in device must give exactly what it
gives on the CPU.

Installing the device is process-wide and cannot be undone (torch renames its
``PrivateUse1`` backend once per process, and an accelerator then exists):
:func:`in_subprocess` runs a check in a fresh process, so the rest of a test
run never sees it.

What it covers: every op the library runs eagerly (its measurements,
recognition and calibration at capture, the captured graphs at run time,
autograd) and TorchDynamo's capture, which fakeifies a stand-in as a wrapper
subclass and propagates devices through it (a device mismatch there fails the
capture). What it cannot cover: compiled kernels (Inductor's code for this
device does not exist; the compiled paths run on the CPU), and CUDA-only
branches (``if x.is_cuda``), which a stand-in does not take.
"""

from __future__ import annotations

import multiprocessing
import os
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.nn.attention
from torch import Tensor
from torch.utils import _pytree as pytree

NAME = "standin"
T = TypeVar("T")

# Ops where a CUDA kernel accepts CPU tensors beside CUDA ones.
_CROSS_DEVICE = {
    torch.ops.aten.copy_.default,  # the copy of a move
    torch.ops.aten._to_copy.default,
    torch.ops.aten.index.Tensor,  # CPU indices into a CUDA tensor
    torch.ops.aten.index_put_.default,
    torch.ops.aten.index_put.default,
}
# Factory ops, made on the CPU and wrapped: those others come down to, and
# those that would write into an empty tensor and resize it (a wrapper's size
# cannot follow its contents' resize).
_FACTORIES = (
    "empty.memory_format",
    "empty_strided",
    "arange",
    "arange.start",
    "arange.start_step",
    "linspace",
    "logspace",
    "eye",
    "eye.m",
    "randperm",
)


def device() -> torch.device:
    """The stand-in device, ``standin:0`` (after :func:`install`)."""
    return torch.device(NAME, 0)


class StandIn(Tensor):
    """A tensor on the stand-in device holding a CPU tensor (``inner``)."""

    inner: Tensor

    @staticmethod
    def __new__(cls, inner: Tensor) -> StandIn:
        return Tensor._make_wrapper_subclass(  # type: ignore[attr-defined, no-any-return]
            cls,
            inner.shape,
            strides=inner.stride(),
            storage_offset=inner.storage_offset(),
            dtype=inner.dtype,
            layout=inner.layout,
            device=device(),
            requires_grad=inner.requires_grad,
        )

    def __init__(self, inner: Tensor) -> None:
        self.inner = inner

    def __repr__(self) -> str:  # type: ignore[override]
        return f"StandIn({self.inner!r})"

    # (a traceable wrapper subclass: TorchDynamo fakeifies it through these)
    def __tensor_flatten__(self) -> tuple[list[str], None]:
        return ["inner"], None

    @staticmethod
    def __tensor_unflatten__(
        inners: dict[str, Tensor], meta: None, outer_size: Any, outer_stride: Any
    ) -> StandIn:
        return StandIn(inners["inner"])

    @classmethod
    @torch._disable_dynamo  # type: ignore[misc]
    def __torch_dispatch__(
        cls,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func not in _CROSS_DEVICE:
            for t in pytree.tree_leaves((args, kwargs)):
                if isinstance(t, Tensor) and t.device.type == "cpu" and t.dim():
                    raise RuntimeError(
                        "Expected all tensors to be on the same device, but found "
                        f"at least two devices, {device()} and {t.device}! "
                        f"({func}: a tensor of shape {tuple(t.shape)} on {t.device})"
                    )
        given = [
            t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, StandIn)
        ]
        args, kwargs = pytree.tree_map_only(Tensor, _cpu_side, (args, kwargs))
        if isinstance(kwargs.get("device"), torch.device) and (
            kwargs["device"].type == NAME
        ):
            kwargs["device"] = torch.device("cpu")
        if func is torch.ops.aten._fused_sdp_choice.default:
            # (attention in its math form: the fused kernels this device would
            # pick are left for a backend to override)
            return int(torch.nn.attention.SDPBackend.MATH)
        if func is torch.ops.aten.histc.default and not args[0].is_floating_point():
            # (CUDA counts integers; the CPU kernel takes floats only)
            counts = func(args[0].float(), *args[1:], **kwargs)
            return StandIn(counts.to(args[0].dtype))
        out = func(*args, **kwargs)
        for t in given:  # never in silence: a wrapper keeps the size it was made at
            if t.inner.shape != t.shape:
                raise RuntimeError(
                    f"stand-in device: {func} resized a {tuple(t.shape)} tensor to "
                    f"{tuple(t.inner.shape)}, which a stand-in cannot follow; make "
                    "it with a factory that _FACTORIES lists"
                )
        if func is torch.ops.aten._to_copy.default and _to_cpu(kwargs):
            return out  # .cpu(), .to("cpu"): off the stand-in device
        return pytree.tree_map_only(
            Tensor, lambda t: StandIn(t) if t.device.type == "cpu" else t, out
        )


def _cpu_side(t: Tensor) -> Tensor:
    """The CPU tensor a stand-in holds; for a tensor on the stand-in device
    that is not one (the fake tensors of TorchDynamo's capture, where factories
    make plain fakes on any device), its copy on the CPU."""
    if isinstance(t, StandIn):
        return t.inner
    return t.to("cpu") if t.device.type == NAME else t


def _to_cpu(kwargs: dict[str, Any]) -> bool:
    target = kwargs.get("device")
    return target is not None and torch.device(target).type == "cpu"


class _Backend:
    """What torch asks of a device's Python module (``torch.standin``)."""

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def _lazy_init() -> None:
        return None

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        return None

    # (``torch.random.fork_rng`` saves and restores every device's state)
    @staticmethod
    def get_rng_state(device: Any = None) -> Tensor:
        return torch.empty(0, dtype=torch.uint8)

    @staticmethod
    def set_rng_state(state: Tensor, device: Any = None) -> None:
        return None


_LIBRARY: list[torch.library.Library] = []


def available() -> bool:
    """Whether this torch can register a device from Python."""
    try:
        from torch.utils.backend_registration import (  # noqa: F401
            _setup_privateuseone_for_python_backend,
        )
    except ImportError:
        return False
    return hasattr(torch._C, "_acc")


def install() -> torch.device:
    """Register the stand-in device in this process (once); returns it."""
    if _LIBRARY:
        return device()
    from torch.utils.backend_registration import (
        _setup_privateuseone_for_python_backend,
    )

    _setup_privateuseone_for_python_backend(rename=NAME, backend_module=_Backend())
    library = torch.library.Library("aten", "IMPL")
    for name in _FACTORIES:
        packet, _, overload = name.partition(".")
        op = getattr(getattr(torch.ops.aten, packet), overload or "default")
        library.impl(name, _factory(op), "PrivateUse1")
    _LIBRARY.append(library)
    return device()


def _factory(op: Any) -> Callable[..., StandIn]:
    @torch._disable_dynamo  # type: ignore[misc]
    def make(*args: Any, **kwargs: Any) -> StandIn:
        return StandIn(op(*args, **{**kwargs, "device": torch.device("cpu")}))

    return make


def math_attention() -> Any:
    """A context in which attention takes its math form on every device, as
    it does on the stand-in device (the CPU's fused kernel rounds otherwise,
    and a gradient zero in exact arithmetic, an attention key's bias's, is
    then two different draws of rounding noise)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.MATH)


def move(tree: T) -> T:
    """``tree`` with every module and tensor moved to the stand-in device
    (modules in place, as ``Module.to`` does)."""
    target = install()

    def one(x: Any) -> Any:
        if isinstance(x, torch.nn.Module):
            return x.to(target)
        if isinstance(x, Tensor):
            moved = x.detach().to(target)
            return moved.requires_grad_(x.requires_grad)
        return x

    return pytree.tree_map(one, tree, is_leaf=lambda x: isinstance(x, torch.nn.Module))


def back(tree: T) -> T:
    """``tree`` with every tensor on the CPU (plain tensors)."""
    return pytree.tree_map_only(Tensor, lambda t: t.detach().cpu(), tree)


def _child(fn: Callable[..., Any], args: tuple[Any, ...], queue: Any) -> None:
    try:
        queue.put(("ok", fn(*args)))
    except BaseException:  # the parent reports it
        queue.put(("error", traceback.format_exc()))
    queue.close()
    queue.join_thread()
    # (no interpreter teardown: with the Python device's hooks registered, a
    # CUDA build of torch 2.15 aborts in it, "terminate called without an
    # active exception", after the work is done)
    os._exit(0)


def in_subprocess(fn: Callable[..., T], *args: Any, timeout: float = 600) -> T:
    """``fn(*args)`` run in a fresh process (spawned), its result returned;
    an exception there fails here with its traceback."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child, args=(fn, args, queue))
    process.start()
    try:
        status, result = queue.get(timeout=timeout)
    finally:
        process.join(timeout=30)
        if process.is_alive():
            process.kill()
    if status == "error":
        raise AssertionError(f"in the subprocess:\n{result}")
    return result  # type: ignore[no-any-return]


class StandInSide:
    """The stand-in device as a side of ``benchmarks.gpu``'s comparison
    (:class:`benchmarks.gpu.agreement.Side`), installed where it is used."""

    name = NAME

    def put_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return move(model)

    def put(self, tree: Any) -> Any:
        return move(tree)

    def back(self, tensor: Tensor) -> Tensor:
        return tensor.detach().cpu()
