"""The plotting dependencies are optional: ``unit_scaling.analysis`` imports
without them, its torch-only views work, and the functions that need matplotlib
or pandas raise an ImportError that says how to install them."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# Runs in a fresh interpreter where matplotlib and pandas cannot be imported.
_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.modules["matplotlib"] = None
    sys.modules["pandas"] = None
    import torch
    import unit_scaling as uu
    import unit_scaling.analysis as analysis
    from unit_scaling.analysis import scales_graph
    graph = scales_graph(uu.TransformerDecoder(32, 256, layers=1, heads=2))
    print("nodes", sum(1 for n in graph.nodes if "metrics" in n.meta) > 0)
    calls = {
        "plot": lambda: analysis.plot(graph),
        "graph_to_dataframe": lambda: analysis.graph_to_dataframe(graph),
        "coord_check": lambda: analysis.coord_check(None, [64]),
        "visualiser": lambda: analysis.visualiser(None),
    }
    for name, call in calls.items():
        try:
            call()
        except ImportError as error:
            print(name, "ImportError", "torch-unit-scaling[plot]" in str(error))
    """
)


def test_analysis_imports_without_the_plot_extra() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:5] == [
        "nodes True",
        "plot ImportError True",
        "graph_to_dataframe ImportError True",
        "coord_check ImportError True",
        "visualiser ImportError True",
    ]


def test_core_package_never_needs_the_extra() -> None:
    code = (
        "import sys\n"
        "sys.modules['matplotlib'] = sys.modules['pandas'] = None\n"
        "import unit_scaling, unit_scaling.transforms, unit_scaling.utils\n"
        "import torch\n"
        "print(unit_scaling.utils.analyse_module(unit_scaling.Linear(4, 4),"
        " torch.randn(2, 4)).splitlines()[0])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("def forward(")
