"""Every private torch API the package uses, outside Dynamo's (which live in
:mod:`unit_scaling.transforms._capture.dynamo`), and every difference between the torch
versions it supports, in one place.

Each name here is pinned by ``tests/test_torch_internals.py``, which fails
loudly, naming the API, when a torch upgrade moves or changes one; no other
module imports a private torch name (``tests/test_layers.py`` checks that).
Supported: torch 2.11 (:data:`TORCH_FLOOR`) to 2.15 (:data:`NEWEST_TESTED_TORCH`);
CI tests 2.13, and ``make test-torch VERSION=...`` runs the suite on any other.
Importing the package runs :func:`check_torch_version` before anything else.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx import GraphModule, Node

# Type aliases of torch.nn's constructor arguments: an int or a tuple of n ints.
from torch.nn.common_types import _size_1_t as size_1_t
from torch.nn.common_types import _size_2_t as size_2_t
from torch.nn.common_types import _size_3_t as size_3_t

# torch.utils._pytree: flatten and rebuild nested containers of tensors (the
# module torch's own compile stack uses; its API has been stable for years).
from torch.utils import _pytree as pytree

# A mode that sees every aten op below autograd: the block-format products
# (formats/_products.py) rerun a forward for its autograd graph under one that
# skips its GEMM kernels.
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = [
    "COMPILED_FUNCTION_OUTPUTS_NEED_FRESH_TENSORS",
    "INTERPOLATE_HAS_LANCZOS",
    "NESTED_GRAPH_BREAKS_WORK",
    "NEWEST_TESTED_TORCH",
    "PARAMETER_DATA_SWAPS_RECOMPILE",
    "TORCH_FLOOR",
    "BatchNormBase",
    "ConvNdBase",
    "GradBucket",
    "InstanceNormBase",
    "OpOverload",
    "OpOverloadPacket",
    "TorchDispatchMode",
    "adam_init_group",
    "any_autocast_enabled",
    "check_torch_version",
    "cpp_python_bindings",
    "disabled_torch_function",
    "foreach_add",
    "foreach_add_",
    "foreach_addcdiv_",
    "foreach_addcmul_",
    "foreach_div_",
    "foreach_kernel_devices",
    "foreach_lerp_",
    "foreach_maximum_",
    "foreach_mul_",
    "foreach_neg",
    "foreach_sqrt",
    "fsdp_unsharded_parameters",
    "functorch_transforms_active",
    "graph_capture_health_check",
    "is_fake_tensor",
    "is_functorch_wrapped_tensor",
    "mha_packed_projection",
    "node_replacements",
    "onednn_enabled",
    "pytree",
    "scaled_mm",
    "set_onednn_enabled",
    "size_1_t",
    "size_2_t",
    "size_3_t",
    "symint_hint",
    "torch_version",
    "unhooked_optimizer_step",
    "unsafe_view",
]

# --------------------------------------------------------------------------- #
# Which torch: checked first, before any version-specific name is touched.
# --------------------------------------------------------------------------- #

# The oldest torch the package supports, and the newest its suite has passed on.
TORCH_FLOOR = (2, 11)
NEWEST_TESTED_TORCH = (2, 15)


def _release(version: str) -> tuple[int, int] | None:
    """``(major, minor)`` of a torch version string (``"2.11.0+cu130"``,
    ``"2.16.0.dev20261201"``); ``None`` if it does not start that way."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else None


def torch_version() -> tuple[int, int]:
    """``(major, minor)`` of the installed torch; ``(0, 0)`` if unreadable, which
    selects every older version's workaround below."""
    return _release(str(torch.__version__)) or (0, 0)


def _dotted(release: tuple[int, int]) -> str:
    return ".".join(map(str, release))


@functools.cache
def _warn_untested(installed: str) -> None:
    # Cached: one warning per process, however often the check runs.
    warnings.warn(
        f"unit_scaling is tested with torch {_dotted(TORCH_FLOOR)} to "
        f"{_dotted(NEWEST_TESTED_TORCH)}, and torch {installed} is installed. It "
        "will probably work; if something fails, compare with torch "
        f"{_dotted(NEWEST_TESTED_TORCH)} and report the difference.",
        UserWarning,
        stacklevel=3,
    )


