"""HeteroAda-FedSemi (Xu et al., "Enhancing Federated Learning with Server-Side Unlabeled Data
by Adaptive Client and Data Selection", Sec. 4, Algorithms 1 and 3, Eqs. 19-25): Ada-FedSemi,
both agents unchanged, whose selected clients train prefix sub-models H^d of a multi-exit model
(`models.vgg.VGG9Exits`), as deep as their estimated speed allows.

    init: Ada-FedSemi's, plus a one-off profiling at k = 0: every client's compute speed and
          bandwidth from its full-model times (Eqs. 24-25)
    each round k (`round`, one compiled program; every client runs the full model, masked to
    its depth):
      select    Ada-FedSemi's selection; t_hat_m, the full-model time each selected client
                would need (Eq. 23); Alg. 3 clusters those times into depths d_m, the slowest
                cluster training H^1 and the fastest the full model H^L
      clients   tau SGD steps on sum_{b <= d_m} f^b (Eq. 22) from the broadcast w_k; the
                parameters of parts b > d_m are masked out of every update (momentum and
                weight decay included), so they leave the client as they came
      server    layer-wise aggregation: part b is the N_m-weighted mean over the clients with
                d_m >= b (its old value when none), then Ada-FedSemi's server phase, where the
                teacher's final exit labels the pool, the server epoch trains on the sum of the
                exit losses and validation reads the final exit; t_k = max t_{k,m}(d_m) +
                t_p |D_{k,U}|, b_k = sum_m 2 size_{d_m}; the selected clients' estimates are
                renewed from the times they report (Eqs. 24-25), the others keep theirs

The state is `HeteroAdaState`: Ada-FedSemi's `AdaState` and the estimates psi_hat, gamma_hat.
Semi-HFL, the paper's baseline for it, is this round with a static depth rule (`semi_hfl`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from fedjax_semi.algorithms.ada_fedsemi import AdaFedSemi
from fedjax_semi.algorithms.ada_state import PARTS, AdaPlan, AdaState, AdaUpload
from fedjax_semi.algorithms.base import RoundShared, register
from fedjax_semi.algorithms.hetero_ada_config import HeteroAdaConfig
from fedjax_semi.data.federated import FederatedData, RoleTable, TrainView
from fedjax_semi.engine.keys import DROPOUT, HETERO_KMEANS, SAMPLE, round_key
from fedjax_semi.engine.pytrees import PyTree, ordered_pytree
from fedjax_semi.engine.train import cross_entropy, masked_mean
from fedjax_semi.errors import bad
from fedjax_semi.kernels import depths
from fedjax_semi.models.vgg import NUM_PARTS, VGG9Exits, exit_parts
from fedjax_semi.models.zoo import Model
from fedjax_semi.systems import tx2


@ordered_pytree(
    "round", "w", "sim_time", "agent_c.bandit", "agent_c.arm", "labels.a", "spent.cost", "done",
    "gamma_hat", "labels.ready", "agent_p.bandit", "agent_p.arm", "psi_hat", "switched",
    "w_tilde", "spent.traffic_gb", "u_prev", "spent.wait_count", "spent.wait_sum", "labels.y_hat",
    parts=PARTS,
)  # fmt: skip
@dataclasses.dataclass(frozen=True)
class HeteroAdaState(AdaState):
    """Ada-FedSemi's state (`AdaState`: round, sim_time, w, w_tilde, labels, agents, u_prev,
    spent, switched, done) and each client's latest estimates of Eqs. 24-25:
    psi_hat float32 [M] its compute speed (load per second), gamma_hat float32 [M] its
    bandwidth (bytes per second). Its leaves flatten in the order of the reference results
    (`engine.pytrees.ordered_pytree`)."""

    psi_hat: jax.Array
    gamma_hat: jax.Array


@struct.dataclass
class DepthTable:
    """select -> client_update, one row per client [M]: its id, labeled table and depth d_m
    (int32; 0: not selected this round)."""

    id: jax.Array
    table: RoleTable
    depth: jax.Array


@dataclasses.dataclass(frozen=True)
class ExitsObjective:
    """Eq. 22: sum_b e_b f^b, f^b the mean cross-entropy of exit b on the batch; exit_on float
    [L] (e_b: 1 for b <= d_m; None: every exit). `model` returns every exit, [L, B, Q]."""

    model: Model
    exit_on: Any = None

    def __call__(
        self,
        params: PyTree,
        model_state: dict[str, Any],
        batch: dict,
        rng: jax.Array,
        anchor: PyTree,
        pl_on: jax.Array | bool,
    ) -> tuple[jax.Array, tuple[dict[str, Any], dict[str, jax.Array]]]:
        variables = {"params": params, **model_state}
        logits, new_state = self.model.apply(variables, batch["x"], train=True, rng=rng)
        valid = batch["valid"] & (batch["y"] >= 0)
        per_exit = jax.vmap(lambda lg: masked_mean(cross_entropy(lg, batch["y"]), valid))(logits)
        on = jnp.ones_like(per_exit) if self.exit_on is None else jnp.asarray(self.exit_on)
        return jnp.sum(on * per_exit), (new_state, {"pl_rate": jnp.zeros(())})


def masked_updates(keep: PyTree) -> optax.GradientTransformation:
    """Zero the update of every leaf whose `keep` (a bool per leaf, traced) is False: chained
    after the optimizer, the parts a client does not train stay exactly as broadcast, whatever
    momentum or weight decay would do (the paper's sub-model H^d has no
    parts > d at all)."""

    def update(updates, state, params=None):
        return jax.tree.map(lambda u, k: jnp.where(k, u, jnp.zeros_like(u)), updates, keep), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


@dataclasses.dataclass
class HeteroAdaFedSemi(AdaFedSemi):
    """static_depths: the Semi-HFL baseline's rule instead of Alg. 3 (see `semi_hfl`)."""

    cfg: HeteroAdaConfig
    name: str = "hetero_ada"
    static_depths: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        c, module = self.cfg, self.model.module
        if not isinstance(module, VGG9Exits):
            raise bad("model.name", self.model.name, f"vgg9_exits for algorithm {self.name}")
        if self.tx2 is None:
            raise bad(
                "systems.name",
                self.systems.name,
                f"tx2 for algorithm {self.name} (Eqs. 23-25 read the clients' reported times)",
            )
        self.num_parts = NUM_PARTS
        if len(c.part_bytes) != NUM_PARTS:
            raise bad("algorithm.part_bytes", c.part_bytes, f"{NUM_PARTS} sizes, one a sub-model")
        # Training sees every exit; evaluation, pseudo-labels and the per-client test use the
        # registry's model, whose output is the final exit.
        self.exits_model = dataclasses.replace(
            self.model, module=module.clone(output="all", detach=c.detach_between_parts)
        )
        self.parts = exit_parts(self.template["params"])
        self.objective = ExitsObjective(self.exits_model)
        final = tuple(float(b == NUM_PARTS) for b in range(1, NUM_PARTS + 1))
        self.server_objective = ExitsObjective(
            self.exits_model, None if c.server_exit_losses == "all" else final
        )
        # Table 9's constants: Pi_b = tau load_b (training load), Omega_b = directions size_b.
        self.pi = c.local_steps * jnp.asarray(c.part_loads, jnp.float32)
        self.omega = c.traffic_directions * jnp.asarray(c.part_bytes, jnp.float32)

    # ------------------------------------------------------------------ state

    def init(self, key: jax.Array, fed: FederatedData) -> HeteroAdaState:
        """Ada-FedSemi's state and each client's profiled estimates psi_hat, gamma_hat [M]: a
        one-off benchmark of the full model before round 1 (Eqs. 24-25 need a k = 0 time);
        static_depths: at its mean bandwidth (a nominal profile, never renewed)."""
        base = super().init(key, fed)
        full = jnp.full((self.num_clients,), NUM_PARTS)
        t_cp, t_cm = self._times(key, jnp.int32(0), full, mean_bandwidth=self.static_depths)
        psi, gamma = depths.capability(self.pi[-1], self.omega[-1], t_cp, t_cm)
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
        return HeteroAdaState(**fields, psi_hat=psi, gamma_hat=gamma)

    def _times(self, key, r, depth, mean_bandwidth: bool = False):
        """(t^cp, t^cm) [M] of the TX2 clients training the sub-models H^depth (depth [M])."""
        c, d = self.cfg, jnp.clip(depth, 1, NUM_PARTS) - 1
        load = jnp.asarray(c.part_loads, jnp.float32)
        size = jnp.asarray(c.part_bytes, jnp.float32)[d]
        return tx2.client_times(
            self.tx2, key, r, self.num_clients, load[d] / load[-1], size, c.traffic_directions,
            mean_bandwidth,
        )  # fmt: skip

    def client_times(
        self, plan: AdaPlan, key: jax.Array, r: jax.Array
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Each client's (t^cp, t^cm) for its sub-model H^{d_m} and its bytes [M] (Table 9)."""
        t_cp, t_cm = self._times(key, r, plan.depth)
        size = jnp.asarray(self.cfg.part_bytes, jnp.float32)[jnp.clip(plan.depth, 1) - 1]
        return t_cp, t_cm, size

    # ------------------------------------------------------------------ one round

    def select(
        self, state: HeteroAdaState, data: TrainView, key: jax.Array
    ) -> tuple[AdaPlan, DepthTable, RoundShared]:
        """Ada-FedSemi's selection, then Alg. 3: the estimated full-model times (Eq. 23) of the
        selected clients clustered into their depths d_m (static_depths: split into equal
        groups by their nominal times)."""
        c = self.cfg
        plan, rows, shared = super().select(state, data, key)
        t_hat = depths.full_model_time(self.pi[-1], self.omega[-1], state.psi_hat, state.gamma_hat)
        if self.static_depths:
            depth = depths.quantile_depths(t_hat, plan.sel, NUM_PARTS)
        else:
            depth = depths.assign_depths(
                round_key(key, HETERO_KMEANS, state.round + 1), t_hat, plan.sel, NUM_PARTS,
                c.kmeans_restarts, c.kmeans_max_iter, c.min_rel_gap,
            )  # fmt: skip
        rows = DepthTable(rows.id, rows.table, depth)
        return plan.replace(depth=depth), rows, shared

    def client_update(self, row: DepthTable, shared: RoundShared) -> AdaUpload:
        """tau steps on the exits b <= d_m (Eq. 22), parts b > d_m masked out of the update."""
        eta = self.lr_at(shared.round + 1)
        on = jnp.arange(1, NUM_PARTS + 1) <= row.depth  # e_{m,b}, bool [L]
        keep = jax.tree.map(lambda b: on[b - 1], self.parts)
        tx = optax.chain(self._tx(eta), masked_updates(keep))
        objective = dataclasses.replace(self.objective, exit_on=on.astype(jnp.float32))
        w, _, stats = self.train_client(
            shared.models, row.table, shared, row.id, SAMPLE, DROPOUT, tx=tx, objective=objective
        )
        return AdaUpload(w=w, weight=row.table.count.astype(jnp.float32), stats=stats)

    def aggregate(self, state: HeteroAdaState, plan: AdaPlan, up: AdaUpload) -> PyTree:
        """Layer-wise aggregation (Sec. 4.2): part b over the clients with d_m >= b."""
        w = state.w
        params = depths.layerwise_mean(
            up.w["params"], up.weight, plan.depth, self.parts, w["params"]
        )
        return {**w, "params": params}

    def server_update(
        self, state: HeteroAdaState, plan: AdaPlan, up: AdaUpload, key: jax.Array
    ) -> tuple[HeteroAdaState, dict]:
        """Ada-FedSemi's server update with the layer-wise aggregation, then Eqs. 24-25: the
        selected clients' estimates renewed; the depths in the metrics."""
        new, metrics = super().server_update(state, plan, up, key)
        if not self.static_depths:  # Semi-HFL keeps its one profile
            # Eqs. 24-25 from the times the selected clients report (the same draws as the
            # round's clock); the others keep their last one (nothing newer), and an ended run
            # keeps them all.
            t_cp, t_cm, _ = self.client_times(plan, key, state.round + 1)
            d = jnp.clip(plan.depth, 1, NUM_PARTS) - 1
            psi, gamma = depths.capability(self.pi[d], self.omega[d], t_cp, t_cm)
            renew = plan.sel & ~state.done
            new = new.replace(
                psi_hat=jnp.where(renew, psi, state.psi_hat),
                gamma_hat=jnp.where(renew, gamma, state.gamma_hat),
            )
        metrics["depth"] = plan.depth
        for b in range(1, NUM_PARTS + 1):
            metrics[f"n_depth{b}"] = jnp.sum(plan.depth == b).astype(jnp.int32)
        return new, metrics


@register("hetero_ada", HeteroAdaConfig)
def hetero_ada(cfg: HeteroAdaConfig, **kw: Any) -> HeteroAdaFedSemi:
    return HeteroAdaFedSemi(cfg, **kw)


@register("semi_hfl", HeteroAdaConfig)
def semi_hfl(cfg: HeteroAdaConfig, **kw: Any) -> HeteroAdaFedSemi:
    """Semi-HFL, the baseline of Sec. 5.8 (Figs. 16-17; the authors' modification for
    server-side unlabeled data): HeteroAda-FedSemi's multi-exit clients, layer-wise
    aggregation and P-agent, but each client's depth from a static heuristic (a nominal
    full-model time profiled once before round 1, at its first mode and its group's mean
    bandwidth, never renewed; the selected clients split into equal groups by it) and a fixed
    pseudo-label threshold C (fixed_c)."""
    if cfg.adaptive_c:
        raise bad("algorithm.adaptive_c", True, "false for algorithm semi_hfl (C fixed)")
    return HeteroAdaFedSemi(cfg, name="semi_hfl", static_depths=True, **kw)
