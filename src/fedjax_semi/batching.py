"""Whether the code being traced runs under a vmap over clients (or replicas).

A leaf module (it imports nothing from the package): the engine sets the flag where it maps
clients (`engine.clients.map_clients`), and code that has a faster form for one client than for a
batch of clients reads it while tracing: a helper-model map (`engine.clients.map_within_client`)
and the convolution (`models.layers.Conv` with impl "auto").
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

# True while tracing under a vmap over clients or replicas. A loop (chunk=1, the reference loop)
# keeps the enclosing value.
_BATCHED = contextvars.ContextVar("batched", default=False)


def clients_batched() -> bool:
    """True while tracing inside a vmap over clients or replicas."""
    return _BATCHED.get()


@contextlib.contextmanager
def batched(flag: bool) -> Iterator[None]:
    """Trace the body as batched over clients when `flag` (or when already batched)."""
    token = _BATCHED.set(_BATCHED.get() or flag)
    try:
        yield
    finally:
        _BATCHED.reset(token)