def check_torch_version() -> None:
    """Refuse a torch older than :data:`TORCH_FLOOR` with an ``ImportError``, and
    warn (once, ``UserWarning``) about one newer than :data:`NEWEST_TESTED_TORCH`
    or whose version cannot be read. Reads ``torch.__version__`` on each call."""
    installed = str(torch.__version__)
    release = _release(installed)
    if release is not None and release < TORCH_FLOOR:
        raise ImportError(
            f"unit_scaling needs torch >= {_dotted(TORCH_FLOOR)}, but torch "
            f"{installed} is installed: upgrade it, e.g. "
            f"pip install 'torch>={_dotted(TORCH_FLOOR)}'."
        )
    if release is None or release > NEWEST_TESTED_TORCH:
        _warn_untested(installed)


check_torch_version()

# The private bases of torch's norm and convolution modules: the unit-scaled
# modules subclass them, as torch's own BatchNorm1d/2d/3d do.
BatchNormBase = nn.modules.batchnorm._BatchNorm
InstanceNormBase = nn.modules.instancenorm._InstanceNorm
ConvNdBase = nn.modules.conv._ConvNd

# Graph targets that are aten operators (``torch.ops.aten.add.Tensor``) and
# their overload packets (``torch.ops.aten.add``).
OpOverload = torch._ops.OpOverload
OpOverloadPacket = torch._ops.OpOverloadPacket

# aten's reshape of a tensor that nothing else refers to: the result is not
# recorded as a view (aten's own matmul uses it for the same purpose).
unsafe_view: Callable[[Tensor, Any], Tensor] = torch.ops.aten._unsafe_view.default


def functorch_transforms_active() -> bool:
    """Whether a functorch transform (``vmap``, ``grad``, ...) is running: a
    custom autograd function must then take torch's general ``apply``."""
    active: bool = torch._C._are_functorch_transforms_active()
    return active


def is_functorch_wrapped_tensor(t: Tensor) -> bool:
    """Whether ``t`` is a functorch wrapper (under ``vmap`` or ``grad``), whose
    memory is not its own elements."""
    wrapped: bool = torch._C._functorch.is_functorch_wrapped_tensor(t)
    return wrapped


def is_fake_tensor(value: Any) -> bool:
    """Whether ``value`` is a FakeTensor: TorchDynamo runs each function it
    records as one graph node once on such stand-ins, while it traces, to learn
    what the call returns."""
    return isinstance(value, FakeTensor)


@contextlib.contextmanager
def node_replacements(
    gm: GraphModule, hook: Callable[[Node, str, Node], object]
) -> Iterator[None]:
    """Call ``hook(old, new_name, user)`` whenever, in ``gm``'s graph, a user of
    node ``old`` is given the node named ``new_name`` instead
    (``replace_all_uses_with`` and ``replace_input_with`` call it once per user,
    before the change; a rename of ``old`` calls it with its new name), for
    this block (``GraphModule._register_replace_node_hook``, the hook FX's
    own passes use to follow a node they rewrite)."""
    gm._register_replace_node_hook(hook)
    try:
        yield
    finally:
        gm._unregister_replace_node_hook(hook)


# torch 2.11 only: Dynamo turns a custom autograd Function into a forward graph
# that returns, besides the outputs, every tensor the forward made. When an
# output is one of those tensors (the result of an in-place op, ``t.mul_(s)``,
# is ``t`` itself), the Function returns one tensor twice; autograd then files
# it under the later slot, whose gradient the backward graph drops, and the
# whole backward runs on zeros: silently wrong gradients under torch.compile.
# torch 2.12 leaves out intermediates that alias an output. Where this is set,
# ``unit_scaling._autograd.Function`` returns fresh tensors while compiling.
COMPILED_FUNCTION_OUTPUTS_NEED_FRESH_TENSORS = torch_version() < (2, 12)


