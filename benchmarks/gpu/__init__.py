"""One command for a lent GPU: ``python -m benchmarks.gpu`` (issue 26, item 5).

Three sections, each written to ``--out`` (JSON and markdown) as soon as it
ends, then ``docs/results/gpu.md`` and every target with met / not met:

* ``--zoo`` (:mod:`.zoo`): ``unit_scale``, ``track_scales`` and
  ``simulate_fp8`` on every fast zoo model, on the GPU against the CPU: output
  and parameter gradients within 1e-4, reports equal, nothing on stderr;
* ``--fp8`` (:mod:`.fp8`): real FP8's SQNRs and a short FP8-vs-bf16 run;
* ``--speed`` (:mod:`.speed`): ``benchmarks/float8_gpu.py``'s FP8 tables and
  u-μP against SP in bf16 at widths 256–2048, eager and compiled.

Sized for a lent machine's 15 minutes (its start included, a rerun must fit):
the whole run keeps within ``--budget`` seconds (270 by default), shared by
the sections, and prints each section's time. Without CUDA it says so and
exits 0; ``--cpu-check`` runs the same code on tiny shapes with the CPU
standing in for the GPU (as ``tests/test_benchmarks.py`` does)::

    PYTHONPATH=src python -m benchmarks.gpu --out out/gpu
    PYTHONPATH=src python -m benchmarks.gpu --speed --out out/gpu
    PYTHONPATH=src python -m benchmarks.gpu --cpu-check --out /tmp/gpu-check

On a machine whose files do not come back (a lent one returns only its
output folder), pass that folder as ``--out`` and copy ``gpu.md`` from it to
``docs/results/gpu.md``; ``--commit`` names the commit where ``git`` cannot.
"""
