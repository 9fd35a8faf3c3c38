"""The public API: every name the specification promises exists where it says.

Names are listed here by hand, from the specification, so that removing or
renaming a public name fails loudly instead of silently changing the API.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from collections import Counter
from types import ModuleType

import pytest
from torch import nn

import unit_scaling as uu

TOP_LEVEL = [
    "Linear",
    "LinearReadout",
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "ConvTranspose3d",
    "LayerNorm",
    "RMSNorm",
    "GroupNorm",
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNorm3d",
    "InstanceNorm1d",
    "InstanceNorm2d",
    "InstanceNorm3d",
    "AvgPool1d",
    "AvgPool2d",
    "AvgPool3d",
    "MaxPool1d",
    "MaxPool2d",
    "MaxPool3d",
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "AdaptiveAvgPool3d",
    "AdaptiveMaxPool1d",
    "AdaptiveMaxPool2d",
    "AdaptiveMaxPool3d",
    "Upsample",
    "Embedding",
    "GELU",
    "SiLU",
    "Softmax",
    "Dropout",
    "CrossEntropyLoss",
    "MLP",
    "MHSA",
    "TransformerLayer",
    "DepthModuleList",
    "DepthSequential",
    "TransformerStack",
    "TransformerDecoder",
    "MupType",
    "Parameter",
    "transformer_residual_scaling_rule",
    "__version__",
]
SUBMODULES = {
    "unit_scaling.scale": ["scale_fwd", "scale_bwd"],
    "unit_scaling.constraints": [
        "gmean",
        "hmean",
        "amean",
        "to_output_scale",
        "to_grad_input_scale",
        "to_left_grad_scale",
        "to_right_grad_scale",
        "apply_constraint",
    ],
    "unit_scaling.core.functional": [
        "scale_elementwise",
        "logarithmic_interpolation",
        "rms",
        "transformer_residual_scaling_rule",
    ],
    "unit_scaling.functional": [
        "matmul",
        "linear",
        "linear_readout",
        "conv1d",
        "conv2d",
        "conv3d",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
        "layer_norm",
        "rms_norm",
        "group_norm",
        "batch_norm",
        "instance_norm",
        "avg_pool1d",
        "avg_pool2d",
        "avg_pool3d",
        "max_pool1d",
        "max_pool2d",
        "max_pool3d",
        "adaptive_avg_pool1d",
        "adaptive_avg_pool2d",
        "adaptive_avg_pool3d",
        "adaptive_max_pool1d",
        "adaptive_max_pool2d",
        "adaptive_max_pool3d",
        "interpolate",
        "softcap",
        "index_add",
        "scatter_add",
        "gather",
        "index_select",
        "add",
        "residual_split",
        "residual_add",
        "residual_apply",
        "embedding",
        "dropout",
        "gelu",
        "silu",
        "silu_glu",
        "softmax",
        "scaled_dot_product_attention",
        "cross_entropy",
        "mse_loss",
        "torch_map",
    ],
    "unit_scaling.parameter": [
        "MupType",
        "Parameter",
        "ParameterData",
        "has_parameter_data",
    ],
    "unit_scaling.optim": [
        "lr_scale_for_depth",
        "lr_scale_func_adam",
        "lr_scale_func_sgd",
        "scaled_parameters",
        "SGD",
        "Adam",
        "AdamW",
    ],
}
# The top-level names that are nn.Module classes.
MODULES = TOP_LEVEL[: TOP_LEVEL.index("MupType")]


@pytest.mark.parametrize("name", TOP_LEVEL)
def test_top_level_name_is_public_once(name: str) -> None:
    assert hasattr(uu, name)
    assert Counter(uu.__all__)[name] == 1


@pytest.mark.parametrize("name", MODULES)
def test_top_level_modules_are_nn_modules(name: str) -> None:
    assert issubclass(getattr(uu, name), nn.Module)


def test_all_is_unique_and_resolves() -> None:
    assert len(uu.__all__) == len(set(uu.__all__))
    for name in uu.__all__:
        assert hasattr(uu, name), name


@pytest.mark.parametrize("module_name", sorted(SUBMODULES))
def test_submodule_names(module_name: str) -> None:
    module = importlib.import_module(module_name)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{module_name} has no __all__"
    assert len(exported) == len(set(exported)), f"{module_name}.__all__ repeats names"
    for name in exported:
        assert hasattr(module, name), f"{module_name}.{name} in __all__ but missing"
    for name in SUBMODULES[module_name]:
        assert name in exported, f"{module_name}.{name} not public"


def test_submodules_reachable_as_attributes() -> None:
    for name in ("functional", "optim", "constraints", "scale", "core"):
        assert isinstance(getattr(uu, name), ModuleType), name
    assert isinstance(uu.core.functional, ModuleType)
    import unit_scaling.functional as U

    assert uu.functional is U


def test_top_level_aliases_are_the_same_objects() -> None:
    from unit_scaling import core, parameter

    assert uu.transformer_residual_scaling_rule is (
        core.functional.transformer_residual_scaling_rule
    )
    assert uu.Parameter is parameter.Parameter
    assert uu.MupType is parameter.MupType


def test_version() -> None:
    assert isinstance(uu.__version__, str)
    assert re.fullmatch(r"\d+\.\d+\.\d+([.-]?\w+)*", uu.__version__)
    assert uu.__version__ == importlib.metadata.version("torch-unit-scaling")
