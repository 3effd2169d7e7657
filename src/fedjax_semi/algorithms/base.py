"""The algorithm interface, the federated state, and the registry.

A round is three pure, jittable phases, so the engine can compile it as one program or run the
reference backend (a Python loop of per-client jitted calls) on the same code:

    cohort, inputs, shared = alg.prepare(state, data)        # server: select, gather
    outputs = map over clients: alg.client_update(input_i, shared)
    state, metrics = alg.finish(state, cohort, outputs)      # server: aggregate, scatter
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Protocol

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_semi.data.federated import FederatedData, TrainView

PyTree = Any
Mapper = Callable[..., PyTree]  # mapper(fn, xs, *shared) -> stacked outputs


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


class Algorithm(Protocol):
    name: str
    roles: tuple[str, ...]
    oracle: bool  # reads the labels of unlabeled data (fully supervised references only)
    has_global_model: bool

    def init(self, fed: FederatedData) -> FLState: ...

    def prepare(self, state: FLState, data: TrainView) -> tuple[jax.Array, PyTree, PyTree]: ...

    def client_update(self, inputs: PyTree, shared: PyTree) -> PyTree: ...

    def finish(
        self, state: FLState, cohort: jax.Array, outputs: PyTree
    ) -> tuple[FLState, dict]: ...

    def evaluate(self, state: FLState, fed: FederatedData, mapper: Mapper) -> dict: ...


class Capabilities:
    """The optional parts of a round, declared by every method (the engine never probes for
    them). The defaults are a method without them; a method that has one overrides it.

    has_warmup: `warmup(state, data, mapper)` runs once before round 1.
    round_flags(t): hashable per-round switches of round t, compiled as static arguments.
    client_update_for(flags): the client function of a round with those switches.
    """

    has_warmup: ClassVar[bool] = False

    def warmup(self, state: FLState, data: TrainView, mapper: Mapper) -> FLState:
        raise NotImplementedError(f"{type(self).__name__} declares no warm-up")

    def round_flags(self, t: int) -> tuple:
        return ()

    def client_update_for(self, flags: tuple) -> Callable[[PyTree, PyTree], PyTree]:
        return self.client_update  # type: ignore[attr-defined]


def _client_finite(stacked) -> jax.Array:
    """bool [S]: every leaf of each client's tree is finite."""
    per_leaf = [
        jnp.all(jnp.isfinite(a.reshape(a.shape[0], -1)), axis=1) for a in jax.tree.leaves(stacked)
    ]
    return jnp.all(jnp.stack(per_leaf), axis=0)


def cohort_metrics(cohort: jax.Array, out: dict, models) -> dict:
    """The per-round metrics every algorithm reports: the cohort, each client's loss and
    finiteness (for the NaN guard), the step-weighted mean training loss and mean step count."""
    steps = out["steps"].astype(jnp.float32)
    return {
        "cohort": cohort,
        "client_loss": out["loss"],
        "client_finite": _client_finite(models) & jnp.isfinite(out["loss"]),
        "train_loss": jnp.sum(out["loss"] * steps) / jnp.maximum(jnp.sum(steps), 1.0),
        "local_steps": jnp.mean(steps),
    }


def client_accuracy(result: dict) -> tuple[jax.Array, jax.Array]:
    """Per-client accuracy [C] from summed `correct` / `count` [C], and its mean over the
    clients that hold any example (clients with none count neither way)."""
    has = result["count"] > 0
    acc = result["correct"] / jnp.maximum(result["count"], 1)
    return acc, jnp.sum(jnp.where(has, acc, 0.0)) / jnp.maximum(jnp.sum(has), 1)


ALGORITHMS: dict[str, Callable[..., Algorithm]] = {}


def register(name: str):
    def deco(factory):
        ALGORITHMS[name] = factory
        return factory

    return deco


def algorithm_names() -> list[str]:
    return sorted(ALGORITHMS)


def make_algorithm(name: str, **kwargs) -> Algorithm:
    if name not in ALGORITHMS:
        raise ValueError(f"algorithm.name={name!r} is not allowed: one of {algorithm_names()}")
    return ALGORITHMS[name](**kwargs)


@contextlib.contextmanager
def seeded(alg: Any, seed: int | None = None, key: jax.Array | None = None) -> Iterator[Any]:
    """Run `alg` as if it had been built with another seed, for the block.

    Every random draw of an algorithm derives from `alg.seed_key` (and, on the host at `init`,
    from `alg.seed`), read when a method runs or is traced. `seed` swaps both (host-side init);
    `key` swaps the key alone, and may be a tracer: that is how one compiled round maps a
    leading replica axis of seeds (engine/simulate.py `Runner`, `replicas`)."""
    saved = alg.seed, alg.seed_key
    if seed is not None:
        alg.seed, alg.seed_key = seed, jax.random.PRNGKey(seed)
    if key is not None:
        alg.seed_key = key
    try:
        yield alg
    finally:
        alg.seed, alg.seed_key = saved


def sample_cohort(alg: Any, rnd: jax.Array) -> jax.Array:
    """Round `rnd`'s cohort of `alg`: `select_cohort` with the algorithm's seed, sizes and
    `cfg.cohort_sampler`. int32 [S]."""
    from fedjax_semi.engine.clients import select_cohort

    n, s, sampler = alg.num_clients, alg.clients_per_round, alg.cfg.cohort_sampler
    return select_cohort(alg.seed_key, rnd, n, s, sampler)
