"""The passes of ``unit_scale``: one module per stage of the graph pass
(``graph_pass.UnitScalingPass`` runs them in order on each captured graph),
with the parameters' initialisation and u-μP tags, the report, and the record a
checkpoint keeps. Builds on the capture engine (``_capture``) only."""
