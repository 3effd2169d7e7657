"""CoFED's heterogeneous model pool: 2- and 3-conv-layer CNNs that differ in their filters.

CoFED (Cao et al.) gives each participant its own randomly generated CNN (its Sec. 5.1; Table 1
lists 10 of the 100). The simulator runs clients with equal filters as one group: one stacked
variable tree ``[Cg, ...]`` and one ``jax.vmap(model.apply)`` per group, the groups one after
another; per-group outputs go back to client order with :func:`scatter_rows`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_semi.errors import bad
from fedjax_semi.models.layers import Conv, Dropout, max_pool
from fedjax_semi.models.zoo import Model

Array = jax.Array
Filters = tuple[int, ...]

# CoFED's Table 1 (its Sec. 5.1): the filters of each 3x3 conv layer of Models 1-10.
TABLE1: tuple[Filters, ...] = (
    (24, 40),
    (24, 32, 56),
    (20, 32),
    (24, 40, 56),
    (20, 32, 80),
    (24, 32, 80),
    (32, 32),
    (40, 56),
    (32, 48),
    (48, 56, 96),
)
# The paper does not say how its 100 architectures were drawn; these grids span Table 1's values.
_C1 = (20, 24, 32, 40, 48)
_C2 = (32, 40, 48, 56)
_C3 = (56, 64, 80, 96)

POOLS = ("table1", "random_cnn", "single")


class FilterCNN(nn.Module):
    """``[Conv(c, 3x3, SAME) -> ReLU -> 2x2 max-pool]`` per ``c`` in ``filters``, then
    flatten -> Dropout -> Dense(num_classes).

    Table 1 gives only the filters (CoFED Sec. 5.1); padding, pooling and head are our
    choice. Init: He-normal conv kernels, Glorot-uniform dense kernel, zero biases.
    Parameters on ``[H, W, Cin]``: ``9 * cin * c + c`` per conv layer and
    ``(H // 2**d) * (W // 2**d) * filters[-1] * K + K`` for the dense (``d = len(filters)``).
    """

    num_classes: int
    filters: Filters
    conv_impl: str = "im2col"
    dropout: float = 0.0

    @nn.compact
    def __call__(self, x: Array, train: bool = False, mc: bool = False) -> Array:
        """x ``[B, H, W, C]`` float -> logits ``[B, num_classes]``."""
        for c in self.filters:
            conv = Conv(
                c, (3, 3), "SAME", impl=self.conv_impl, kernel_init=nn.initializers.he_normal()
            )
            x = max_pool(nn.relu(conv(x)), 2)
        x = Dropout(self.dropout)(x.reshape((x.shape[0], -1)), active=train or mc)
        return nn.Dense(self.num_classes, kernel_init=nn.initializers.xavier_uniform())(x)


def random_filters(seed: int, n: int) -> tuple[Filters, ...]:
    """``n`` random architectures, deterministic in ``seed`` (numpy ``default_rng``).

    Depth 2 or 3 (uniform, as CoFED Sec. 5.1 says "2-layer or 3-layer"); ``c1`` from
    ``{20, 24, 32, 40, 48}``, ``c2`` from ``{32, 40, 48, 56}`` restricted to ``c2 >= c1``
    (never empty), ``c3`` from ``{56, 64, 80, 96}``.
    """
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        depth = int(rng.integers(2, 4))
        c1 = int(rng.choice(_C1))
        c2 = int(rng.choice([c for c in _C2 if c >= c1]))
        filters = (c1, c2, int(rng.choice(_C3))) if depth == 3 else (c1, c2)
        out.append(filters)
    return tuple(out)


def pool_filters(
    pool: str,
    num_clients: int,
    seed: int,
    single: Filters = (24, 40, 56),
    table1_models: int = len(TABLE1),
) -> tuple[tuple[Filters, ...], np.ndarray]:
    """The distinct architectures of a pool and each client's one.

    * ``"table1"``: Table 1's Models 1-``table1_models`` (default all 10) round-robin, client
      ``i`` -> model ``i % table1_models`` (only the first ``num_clients`` form groups when
      there are fewer clients). Fewer models mean fewer, wider groups: fewer programs to
      compile, wider vmaps.
    * ``"random_cnn"``: one :func:`random_filters` draw per client; clients that drew equal
      filters share a group (groups in order of first appearance).
    * ``"single"``: every client has ``single`` (default Table 1's Model 4, the one shared
      architecture that the personalized FedAvg comparison needs, CoFED Sec. 5.8).

    Returns:
        ``(groups, assign)``: ``groups[g]`` the filters of group ``g``; ``assign`` int32
        ``[num_clients]`` the group of each client.

    Raises:
        ConfigError: naming ``algorithm.model_pool`` for an unknown ``pool``.
    """
    if pool == "table1":
        if not 1 <= table1_models <= len(TABLE1):
            raise bad("algorithm.table1_models", table1_models, f"an integer in [1, {len(TABLE1)}]")
        groups = TABLE1[: min(num_clients, table1_models)]
        return groups, (np.arange(num_clients) % table1_models).astype(np.int32)
    if pool == "single":
        return (tuple(single),), np.zeros(num_clients, np.int32)
    if pool == "random_cnn":
        drawn = random_filters(seed, num_clients)
        index: dict[Filters, int] = {}
        assign = np.array([index.setdefault(f, len(index)) for f in drawn], np.int32)
        return tuple(index), assign
    raise bad("algorithm.model_pool", pool, f"one of {list(POOLS)}")


def make_pool_models(
    base: Model, groups: Sequence[Filters], num_classes: int | None = None
) -> list[Model]:
    """One :class:`Model` per filter tuple: ``base``'s input spec and normalization with a
    :class:`FilterCNN` (``base``'s conv impl, no dropout, no BatchNorm), named ``cnn24-40``;
    ``num_classes`` outputs (default ``base``'s)."""
    impl = getattr(base.module, "conv_impl", "im2col")
    k = base.num_classes if num_classes is None else num_classes
    return [
        dataclasses.replace(
            base,
            name=f"cnn{'-'.join(map(str, f))}",
            num_classes=k,
            module=FilterCNN(k, tuple(f), conv_impl=impl, dropout=0.0),
            has_batch_stats=False,
            has_dropout=False,
        )
        for f in groups
    ]


def group_members(assign: np.ndarray, n_groups: int) -> tuple[np.ndarray, ...]:
    """Client ids (sorted, int32) of each group ``0 .. n_groups - 1``."""
    assign = np.asarray(assign)
    return tuple(np.flatnonzero(assign == g).astype(np.int32) for g in range(n_groups))


def init_groups(
    models: Sequence[Model], keys: Array, members: Sequence[np.ndarray]
) -> list[dict[str, Any]]:
    """Stacked variables ``[Cg, ...]`` of each group (one jitted, vmapped init per group),
    client ``i`` initialized with ``keys[i]`` (keys ``[C]``), so a client's variables do not
    depend on the grouping (equal to ``models[g].init(keys[i])`` up to float32 rounding)."""
    pairs = zip(models, gather_rows(keys, members), strict=True)
    return [jax.jit(jax.vmap(m.init))(k) for m, k in pairs]


def gather_rows(x: Any, members: Sequence[np.ndarray]) -> list[Any]:
    """``x [C, ...]`` -> each group's rows ``[Cg, ...]`` (the inverse of :func:`scatter_rows`)."""
    return [x[np.asarray(ids)] for ids in members]


def scatter_rows(per_group: Sequence[Any], members: Sequence[np.ndarray]) -> Any:
    """Each group's rows ``[Cg, ...]`` -> ``[C, ...]`` in client order.

    ``members`` must cover ``0 .. C - 1`` once each (as :func:`group_members` does). NumPy in,
    NumPy out; any jax array in, jax array out.
    """
    order = np.concatenate([np.asarray(ids, np.int64) for ids in members])
    if not np.array_equal(np.sort(order), np.arange(order.size)):
        raise ValueError(f"members must cover clients 0..{order.size - 1} once each")
    xp = np if all(isinstance(p, np.ndarray) for p in per_group) else jnp
    return xp.concatenate(list(per_group), axis=0)[np.argsort(order)]
