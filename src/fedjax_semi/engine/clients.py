"""The client axis: chunked mapping, gather/scatter of a cohort, and `Clients`, the mapper a
method's round receives.

Three ways to map a per-client function over a leading client axis, which must agree numerically:
  * `map_clients(fn, xs, chunk=k)` inside jit: `lax.map(..., batch_size=k)`, a vmap over chunks of
    k clients run one after another (small k bounds memory and suits the CPU); k = 1 is a plain
    loop, traced unbatched, whatever the number of clients (one included);
  * `map_clients(fn, xs, chunk="all")`: one vmap over every client (GPU);
  * `LoopMapper`: the reference backend, a Python loop of per-client jitted calls.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from fedjax_semi.batching import batched, clients_batched
from fedjax_semi.engine.keys import SELECT, round_key
from fedjax_semi.engine.pytrees import PyTree


def map_within_client(fn: Callable, *xs: PyTree) -> PyTree:
    """fn over the leading axis of xs inside one client's work (e.g. its helper models).

    A loop when nothing around it is batched (CPU, chunk=1, the reference loop): under a vmap
    both branches of a cond run, so blocks past a client's data would be computed anyway.
    Otherwise a vmap. The two agree numerically."""
    if clients_batched():
        return jax.vmap(fn)(*xs)
    return jax.lax.map(lambda x: fn(*x), xs)


def map_clients(fn: Callable, xs: PyTree, *shared: Any, chunk: int | str = "all") -> PyTree:
    """fn(x_i, *shared) for every i of the leading axis of xs, inside a jit."""
    n = jax.tree.leaves(xs)[0].shape[0]
    if chunk == 1:
        # A plain loop, also over one client (or one replica: a one-job group of the vectorized
        # launcher): no batch-of-one vmap, so every op keeps its unbatched form and a client's
        # steps past its own data are skipped, not computed and discarded.
        return jax.lax.map(lambda x: fn(x, *shared), xs)
    if chunk == "all" or chunk >= n:
        with batched(True):
            return jax.vmap(fn, in_axes=(0,) + (None,) * len(shared))(xs, *shared)
    with batched(True):
        return jax.lax.map(lambda x: fn(x, *shared), xs, batch_size=int(chunk))


def map_groups(mapper: Callable, fn: Callable | tuple, xs: PyTree, *shared: Any) -> PyTree:
    """`mapper(fn, xs, *shared)`, or for a method with heterogeneous models (clients grouped by
    architecture, e.g. CoFED) one mapping per group: fn and xs are then tuples of the groups'
    client functions and inputs [Cg, ...], and the result is the tuple of the groups' outputs."""
    if isinstance(fn, tuple):
        return tuple(mapper(f, x, *shared) for f, x in zip(fn, xs, strict=True))
    return mapper(fn, xs, *shared)


class LoopMapper:
    """Reference backend: a Python loop over clients, each a call of one jitted function."""

    def __init__(self) -> None:
        self._jitted: dict[Callable, Callable] = {}

    def __call__(self, fn: Callable, xs: PyTree, *shared: Any) -> PyTree:
        jfn = self._jitted.setdefault(fn, jax.jit(fn))
        n = jax.tree.leaves(xs)[0].shape[0]
        outs = [jfn(jax.tree.map(lambda a, i=i: a[i], xs), *shared) for i in range(n)]
        return jax.tree.map(lambda *a: jnp.stack(a), *outs)


def _same(tree: PyTree) -> PyTree:
    return tree


class Clients:
    """The engine's mapper, the `clients` of a method's `round(state, data, key, clients, flags)`.

    clients.map(fn, rows, *shared): fn(row_i, *shared) for every row of the leading axis of
        `rows` (one per client), stacked: chunked `lax.map`/`vmap` inside the round's jit
        (`map_clients`), with the rows and outputs sharded over the client mesh when there are
        several devices; in the reference backend a Python loop of per-client jitted calls.
    clients.map_groups(fns, rows, *shared): the same per architecture group, where fns and rows
        are tuples (heterogeneous models), or one mapping where they are not.
    clients.server(fn): fn as the backend runs server code: itself inside the jitted round;
        jitted on its own in the reference backend (so a server phase compiles as it does in
        the jitted round and returns its inputs without copying them).
    A `Clients` is also callable as `clients(fn, rows, *shared)` (the same as `map`), the form
    warm-ups and evaluations take."""

    def __init__(
        self,
        mapper: Callable,
        place: Callable[[PyTree], PyTree] = _same,
        jit_server: bool = False,
    ) -> None:
        self._mapper, self._place, self._jit_server = mapper, place, jit_server
        self._server: dict[Callable, Callable] = {}

    @classmethod
    def jitted(cls, chunk: int | str, place: Callable[[PyTree], PyTree] = _same) -> Clients:
        """Inside one jitted round: chunks of `chunk` clients, rows placed by `place`."""
        return cls(functools.partial(map_clients, chunk=chunk), place)

    @classmethod
    def reference(cls) -> Clients:
        """The reference backend: a loop of per-client jitted calls, server steps jitted alone."""
        return cls(LoopMapper(), jit_server=True)

    def map(self, fn: Callable, rows: PyTree, *shared: Any) -> PyTree:
        return self._place(self._mapper(fn, self._place(rows), *shared))

    __call__ = map

    def map_groups(self, fn: Callable | tuple, rows: PyTree, *shared: Any) -> PyTree:
        return map_groups(self.map, fn, rows, *shared)

    def server(self, fn: Callable) -> Callable:
        if not self._jit_server:
            return fn
        if fn not in self._server:
            self._server[fn] = jit_forwarding_inputs(fn)
        return self._server[fn]