# torch 2.11 only: with ``nested_graph_breaks``, Dynamo can resume a frame after
# a graph break inside a nested call with its locals mixed up (Speech2Text's
# decoder, under transformers' decorator wrappers, got a bool as ``self``); a
# mix-up between two values of one type would go unnoticed. Where this is
# ``False`` the transforms capture without nested graph breaks (the same graphs;
# slower captures of models that break inside a nested call).
NESTED_GRAPH_BREAKS_WORK = torch_version() >= (2, 12)


# torch 2.11 only: Dynamo skips the guards on the tensors of a module's
# parameters while the module's parameter dict is unchanged, so a parameter
# given new data in place (``p.data = ...``, as transformers'
# ``resize_token_embeddings`` does) goes on running the graph captured for its
# old data: the transforms never see the resized table. Where this is ``False``
# the transforms capture with those guards kept (Dynamo's
# ``skip_tensor_guards_with_matching_dict_tags`` off; more guards to check).
PARAMETER_DATA_SWAPS_RECOMPILE = torch_version() >= (2, 12)


# torch >= 2.12: ``F.interpolate(mode="lanczos")`` (4-D input, CPU only).
INTERPOLATE_HAS_LANCZOS = torch_version() >= (2, 12)


def symint_hint(value: torch.SymInt) -> int:
    """The concrete value a symbolic size had in the call being traced, without
    adding a guard (``optimization_hint``, torch >= 2.12; ``size_hint`` before)."""
    from torch.fx.experimental import symbolic_shapes

    hint: Callable[[torch.SymInt], int] | None
    hint = getattr(symbolic_shapes, "optimization_hint", None)
    if hint is None:  # torch 2.11
        hint = symbolic_shapes.size_hint  # type: ignore[attr-defined]
    return int(hint(value))


# Whether autocast is on for any device type: the C function itself, with no
# Python frame around it (``linear`` asks on every call); where torch lacks it,
# always ``True``, so that callers take their general path.
any_autocast_enabled: Callable[[], bool] = getattr(
    torch._C, "_is_any_autocast_enabled", lambda: True
)


def mha_packed_projection(mha: nn.MultiheadAttention) -> bool:
    """Whether ``mha`` keeps query, key and value projections in one packed
    ``in_proj_weight`` (same embedding size for all three) rather than three."""
    packed: bool = mha._qkv_same_embed_dim
    return packed


def cpp_python_bindings() -> Any:
    """Inductor's C++ code cache that compiles a C++ source into a function
    callable from Python (``CppPythonBindingsCodeCache``), imported on use."""
    from torch._inductor.codecache import CppPythonBindingsCodeCache

    return CppPythonBindingsCodeCache


def fsdp_unsharded_parameters(module: nn.Module) -> dict[int, nn.Parameter]:
    """FSDP2's stand-ins: ``id(unsharded) -> sharded`` for every parameter that
    ``fully_shard`` manages in ``module``'s tree and has gathered (while a
    sharded block runs, its module attributes hold the unsharded parameter,
    which ``named_parameters()`` of an enclosing module does not list)."""
    found: dict[int, nn.Parameter] = {}
    for sub in module.modules():
        get_state = getattr(sub, "_get_fsdp_state", None)
        for group in _fsdp_param_groups(get_state()) if get_state is not None else ():
            for fsdp_param in group.fsdp_params:
                unsharded = getattr(fsdp_param, "_unsharded_param", None)
                if unsharded is not None:
                    found[id(unsharded)] = fsdp_param.sharded_param
    return found


def _fsdp_param_groups(state: Any) -> list[Any]:
    """An FSDP2 state's parameter groups: a list since torch 2.12 (one module
    may hold several), a single attribute (or ``None``) in 2.11."""
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is not None:
        return list(groups)
    group = state._fsdp_param_group  # torch 2.11
    return [] if group is None else [group]


# The scaled FP8 GEMM ``scale_a * scale_b * (a @ b)`` of FP8 operands (``a``
# row-major, ``b`` column-major); torch has no public name for it yet.
scaled_mm: Callable[..., Tensor] = torch._scaled_mm


def onednn_enabled() -> bool:
    """Whether CPU ops may use oneDNN (``torch.backends.mkldnn.enabled``, read
    without the Python property, which a custom op's body cannot assign)."""
    enabled: bool = torch._C._get_mkldnn_enabled()
    return enabled


