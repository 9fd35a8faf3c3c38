"""Pins on the private torch APIs of ``unit_scaling._torch_internals``: each
test names the API it checks and fails on the torch upgrade that moves or
changes it. (Dynamo's internals are pinned in
``tests/transforms/test_dynamo_internals.py``.)"""

from __future__ import annotations

import re
import subprocess
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.fx import GraphModule

from tests.helpers import BreaksInsideANestedCall, compiled_grad, in_place_function
from unit_scaling import _torch_internals as internals


def test_pytree_flattens_and_rebuilds() -> None:
    tree = {"a": [torch.ones(1), 2], "b": (torch.zeros(2),)}
    leaves, spec = internals.pytree.tree_flatten(tree)
    assert len(leaves) == 3
    rebuilt = internals.pytree.tree_unflatten(leaves, spec)
    assert rebuilt["a"][1] == 2 and torch.equal(rebuilt["b"][0], torch.zeros(2))
    doubled = internals.pytree.tree_map_only(Tensor, lambda t: t * 2, tree)
    assert torch.equal(doubled["a"][0], torch.full((1,), 2.0))


def test_dispatch_mode_sees_and_replaces_aten_ops() -> None:
    seen = []

    class Mode(internals.TorchDispatchMode):  # type: ignore[misc]
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            seen.append(func)
            if func is torch.ops.aten.mm.default:
                return args[0].new_zeros(args[0].shape[0], args[1].shape[1])
            return func(*args, **(kwargs or {}))

    with Mode():
        out = torch.ones(2, 3) @ torch.ones(3, 4)
    assert torch.ops.aten.mm.default in seen and not out.any()


def test_size_types_are_int_or_tuple_aliases() -> None:
    for alias, n in (
        (internals.size_1_t, 1),
        (internals.size_2_t, 2),
        (internals.size_3_t, 3),
    ):
        assert int in alias.__args__, alias
        assert tuple[(int,) * n] in alias.__args__, alias


def test_module_bases_are_torchs_own() -> None:
    assert issubclass(nn.BatchNorm1d, internals.BatchNormBase)
    assert issubclass(nn.BatchNorm3d, internals.BatchNormBase)
    assert issubclass(nn.InstanceNorm2d, internals.InstanceNormBase)
    assert issubclass(nn.Conv2d, internals.ConvNdBase)
    assert issubclass(nn.ConvTranspose1d, internals.ConvNdBase)
    assert not issubclass(nn.Linear, internals.ConvNdBase)


def test_op_overload_types() -> None:
    assert isinstance(torch.ops.aten.add.Tensor, internals.OpOverload)
    assert isinstance(torch.ops.aten.add, internals.OpOverloadPacket)
    assert not isinstance(torch.add, internals.OpOverload)


def test_unsafe_view_reshapes_without_recording_a_view() -> None:
    x = torch.arange(6.0)
    y = internals.unsafe_view(x, (2, 3))
    assert y.shape == (2, 3) and y.data_ptr() == x.data_ptr()
    assert not y._is_view()  # what makes in-place updates of the result legal
    assert x.view(2, 3)._is_view()


def test_functorch_state_queries() -> None:
    seen = {}

    def probe(t: Tensor) -> Tensor:
        seen["active"] = internals.functorch_transforms_active()
        seen["wrapped"] = internals.is_functorch_wrapped_tensor(t)
        return t

    torch.vmap(probe)(torch.ones(3, 2))
    assert seen == {"active": True, "wrapped": True}
    assert not internals.functorch_transforms_active()
    assert not internals.is_functorch_wrapped_tensor(torch.ones(2))


def test_any_autocast_enabled_is_the_c_query() -> None:
    assert internals.any_autocast_enabled is torch._C._is_any_autocast_enabled
    assert not internals.any_autocast_enabled()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert internals.any_autocast_enabled()


def test_mha_packed_projection() -> None:
    assert internals.mha_packed_projection(nn.MultiheadAttention(8, 2))
    assert not internals.mha_packed_projection(nn.MultiheadAttention(8, 2, kdim=4))


def test_cpp_python_bindings_has_load_pybinding() -> None:
    # The whole round trip is tested in tests/test_kernels.py.
    assert callable(internals.cpp_python_bindings().load_pybinding)


def test_grad_bucket_is_the_public_class() -> None:
    assert internals.GradBucket is torch.distributed.GradBucket


def test_fsdp_state_exposes_each_parameter_pair() -> None:
    # FSDPModule._get_fsdp_state()._fsdp_param_groups (torch >= 2.12; 2.11: the
    # single _fsdp_param_group), each group's fsdp_params with sharded_param and
    # _unsharded_param (the whole path is exercised with real process groups in
    # tests/parallel/test_transformed.py).
    import inspect

    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_state

    assert callable(FSDPModule._get_fsdp_state)
    state_source = inspect.getsource(_fsdp_state.FSDPState.__init__)
    assert "self._fsdp_param_group" in state_source  # or _fsdp_param_groups
    # A state before fully_shard: no groups, read where this torch keeps them.
    assert internals._fsdp_param_groups(_fsdp_state.FSDPState()) == []
    source = inspect.getsource(_fsdp_param.FSDPParam)
    assert "self.sharded_param = " in source
    assert "self._unsharded_param = " in source
    assert internals.fsdp_unsharded_parameters(nn.Linear(2, 2)) == {}


