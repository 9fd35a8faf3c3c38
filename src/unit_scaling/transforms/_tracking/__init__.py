"""The passes of ``track_scales``: observers after every floating-point node
(``graph_pass``), the statistics they compute on device (``statistics``) and
the :class:`Metrics` derived from them (``metrics``), the scales graph read back
from them (``scales_graph``), inputs that require grad (``input_grads``) and
the pruning of a scales graph (``pruning``). Builds on the capture engine
(``_capture``) only."""
