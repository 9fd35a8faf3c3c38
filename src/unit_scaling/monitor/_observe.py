"""How a monitor observes a module's output where TorchDynamo traces its hook.

Under ``torch.compile``, and while a transform (``unit_scale``, ``track_scales``,
``simulate_fp8``...) captures a model's forward, a module's forward hook is
traced, not run. There the hook calls :func:`observe_activation` with its
site (a string naming the monitor and the module). ``torch.compile`` traces into
it: the recording flag it reads becomes a guard (a graph for recording steps,
one for the others). A transform records it as one node of the captured graph
(``transforms._capture.observers``) after the value the transformed graph uses,
and it runs when the graph runs: it reads the flag then, so the graph does not
depend on it, and, the graph running eagerly, hooks the activation's gradient.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Protocol

from torch import Tensor

from .._torch_internals import is_fake_tensor
from ..transforms._capture.observers import register_observer

__all__ = ["add_site", "observe_activation"]


class Observing(Protocol):
    """What a site records into: a monitor."""

    def observe(self, name: str, tensor: Tensor) -> None: ...


# Site -> (a weak reference to its monitor, the module's name). Weak: a
# captured graph may outlive its monitor.
_SITES: dict[str, tuple[weakref.ref[Observing], str]] = {}
_COUNT = itertools.count()


def add_site(monitor: Observing, name: str) -> str:
    """A new site for ``monitor.observe(name, tensor)``: the key a traced hook
    passes to :func:`observe_activation`."""
    site = f"{name}@{next(_COUNT)}"
    _SITES[site] = (weakref.ref(monitor, lambda _: _SITES.pop(site, None)), name)
    return site


@register_observer
def observe_activation(tensor: Tensor, site: str) -> None:
    """Record ``tensor`` as the output of the module of ``site`` (nothing on
    the stand-ins TorchDynamo calls it with while it traces, or once its
    monitor is gone)."""
    if is_fake_tensor(tensor):
        return
    entry = _SITES.get(site)
    monitor = entry[0]() if entry is not None else None
    if entry is not None and monitor is not None:
        monitor.observe(entry[1], tensor)