def test_scaled_mm_is_the_fp8_gemm() -> None:
    a = torch.randn(16, 32).to(torch.float8_e4m3fn)
    b = torch.randn(16, 32).to(torch.float8_e4m3fn)
    two, one = torch.tensor(2.0), torch.tensor(1.0)
    out = internals.scaled_mm(
        a, b.t(), scale_a=two, scale_b=one, out_dtype=torch.float32
    )
    torch.testing.assert_close(out, 2 * a.float() @ b.float().t())


def test_onednn_flag_is_the_public_one() -> None:
    before = torch.backends.mkldnn.enabled
    try:
        internals.set_onednn_enabled(False)
        assert torch.backends.mkldnn.enabled is False
        assert internals.onednn_enabled() is False
        internals.set_onednn_enabled(True)
        assert torch.backends.mkldnn.enabled is True
    finally:
        torch.backends.mkldnn.enabled = before


def test_disabled_torch_function_is_torchs() -> None:
    assert internals.disabled_torch_function is torch._C._disabled_torch_function_impl


def test_state_dict_hooks_of_a_package_are_dropped() -> None:
    from unit_scaling._torch_internals import drop_state_dict_hooks

    def ours(*args: object) -> None:
        raise AssertionError("dropped hooks must not run")

    def theirs(*args: object) -> None:
        calls.append(1)

    calls: list[int] = []
    ours.__module__ = theirs.__module__ = "unit_scaling.somewhere"
    module = nn.Linear(2, 2)
    module.register_state_dict_post_hook(ours)  # type: ignore[no-untyped-call]
    module.register_load_state_dict_pre_hook(ours)  # type: ignore[no-untyped-call]
    theirs.__module__ = "elsewhere"
    module.register_state_dict_post_hook(theirs)  # type: ignore[no-untyped-call]
    assert drop_state_dict_hooks(module, "unit_scaling") == 2
    module.load_state_dict(module.state_dict())
    assert calls == [1]


def test_foreach_operators_update_each_tensor() -> None:
    xs = [torch.ones(2), torch.full((3,), 4.0)]
    internals.foreach_mul_(xs, [2.0, 0.5])  # one scalar per tensor
    internals.foreach_add_(xs, 1.0)
    assert [x.tolist() for x in xs] == [[3.0, 3.0], [3.0, 3.0, 3.0]]
    assert [x.tolist() for x in internals.foreach_sqrt([torch.tensor([9.0])])] == [
        [3.0]
    ]
    assert "cuda" in internals.foreach_kernel_devices()


