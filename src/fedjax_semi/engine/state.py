"""The federated state every method carries from round to round."""

from __future__ import annotations

from typing import Any

import jax
from flax import struct

PyTree = Any


@struct.dataclass
class FLState:
    """Federated state. Client-stacked leaves lead with [C] (the whole population).

    round: int32 [] rounds completed.
    global_vars: the server model's variables ({'params', maybe 'batch_stats'}).
    client_vars: [C]-stacked variables of clients with personal leaves, or {}.
    client_opt: [C]-stacked optimizer states when they persist across rounds, or {}.
    sim_time: float32 [] simulated clock in seconds (systems models advance it).
    extra: method-specific state.
    """

    round: jax.Array
    global_vars: PyTree
    client_vars: PyTree
    client_opt: PyTree
    sim_time: jax.Array
    extra: PyTree
