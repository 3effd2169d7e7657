"""What the engine knows of a method's state: its round counter and its simulated clock.

Each method keeps its own typed state (a flax.struct dataclass with fields named like its
paper's symbols: SCAFFOLD's x, c, c_i; FedAvg's w, w_k); the engine reads only these two fields
(the loop counts rounds and reports the clock) and otherwise treats a state as a pytree
(checkpoints, replicas, the NaN guard's last good state).
"""

from __future__ import annotations

from typing import Protocol

import jax


class State(Protocol):
    """round: int32 [] rounds completed (with replicas: [R]); sim_time: float32 [] the
    simulated clock in seconds (systems models advance it; 0 where a method keeps none)."""

    round: jax.Array
    sim_time: jax.Array