def test_adam_init_group_creates_state_and_fills_the_lists() -> None:
    p = nn.Parameter(torch.ones(3))
    p.grad = torch.ones(3)
    opt = torch.optim.Adam([p], amsgrad=True)
    lists: tuple[list[Tensor], ...] = ([], [], [], [], [], [])
    assert internals.adam_init_group(opt, opt.param_groups[0], *lists) is False
    assert set(opt.state[p]) == {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"}
    params, grads, exp_avgs, exp_avg_sqs, max_sqs, steps = lists
    assert params == [p] and grads[0] is p.grad
    assert exp_avgs[0] is opt.state[p]["exp_avg"]
    assert exp_avg_sqs[0] is opt.state[p]["exp_avg_sq"]
    assert max_sqs[0] is opt.state[p]["max_exp_avg_sq"]
    assert steps[0] is opt.state[p]["step"] and steps[0].is_cpu
    internals.graph_capture_health_check(opt)  # nothing is being captured


def test_unhooked_optimizer_step_skips_the_hook_wrapper() -> None:
    p = nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([p], lr=1.0)
    assert getattr(torch.optim.SGD.step, "hooked", False)  # torch wrapped it
    step = internals.unhooked_optimizer_step(opt.step)
    assert not getattr(step, "hooked", False)
    seen = []
    opt.register_step_pre_hook(lambda *_: seen.append("hook"))
    p.grad = torch.ones(1)
    step(opt)
    assert seen == [] and p.item() == 0.0
    opt.step()
    assert seen == ["hook"]


# --------------------------------------------------------------------------- #
# The supported torch versions: the import guard and the per-version flags.
# --------------------------------------------------------------------------- #


def _check_quietly(version: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "__version__", version)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        internals.check_torch_version()


@pytest.mark.parametrize("version", ["2.10.2+cu128", "2.1.0", "1.13.1"])
def test_a_torch_below_the_floor_is_refused(
    version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch, "__version__", version)
    with pytest.raises(
        ImportError, match=rf"torch >= 2\.11.*torch {re.escape(version)} is"
    ):
        internals.check_torch_version()


@pytest.mark.parametrize("version", ["2.11.0+cu130", "2.13.0+cpu", "2.15.1"])
def test_a_tested_torch_passes_silently(
    version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _check_quietly(version, monkeypatch)


@pytest.mark.parametrize("version", ["2.16.0.dev20261201+cpu", "3.0.0", "unknown"])
def test_an_untested_torch_warns_once(
    version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    internals._warn_untested.cache_clear()
    monkeypatch.setattr(torch, "__version__", version)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        internals.check_torch_version()
        internals.check_torch_version()
    assert [w.category for w in caught] == [UserWarning]
    message = str(caught[0].message)
    assert f"torch {version} is installed" in message
    assert "tested with torch 2.11 to 2.15" in message


def test_importing_the_package_runs_the_check() -> None:
    # Before any other module: an old torch gets the guard's message, not an
    # AttributeError from whichever module first touches a missing API.
    code = "import torch; torch.__version__ = '2.10.0'; import unit_scaling"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: unit_scaling needs torch >= 2.11"), last


def test_torch_version_is_the_installed_release() -> None:
    major, minor = torch.__version__.split(".")[:2]
    assert internals.torch_version() == (int(major), int(minor))


def test_the_compiled_function_flag_matches_dynamo() -> None:
    # Where the flag is set, Dynamo's graph of a torch Function whose output is
    # made in place silently drops its gradient (zeros); where not, it keeps it.
    # Fails on a torch whose behaviour and flag disagree.
    grad = compiled_grad(in_place_function(torch.autograd.Function))
    dropped = torch.equal(grad, torch.zeros(3))
    assert dropped or torch.equal(grad, torch.full((3,), 2.0)), grad
    assert internals.COMPILED_FUNCTION_OUTPUTS_NEED_FRESH_TENSORS is dropped


def test_the_nested_graph_breaks_flag_matches_dynamo() -> None:
    # Where the flag is unset, Dynamo resumes a frame after a graph break inside
    # a nested call with its locals mixed up; where set, it resumes it right.
    # Fails on a torch whose behaviour and flag disagree.
    layer = BreaksInsideANestedCall()
    x = torch.randn(2, 4)
    expected = layer(x)
    torch._dynamo.reset()
    try:
        with torch._dynamo.config.patch(nested_graph_breaks=True):
            works = torch.equal(torch.compile(layer, backend="eager")(x), expected)
    except torch._dynamo.exc.TorchDynamoException:
        works = False
    finally:
        torch._dynamo.reset()
    assert internals.NESTED_GRAPH_BREAKS_WORK is works


def test_the_data_swap_flag_matches_dynamo() -> None:
    # Where the flag is unset, Dynamo goes on running a module's graph after one
    # of its parameters got new data of another shape in place; where set, it
    # recompiles. Fails on a torch whose behaviour and flag disagree.
    model = nn.Sequential(nn.Embedding(4, 3))
    ids = torch.tensor([0, 1, 2])
    graphs: list[GraphModule] = []

    def backend(gm: GraphModule, example_inputs: Sequence[Any]) -> Any:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, backend=backend)
        compiled(ids)
        model[0].weight.data = torch.randn(6, 3)
        compiled(ids)
    finally:
        torch._dynamo.reset()
    assert internals.PARAMETER_DATA_SWAPS_RECOMPILE is (len(graphs) == 2), graphs


def test_the_lanczos_flag_matches_interpolate() -> None:
    try:
        F.interpolate(torch.randn(1, 1, 8, 8), size=4, mode="lanczos", antialias=True)
        has_lanczos = True
    except (ValueError, NotImplementedError):  # torch 2.11: an unknown mode
        has_lanczos = False
    assert internals.INTERPOLATE_HAS_LANCZOS is has_lanczos


def test_node_replacements_calls_the_hook_per_user_given_another_node() -> None:
    # GraphModule._register_replace_node_hook / _unregister_replace_node_hook
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    a = graph.call_function(torch.relu, (x,))
    b = graph.call_function(torch.neg, (a,))
    c = graph.call_function(torch.exp, (a,))
    graph.output((b, c))
    gm = GraphModule(nn.Module(), graph)
    seen: list[tuple[str, str, str]] = []
    with internals.node_replacements(
        gm, lambda old, new, user: seen.append((old.name, new, user.name))
    ):
        with graph.inserting_after(a):
            s = graph.call_function(torch.sigmoid, (a,))
        a.replace_all_uses_with(s, delete_user_cb=lambda user: user is not s)
        c.replace_input_with(s, x)
    b.replace_input_with(s, x)  # (after the block: not seen)
    assert seen == [
        ("relu", "sigmoid", "neg"),
        ("relu", "sigmoid", "exp"),
        ("sigmoid", "x", "exp"),
    ]


def test_is_fake_tensor_tells_dynamos_stand_ins() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = torch.ones(2)
    assert internals.is_fake_tensor(fake)
    assert not internals.is_fake_tensor(torch.ones(2))
    assert not internals.is_fake_tensor(None)
