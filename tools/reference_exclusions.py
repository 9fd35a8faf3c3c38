"""The tests of ``unit-scaling`` 0.3.5's own suite that ``make test-reference``
does not run, one by one, each with its reason and the section of
``docs/from-unit-scaling.md`` that explains it.

Keep this list short: a test goes here only if it needs the network, tests a
private module of that library, or pins a divergence the page documents. A
listed test that the suite no longer has fails the run (the list is stale).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Reason = Literal["needs network", "private module of theirs", "documented divergence"]

PAGE = "docs/from-unit-scaling.md"
_FORMATS = f"{PAGE}#number-formats-unit_scalingformats"
_FUNCTIONS = f"{PAGE}#functions-unit_scalingfunctional"
_MODULES = f"{PAGE}#modules-unit_scaling"
_TRANSFORMS = f"{PAGE}#transforms-unit_scalingtransforms"
_ANALYSIS = f"{PAGE}#analysis-unit_scalinganalysis-and-unit_scalingutils"
_SUITE = f"{PAGE}#that-librarys-test-suite"


@dataclass(frozen=True)
class Exclusion:
    """One test of the reference suite that is not run, and why.

    Attributes:
        test: its node id under their ``tests/`` folder,
            e.g. ``"test_functional.py::test_dropout"``.
        reason: why it is not run.
        see: the section of ``docs/from-unit-scaling.md`` that says why,
            ``"docs/from-unit-scaling.md#<anchor>"``.
        detail: what in the test is at odds with this package, in a line.
    """

    test: str
    reason: Reason
    see: str
    detail: str


EXCLUDED = (
    Exclusion(
        "test_formats.py::test_fp_format",
        "documented divergence",
        _FORMATS,
        "pins FPFormat(2, 1).min_absolute_normal == 0.5, one binade below IEEE",
    ),
    Exclusion(
        "test_formats.py::test_fp_format_bwd",
        "documented divergence",
        _FORMATS,
        "pins the values FPFormat(2, 1) rounds to, from its non-IEEE subnormals",
    ),
    Exclusion(
        "test_functional.py::test_dropout",
        "documented divergence",
        _FUNCTIONS,
        "expects dropout(x, 0.5, inplace=True) to raise ValueError",
    ),
    Exclusion(
        "test_modules.py::test_dropout",
        "documented divergence",
        _MODULES,
        "expects Dropout(0.5, inplace=True) to raise ValueError",
    ),
    Exclusion(
        "transforms/test_track_scales.py::test_prune_non_float_tensors",
        "documented divergence",
        _TRANSFORMS,
        "pins parameters' clean_name to Dynamo's self_modules_linear_parameters_bias",
    ),
    Exclusion(
        "transforms/test_track_scales.py::test_prune_same_scale_tensors",
        "documented divergence",
        _TRANSFORMS,
        "pins parameters' clean_name to Dynamo's self_modules_emb_parameters_weight",
    ),
    Exclusion(
        "test_utils.py::test_analyse_mlp",
        "documented divergence",
        _ANALYSIS,
        "pins analyse_module's text as torch.fx code of that library's MLP",
    ),
    Exclusion(
        "test_utils.py::test_analyse_mhsa",
        "documented divergence",
        _ANALYSIS,
        "pins analyse_module's text and that library's MHSA ops (einops)",
    ),
    Exclusion(
        "test_analysis.py::test_example_batch",
        "documented divergence",
        _ANALYSIS,
        "downloads a tokenizer and calls example_batch(tokenizer, batch, seq)",
    ),
    Exclusion(
        "test_analysis.py::test_visualiser",
        "documented divergence",
        _ANALYSIS,
        "downloads a tokenizer and calls visualiser(model, tokenizer=...)",
    ),
    Exclusion(
        "test_analysis.py::test_create_batch",
        "needs network",
        _SUITE,
        "downloads a tokenizer; also calls the private _create_batch",
    ),
    Exclusion(
        "test_analysis.py::test_example_seqs",
        "private module of theirs",
        _SUITE,
        "tests the private analysis._example_seqs (its text source)",
    ),
    *(
        Exclusion(
            f"test_docs.py::{name}",
            "private module of theirs",
            _SUITE,
            "tests the private docs._validate (its docstring decorator)",
        )
        for name in (
            "test_validate_no_args",
            "test_validate_positional_args",
            "test_validate_positional_kwargs",
            "test_validate_invalid_arg",
            "test_validate_no_default_arg",
        )
    ),
)

# Names in that library's modules that this package does not have: the test
# files import them from a stub (which fails the test that uses one), so that
# the file's other tests still run. ``None``: the whole module.
PRIVATE: dict[str, frozenset[str] | None] = {
    "unit_scaling.docs": None,
    "unit_scaling.analysis": frozenset({"_create_batch", "_example_seqs"}),
}