def set_onednn_enabled(enabled: bool) -> None:
    """Let CPU ops use oneDNN, or not (process-wide, as the public flag)."""
    torch._C._set_mkldnn_enabled(enabled)


# The ``__torch_function__`` of a tensor subclass that handles everything in
# ``__torch_dispatch__`` (as torch's own wrapper subclasses do).
disabled_torch_function: Any = torch._C._disabled_torch_function_impl


# ``torch.distributed.GradBucket`` (a DDP communication hook's argument),
# imported from where type checkers see it; None in a torch built without
# distributed support.
try:
    from torch._C._distributed_c10d import GradBucket
except ImportError:  # pragma: no cover - every Linux wheel has distributed
    GradBucket = None  # type: ignore[assignment,misc]


def drop_state_dict_hooks(module: nn.Module, package: str) -> int:
    """Remove from ``module`` (itself, not its children) the state-dict and
    load-state-dict hooks defined in ``package``'s modules; returns how many.
    torch keeps them in private dicts (a load pre-hook wrapped in
    ``_WrappedHook``, whose ``hook`` is the function)."""
    removed = 0
    for hooks in (module._state_dict_hooks, module._load_state_dict_pre_hooks):
        for key, hook in list(hooks.items()):
            function = getattr(hook, "hook", hook)
            if getattr(function, "__module__", "").startswith(package + "."):
                del hooks[key]
                removed += 1
    return removed


# torch's foreach operators, one kernel launch for a list of tensors (what the
# foreach path of its optimizers runs); public in all but name.
foreach_add: Callable[..., Any] = torch._foreach_add
foreach_add_: Callable[..., None] = torch._foreach_add_
foreach_addcdiv_: Callable[..., None] = torch._foreach_addcdiv_
foreach_addcmul_: Callable[..., None] = torch._foreach_addcmul_
foreach_div_: Callable[..., None] = torch._foreach_div_
foreach_lerp_: Callable[..., None] = torch._foreach_lerp_
foreach_maximum_: Callable[..., None] = torch._foreach_maximum_
foreach_mul_: Callable[..., None] = torch._foreach_mul_
foreach_neg: Callable[..., Any] = torch._foreach_neg
foreach_sqrt: Callable[..., Any] = torch._foreach_sqrt


def foreach_kernel_devices() -> list[str]:
    """The device types with foreach kernels (where torch's optimizers default
    to their foreach path)."""
    from torch.utils._foreach_utils import _get_foreach_kernels_supported_devices

    devices: list[str] = _get_foreach_kernels_supported_devices()
    return devices


def adam_init_group(
    optimizer: torch.optim.Optimizer, group: dict[str, Any], *lists: list[Tensor]
) -> bool:
    """``torch.optim.Adam._init_group``: creates the state of ``group``'s
    parameters that have a gradient on their first step and appends parameters,
    gradients, ``exp_avg``, ``exp_avg_sq``, ``max_exp_avg_sq`` (amsgrad) and
    ``step`` to the six ``lists``; whether any parameter is complex."""
    has_complex: bool = optimizer._init_group(group, *lists)  # type: ignore[attr-defined]
    return has_complex


def graph_capture_health_check(optimizer: torch.optim.Optimizer) -> None:
    """The check torch's Adam runs first in ``step``: raises if a CUDA (or XPU)
    graph is being captured and a group is not ``capturable``."""
    optimizer._accelerator_graph_capture_health_check()


def unhooked_optimizer_step(step: Callable[..., Any]) -> Callable[..., Any]:
    """An optimizer class's ``step`` function (a bound method's too) without the
    wrapper that torch's ``Optimizer.__init__`` puts around the ``step`` of each
    class it sees (marked ``hooked``; it runs the step hooks). A subclass whose
    ``step`` calls its base's through that wrapper would run the hooks twice."""
    function = getattr(step, "__func__", step)
    unwrapped: Callable[..., Any] = inspect.unwrap(
        function, stop=lambda f: not getattr(f, "hooked", False)
    )
    return unwrapped
