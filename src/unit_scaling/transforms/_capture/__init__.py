"""The capture engine every transform shares.

``engine`` applies a :class:`~.engine.Transform` to a module and runs it: it
copies the module, prepares the copy (``library``: layers TorchDynamo cannot see
into rewritten as the functions they compute), captures each forward with
TorchDynamo (``dynamo``, the one module that touches Dynamo's internals), runs
the transforms' graph passes on every captured graph and executes the result,
recording how to replay it without Dynamo (``replay``). Beside it: FX helpers
(``graph``), the functions transforms insert into graphs (``targets``), the
functions every transform keeps whole while tracing (``opaque``), the functions
that only observe a tensor, kept out of the passes' sight (``observers``: a
monitor's hooks), and the record of every step that failed and fell back
(``fallbacks``).

Nothing here imports a pass package (``_unit``, ``_tracking``) or an entry point.
"""
