"""The application: the ``unit-scaling`` command line (:mod:`.cli`), its demo
(:mod:`.demo`), report (:mod:`.report`) and hyperparameter search
(:mod:`.sweep`), the training loop they share (:mod:`.training`) and the
plain-torch baseline model (:mod:`.baseline`).

Built on the library (:mod:`unit_scaling` and its analysis views); nothing in
the library imports it.
"""