def jit_forwarding_inputs(fn: Callable) -> Callable:
    """jax.jit(fn), except that outputs which are inputs returned unchanged come back as the input
    arrays themselves. A jitted call writes every output to a fresh buffer: the reference
    backend's `prepare` returns the whole dataset in `shared`, a 4.7 GB copy a round at 100,000
    clients of the MNIST 2NN benchmark workload that a real per-client loop would never
    make. (Inside one jitted round XLA forwards such values by itself.)"""
    cache: dict = {}

    def call(*args):
        flat, tree = jax.tree.flatten(args)
        sig = (tree, tuple((jnp.shape(a), jnp.result_type(a)) for a in flat))
        if sig not in cache:
            closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
            position = {id(v): i for i, v in enumerate(closed.jaxpr.invars)}
            forwarded = [position.get(id(v)) for v in closed.jaxpr.outvars]

            def computed(*flat_args):
                outs = jax.tree.leaves(fn(*jax.tree.unflatten(tree, flat_args)))
                return [o for o, f in zip(outs, forwarded, strict=True) if f is None]

            cache[sig] = jax.jit(computed), forwarded, jax.tree.structure(out_shape)
        jitted, forwarded, out_tree = cache[sig]
        rest = iter(jitted(*flat))
        outs = [next(rest) if f is None else flat[f] for f in forwarded]
        return jax.tree.unflatten(out_tree, outs)

    return call


def gather(tree: PyTree, ids: jax.Array) -> PyTree:
    """Rows `ids` of every leaf of a client-stacked tree: [C, ...] -> [S, ...]."""
    return jax.tree.map(lambda a: a[ids], tree)


def scatter(tree: PyTree, ids: jax.Array, rows: PyTree) -> PyTree:
    """Write the cohort's rows back: tree[ids] = rows."""
    return jax.tree.map(lambda a, r: a.at[ids].set(r), tree, rows)


def broadcast(tree: PyTree, n: int) -> PyTree:
    """Stack n copies of a tree on a new leading axis."""
    return jax.tree.map(lambda a: jnp.broadcast_to(a, (n,) + a.shape), tree)


# cohort_sampler="auto" keeps the permutation draw up to this population (the cohorts every
# result so far was made with) and switches to Floyd's draw above it.
PERMUTATION_MAX_CLIENTS = 1000
COHORT_SAMPLERS = ("auto", "permutation", "floyd")


def select_cohort(
    seed_key: jax.Array, rnd: jax.Array, num_clients: int, size: int, sampler: str = "auto"
) -> jax.Array:
    """Uniform sample of `size` client ids without replacement, sorted: int32 [S].

    sampler: "permutation" (jax.random.choice: a random permutation of all N ids, O(N log N)
    work a round), "floyd" (`floyd_sample`: O(S^2), nothing of size N, so a round costs the same
    at 100 or 100,000 clients), or "auto" (permutation up to PERMUTATION_MAX_CLIENTS, else floyd).
    Both are uniform over S-subsets; they draw different cohorts from the same key."""
    key = round_key(seed_key, SELECT, rnd)
    if sampler == "auto":
        sampler = "permutation" if num_clients <= PERMUTATION_MAX_CLIENTS else "floyd"
    if sampler == "permutation":
        ids = jax.random.choice(key, num_clients, (size,), replace=False)
    elif sampler == "floyd":
        ids = floyd_sample(key, num_clients, size)
    else:
        raise ValueError(f"cohort sampler {sampler!r} is not one of {COHORT_SAMPLERS}")
    return jnp.sort(ids).astype(jnp.int32)


def floyd_draws(key: jax.Array, n: int, size: int) -> jax.Array:
    """Floyd's draws: t_i uniform in [0, n - size + i], int32 [size]."""
    highs = n - size + jnp.arange(size) + 1
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(size))
    return jax.vmap(lambda k, h: jax.random.randint(k, (), 0, h))(keys, highs).astype(jnp.int32)


def floyd_sample(key: jax.Array, n: int, size: int) -> jax.Array:
    """`size` distinct ids of range(n), uniform over subsets (R. Floyd's algorithm): for
    j = n - size, ..., n - 1 draw t in [0, j] and take t, or j when t is taken already.
    O(size^2) compares and no array of size n. int32 [size], in draw order."""
    draws = floyd_draws(key, n, size)

    def step(i, chosen):
        t, j = draws[i], n - size + i
        return chosen.at[i].set(jnp.where(jnp.any(chosen == t), j, t))

    return jax.lax.fori_loop(0, size, step, jnp.full((size,), -1, jnp.int32))
