"""Ada-FedSemi: federated learning with server-side unlabeled data and adaptive client and data
selection (Xu et al., "Enhancing Federated Learning with Server-Side Unlabeled Data by Adaptive
Client and Data Selection": Algorithms 1-2, Eqs. 2-18), and its baselines FedSemi-P-C (P and C
fixed) and FedAvg-P (FedSemi-P-1.0: no pseudo-label is ever selected).

    init: w_1; u_{0,C} = acc(w_1; D_V); two Boltzmann agents (r_hat = q0) draw P_1, C_1 (Eq. 18)
    each round k (`round`, one compiled program; every shape is independent of P_k and C_k):
      select    n_k = ceil(P_k M); the first n_k of a random permutation of all M clients are
                selected (Alg. 1 line 4); the others get an empty table, so they train nothing
      clients   tau SGD steps with momentum from the broadcast w_k at eta_k (Eq. 4; stateless)
      server    w_{k+1/2} = sum N_m w_{k,m} / sum N_m over the selected (Eq. 5)
                teacher w~ = gamma w_{k+1/2} + (1 - gamma) w~ (Eq. 12; round 1: w_{1+1/2})
                every R rounds: the teacher labels the pool D_U (Eqs. 2, 6)
                D_{k,U} = {j: a_j > C_k}; w_{k+1} = one SGD epoch of w_{k+1/2} on it (Eq. 7)
                u_P, u_C = acc(w_{k+1/2}; D_V), acc(w_{k+1}; D_V) (decisions only, never training)
                t_k, b_k, Phi_k (Eqs. 8-10); rewards (Eqs. 14-16); agents updated (Eq. 17; the
                C agent only once pseudo-labels exist) and P_{k+1}, C_{k+1} drawn (Eq. 18)

The state is `ada_state.AdaState`. The learning rate eta_k is Eq. 13's, for the clients and the
server alike. Time is simulated: state.sim_time advances by t_k (seconds) and never reads the
wall clock; each client's t_{k,m} is the homogeneous `client_time_s` (Secs. 5.3-5.7) or, with
systems=tx2, a heterogeneous Jetson TX2 (Sec. 5.8), where the waiting ratio (Eq. 34) measures
the stragglers. A spent budget (Eq. 11) stops the run in the run loop (`stop_reason`); alpha can
change once the accuracy reaches a threshold (Figs. 9-10, `alpha_switch_at`). HeteroAda-FedSemi
(hetero_ada.py) extends this class.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from fedjax_semi.algorithms import ada_run
from fedjax_semi.algorithms.ada_fedsemi_config import (
    AdaFedSemiConfig,
    participant_counts,
    read_p_trace,
)
from fedjax_semi.algorithms.ada_pool import confident, pseudo_label, teacher_ema
from fedjax_semi.algorithms.ada_state import AdaPlan, AdaState, AdaUpload, Agent, PoolLabels, Spent
from fedjax_semi.algorithms.base import (
    ClientTable,
    Mapper,
    Method,
    RoundShared,
    client_accuracy,
    cohort_metrics,
    register,
    sanity,
)
from fedjax_semi.data.federated import FederatedData, RoleTable, TrainView
from fedjax_semi.engine import aggregate
from fedjax_semi.engine.clients import Clients
from fedjax_semi.engine.keys import (
    ADA_C_ARM,
    ADA_P_ARM,
    ADA_SELECT,
    ADA_SERVER_DROPOUT,
    ADA_SERVER_SAMPLE,
    DROPOUT,
    INIT,
    SAMPLE,
    client_key,
    round_key,
)
from fedjax_semi.engine.pytrees import PyTree
from fedjax_semi.engine.train import (
    Schedule,
    evaluate_indices,
    evaluate_row,
    local_train,
    make_optimizer,
    table_stats,
)
from fedjax_semi.errors import bad
from fedjax_semi.kernels import ada_schedule
from fedjax_semi.kernels.bandit import BanditState, bandit_init, select_arm, update_arm
from fedjax_semi.systems import ada_cost, tx2, wireless

POOL, VAL = "server_unlabeled", "server_val"  # the ada partition's server sets


# ----------------------------------------------------------------------------- the method


@dataclasses.dataclass
class AdaFedSemi(Method):
    cfg: AdaFedSemiConfig
    name: str = "ada_fedsemi"
    oracle: bool = False
    has_global_model: bool = True
    roles: tuple[str, ...] = ("labeled", "test")
    server_training: bool = True  # false: FedAvg-P (no pool pass, no server epoch)

    def __post_init__(self) -> None:
        super().__post_init__()
        c = self.cfg
        # A fixed P or C is a one-arm grid that is never updated.
        self.p_values = tuple(c.p_arms) if c.adaptive_p else (c.fixed_p,)
        # Table 7's replay of Ada-FedSemi's P_k: the trace's values as the arm grid, and the
        # arm of each round [T] (the last one holds after the trace ends).
        self.p_trace_arms = None
        if c.p_trace_from is not None:
            trace = read_p_trace(c.p_trace_from)
            self.p_values = tuple(sorted(set(trace)))
            self.p_trace_arms = jnp.asarray([self.p_values.index(p) for p in trace], jnp.int32)
        self.c_values = tuple(c.c_arms) if c.adaptive_c else (c.fixed_c,)
        self.n_table = participant_counts(self.p_values, self.num_clients)
        params = wireless.param_count(self.template["params"])
        self.model_bytes = float(c.model_bytes) if c.model_bytes else 4.0 * params
        self.server_schedule = Schedule(c.server_batch, 1, 0)  # one epoch (Eq. 7)
        self.server_objective = self.objective  # CE on the pseudo-labels
        self.global_eval_model = self.model.with_conv("xla")  # forward passes of one model
        self.tx2 = tx2.Tx2System.from_config(self.systems) if self.systems.name == "tx2" else None

    def lr_at(self, rnd: jax.Array) -> jax.Array:
        """eta_k of round k (Eq. 13, round 1 at eta_max; or the constant eta_max)."""
        c = self.cfg
        if c.lr_schedule == "constant":
            return jnp.float32(c.lr)
        return ada_schedule.cosine_restart_lr(rnd, c.lr, c.eta_min, c.lr_restart)

    def _tx(self, eta: jax.Array):
        c = self.cfg  # a fresh optimizer each round: momentum is reset (clients and server)
        return make_optimizer(c.optimizer, eta, c.momentum, c.weight_decay)

    def stop_reason(self, row: dict) -> str | None:
        return ada_run.stop_reason(self.cfg, row)

    def loop_hooks(self) -> list:
        c = self.cfg
        if c.alpha_switch_at is not None and c.alpha_switch_metric == "test":
            return [ada_run.PreferenceSwitch(c.alpha_switch_at)]
        return []

    def _val_acc(self, variables: PyTree, x, y, val) -> jax.Array:
        """Validation accuracy in percentage points (the unit of Eqs. 14-16)."""
        r = evaluate_indices(self.global_eval_model, variables, x, y, val, self.eval_batch)
        return 100.0 * r["accuracy"]

    # ------------------------------------------------------------------ state

    def init(self, key: jax.Array, fed: FederatedData) -> AdaState:
        """w_1, u_{0,C}, fresh agents and their draws of P_1 and C_1 (Eq. 18)."""
        c = self.cfg
        for name, what in ((POOL, "unlabeled pool"), (VAL, "validation set")):
            if name not in fed.server:
                raise bad(
                    "partition.scheme",
                    "(not ada)",
                    f"'ada' for algorithm {self.name} (it needs the server's {what})",
                )
            if fed.server[name].shape[0] == 0:
                knob = "labeled_fraction" if name == POOL else "val_fraction"
                raise bad(f"partition.{knob}", "(empty)", f"a non-empty server {what}")
        w = self.model.init(client_key(key, INIT, 0, 0))
        n_pool = fed.server[POOL].shape[0]
        if c.init_val_acc == "measure":  # our choice: u_{0,C} measured, not Alg. 1's 0
            u0 = self._val_acc(w, fed.x, fed.y, fed.server[VAL])
        else:
            u0 = jnp.float32(0.0)
        p_bandit = bandit_init(len(self.p_values), c.q0)
        c_bandit = bandit_init(len(self.c_values), c.q0)
        zero = jnp.zeros((), jnp.float32)
        return AdaState(
            round=jnp.zeros((), jnp.int32),
            sim_time=jnp.zeros((), jnp.float32),
            w=w,
            w_tilde=w,
            labels=PoolLabels(
                a=jnp.zeros((n_pool,), jnp.float32),
                y_hat=jnp.zeros((n_pool,), jnp.int32),
                ready=jnp.zeros((), bool),
            ),
            agent_p=Agent(p_bandit, self._next_p_arm(key, 0, p_bandit)),  # P_1 (Eq. 18)
            agent_c=Agent(c_bandit, self._next_arm(key, ADA_C_ARM, 0, c_bandit, c.adaptive_c)),
            u_prev=jnp.asarray(u0, jnp.float32),
            spent=Spent(traffic_gb=zero, cost=zero, wait_sum=zero, wait_count=zero),
            switched=jnp.zeros((), bool),
            done=jnp.zeros((), bool),
        )

    def _next_p_arm(self, key, rnd, bandit: BanditState) -> jax.Array:
        """P_{rnd+1}'s arm: the replayed trace's, else the P agent's (Eq. 18) or the fixed P."""
        if self.p_trace_arms is not None:
            return self.p_trace_arms[jnp.minimum(rnd, self.p_trace_arms.shape[0] - 1)]
        return self._next_arm(key, ADA_P_ARM, rnd, bandit, self.cfg.adaptive_p)

    def _next_arm(self, key, purpose: int, rnd, bandit: BanditState, adaptive: bool) -> jax.Array:
        if not adaptive:
            return jnp.zeros((), jnp.int32)
        return select_arm(round_key(key, purpose, rnd), bandit, self.cfg.psi)

    # ------------------------------------------------------------------ one round

    def round(
        self,
        state: AdaState,
        data: TrainView,
        key: jax.Array,
        clients: Clients,
        flags: tuple = (),
    ) -> tuple[AdaState, dict]:
        """One round k of Algorithm 1, top-down: select n_k = ceil(P_k M) clients and send them
        w_k, map the clients (Eq. 4), then the server's update (Eqs. 5-18)."""
        plan, rows, shared = clients.server(self.select)(state, data, key)  # Alg. 1 line 4
        up = clients.map(self.client_update, rows, shared)  # Eq. 4
        return clients.server(self.server_update)(state, plan, up, key)  # Eqs. 5-18

    def select(
        self, state: AdaState, data: TrainView, key: jax.Array
    ) -> tuple[AdaPlan, ClientTable, RoundShared]:
        """Alg. 1 line 4: n_k = ceil(P_k M) clients of all M, as a mask (every client gets a row
        [M], an empty table when not selected), and w_k broadcast to them."""
        m = self.num_clients
        r = state.round + 1
        n = jnp.asarray(self.n_table, jnp.int32)[state.agent_p.arm]
        # n_k of a permutation of all M clients: one compiled round serves every arm.
        perm = jax.random.permutation(round_key(key, ADA_SELECT, r), m)
        rank = jnp.zeros((m,), jnp.int32).at[perm].set(jnp.arange(m, dtype=jnp.int32))
        sel = (rank < n) & ~state.done
        lab = data.roles["labeled"]
        rows = ClientTable(jnp.arange(m), RoleTable(lab.idx, jnp.where(sel, lab.count, 0)))
        shared = RoundShared(state.w, data.x, data.y, state.round, key)
        plan = AdaPlan(sel, n, data.x, data.y, data.server[POOL], data.server[VAL])
        return plan, rows, shared

    def client_update(self, row: ClientTable, shared: RoundShared) -> AdaUpload:
        """Eq. 4: tau SGD steps from w_k at eta_k; the weight N_m of Eq. 5."""
        eta = self.lr_at(shared.round + 1)
        w, _, stats = self.train_client(
            shared.models, row.table, shared, row.id, SAMPLE, DROPOUT, tx=self._tx(eta)
        )
        return AdaUpload(w=w, weight=row.table.count.astype(jnp.float32), stats=stats)

    def aggregate(self, state: AdaState, plan: AdaPlan, up: AdaUpload) -> PyTree:
        """Eq. 5: w_{k+1/2} = sum N_m w_{k,m} / sum N_m over the selected (weight 0 otherwise)."""
        return aggregate.weighted_mean(up.w, up.weight)

    def client_times(
        self, plan: AdaPlan, key: jax.Array, r: jax.Array
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Every client's (t^cp, t^cm) in seconds and the bytes of the model it exchanges this
        round, float32 [M] each: the homogeneous clock (client_time_s, all compute; Sec. 5.3)
        or, with systems=tx2, the TX2 clients training and exchanging the full model."""
        c, m = self.cfg, self.num_clients
        size = jnp.full((m,), self.model_bytes, jnp.float32)
        if self.tx2 is None:
            return jnp.full((m,), c.client_time_s, jnp.float32), jnp.zeros((m,)), size
        t_cp, t_cm = tx2.client_times(self.tx2, key, r, m, 1.0, size, c.traffic_directions)
        return t_cp, t_cm, size

    def label_pool(
        self, labels: PoolLabels, w_tilde: PyTree, plan: AdaPlan, r: jax.Array
    ) -> PoolLabels:
        """Eqs. 2, 6: every R rounds the teacher w~ labels the whole pool; kept in between."""
        relabel = r % self.cfg.relabel_every == 0
        a, y_hat = jax.lax.cond(
            relabel,
            lambda: pseudo_label(
                self.global_eval_model, w_tilde, plan.x, plan.pool, self.eval_batch
            ),
            lambda: (labels.a, labels.y_hat),
        )
        return PoolLabels(a=a, y_hat=y_hat, ready=labels.ready | relabel)

    def server_epoch(
        self,
        w_half: PyTree,
        plan: AdaPlan,
        y_hat: jax.Array,
        mask: jax.Array,
        eta: jax.Array,
        key: jax.Array,
        r: jax.Array,
    ) -> tuple[PyTree, dict]:
        """Eq. 7 as one epoch of mini-batch SGD over D_{k,U} (Eq. 8 charges t_p per sample): the
        selected pool samples first (a table of count n_sel), shuffled by `local_scan`'s epoch
        order; steps past them are skipped, so nothing changes when none is selected."""
        order = jnp.argsort(~mask, stable=True)
        table = RoleTable(plan.pool[order], jnp.sum(mask).astype(jnp.int32))
        tx = self._tx(eta)
        new, _, stats = local_train(
            self.server_objective,
            tx,
            w_half,
            tx.init(w_half["params"]),
            plan.x,
            plan.y,
            table,
            self.server_schedule,
            round_key(key, ADA_SERVER_SAMPLE, r),
            round_key(key, ADA_SERVER_DROPOUT, r),
            extras={"y": y_hat[order]},  # the pseudo-labels, never the hidden labels
        )
        return new, stats

    def server_update(
        self, state: AdaState, plan: AdaPlan, up: AdaUpload, key: jax.Array
    ) -> tuple[AdaState, dict]:
        """Eqs. 5-18 on the server: aggregate, teacher, pseudo-labels, server epoch, validation,
        the round's cost, rewards and agents, P_{k+1} and C_{k+1}; the round's metrics."""
        c = self.cfg
        r = state.round + 1
        eta = self.lr_at(r)
        w_half = self.aggregate(state, plan, up)  # Eq. 5 (HeteroAda: layer-wise)
        w_tilde = teacher_ema(w_half, state.w_tilde, c.gamma, r == 1)  # Eq. 12
        thresh = jnp.asarray(self.c_values, jnp.float32)[state.agent_c.arm]  # C_k
        zero = jnp.zeros((), jnp.float32)
        if self.server_training:
            labels = self.label_pool(state.labels, w_tilde, plan, r)  # Eqs. 2, 6
            mask = confident(labels.a, thresh, labels.ready)  # D_{k,U}
            w_next, sstats = self.server_epoch(w_half, plan, labels.y_hat, mask, eta, key, r)
            server_loss, server_steps = sstats["loss"], sstats["steps"]
        else:  # FedAvg-P: no pseudo-label can pass C = 1.0, so no pool pass at all
            labels = state.labels
            mask = jnp.zeros(plan.pool.shape, bool)
            w_next, server_loss, server_steps = w_half, zero, jnp.zeros((), jnp.int32)
        n_pl = jnp.sum(mask).astype(jnp.int32)

        # Decisions: validation accuracies (D_V never trains), cost, rewards, agents.
        u_p = self._val_acc(w_half, plan.x, plan.y, plan.val)
        u_c = self._val_acc(w_next, plan.x, plan.y, plan.val)
        # The round's clock (Eqs. 8-10, 34) and the cost preference (Figs. 9-10).
        m = self.num_clients
        alpha = jnp.where(state.switched, c.alpha_after, c.alpha).astype(jnp.float32)
        t_cp, t_cm, size = self.client_times(plan, key, r)
        rc = ada_cost.round_cost(
            t_cp + t_cm, plan.sel, n_pl, alpha, size, c.t_p, c.traffic_directions
        )
        wait, waited = ada_cost.waiting_terms(t_cp + t_cm, plan.sel)
        phi = jnp.where(rc.cost > 0, rc.cost, 1.0)  # 0 only once the run is over
        du_p, du_c = ada_schedule.accuracy_changes(u_p, u_c, state.u_prev)  # Eqs. 14-15
        r_p, r_c = ada_schedule.reward(du_p, phi), ada_schedule.reward(du_c, phi)  # Eq. 16
        p_bandit, c_bandit = state.agent_p.bandit, state.agent_c.bandit
        if c.adaptive_p:
            p_bandit = update_arm(p_bandit, state.agent_p.arm, r_p, c.beta)  # Eq. 17
        if c.adaptive_c:  # the C decision had no effect before any pseudo-label
            upd = update_arm(c_bandit, state.agent_c.arm, r_c, c.beta)
            c_bandit = jax.tree.map(lambda a, b: jnp.where(labels.ready, a, b), upd, c_bandit)

        # Eq. 11: the budgets and the target end the run.
        sim_time = state.sim_time + rc.time_s
        traffic_gb = state.spent.traffic_gb + rc.traffic_bytes / ada_cost.BYTES_PER_GB
        cost = state.spent.cost + rc.cost
        inf = jnp.inf
        t_budget = inf if c.time_budget_min is None else c.time_budget_min
        b_budget = inf if c.traffic_budget_gb is None else c.traffic_budget_gb
        over_time = ada_cost.over_budget(sim_time / ada_cost.SEC_PER_MIN, 0.0, t_budget, inf)
        over_traffic = ada_cost.over_budget(0.0, traffic_gb, inf, b_budget)
        reached = c.stop_on_target & (u_c >= (c.target_acc or 0.0))
        switched = state.switched
        if c.alpha_switch_at is not None and c.alpha_switch_metric == "val":
            switched = switched | (u_c >= 100.0 * c.alpha_switch_at)
        p_arm = self._next_p_arm(key, r, p_bandit)  # P_{k+1} (Eq. 18)
        c_arm = self._next_arm(key, ADA_C_ARM, r, c_bandit, c.adaptive_c)  # C_{k+1}
        new = state.replace(
            sim_time=sim_time,
            w=w_next,
            w_tilde=w_tilde,
            labels=labels,
            agent_p=Agent(p_bandit, p_arm),
            agent_c=Agent(c_bandit, c_arm),
            u_prev=u_c,
            spent=Spent(
                traffic_gb=traffic_gb,
                cost=cost,
                wait_sum=state.spent.wait_sum + wait,
                wait_count=state.spent.wait_count + waited,
            ),
            switched=switched,
            done=state.done | over_time | over_traffic | reached,
        )
        # A run whose budget is spent (or target reached) has ended: its state stays as it was.
        new = jax.tree.map(lambda a, b: jnp.where(state.done, b, a), new, state)
        new = new.replace(round=r)

        metrics = cohort_metrics(jnp.arange(m, dtype=jnp.int32), up.stats, up.w)
        metrics.update(
            selected=plan.sel,
            P=jnp.asarray(self.p_values, jnp.float32)[state.agent_p.arm],
            C=thresh,
            n=jnp.sum(plan.sel).astype(jnp.int32),
            lr=eta,
            num_pseudo=n_pl,
            server_loss=server_loss,
            server_steps=server_steps,
            # Scored on the host against the hidden labels (engine.loop: pl_acc); never read
            # by training.
            pl_index=plan.pool[None],
            pl_label=jnp.where(mask, labels.y_hat, -1)[None],
            val_acc_half=u_p,
            val_acc=u_c,
            reward_p=r_p,
            reward_c=r_c,
            alpha=alpha,
            phase=state.switched.astype(jnp.int32),  # 1: after the preference switch
            round_time_s=rc.time_s,
            round_traffic_gb=rc.traffic_bytes / ada_cost.BYTES_PER_GB,
            round_cost=rc.cost,
            wait_ratio=ada_cost.waiting_ratio(wait, waited),  # Eq. 34 over this round, %
            wait_ratio_cum=ada_cost.waiting_ratio(new.spent.wait_sum, new.spent.wait_count),
            cum_time_min=new.sim_time / ada_cost.SEC_PER_MIN,
            cum_traffic_gb=new.spent.traffic_gb,
            cum_cost=new.spent.cost,
            over_time=over_time,
            over_traffic=over_traffic,
            reached=reached,
            done=new.done,
        )
        return new, metrics

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, state: AdaState, fed: FederatedData, mapper: Mapper) -> dict:
        """Test accuracy of the global model w_{k+1} and of the teacher (Fig. 15), and each
        client's accuracy on its own test split with the global model."""
        test_ids = fed.server["test_global"]
        g = evaluate_indices(
            self.global_eval_model, state.w, fed.x, fed.eval_y, test_ids, self.eval_batch
        )
        t = evaluate_indices(
            self.global_eval_model, state.w_tilde, fed.x, fed.eval_y, test_ids, self.eval_batch
        )
        test = fed.roles["test"]
        if fed.test_in_global:
            full = jnp.zeros(fed.x.shape[0], bool).at[test_ids].set(g["correct"])
            r = {"correct": jnp.sum(full[test.idx] & test.mask, axis=1), "count": test.count}
            r.update(table_stats(g["each"], test_ids, test, fed.eval_y, fed.num_classes))
        else:
            r = mapper(self.client_test, test, state.w, fed.x, fed.eval_y)
        client_acc, personal = client_accuracy(r)
        return {
            "accuracy": g["accuracy"],
            "global_acc": g["accuracy"],
            "global_loss": g["loss"],
            "teacher_acc": t["accuracy"],
            "client_acc": client_acc,
            "personal_acc": personal,
            **sanity(g["stats"]),  # the global model behind `accuracy`
            **sanity(r, prefix="personal_"),
        }

    def client_test(self, table: RoleTable, w: PyTree, x: jax.Array, y: jax.Array) -> dict:
        """One client's test split (a row of the test role) with the global model w."""
        return evaluate_row(self.model, w, x, y, table)


def _fixed(cfg: AdaFedSemiConfig, name: str) -> None:
    for key in ("adaptive_p", "adaptive_c"):
        if getattr(cfg, key):
            raise bad(f"algorithm.{key}", True, f"false for algorithm {name} (P and C fixed)")


@register("ada_fedsemi", AdaFedSemiConfig)
def ada_fedsemi(cfg: AdaFedSemiConfig, **kw: Any) -> AdaFedSemi:
    return AdaFedSemi(cfg, **kw)


@register("fedsemi", AdaFedSemiConfig)
def fedsemi(cfg: AdaFedSemiConfig, **kw: Any) -> AdaFedSemi:
    """FedSemi-P-C: the same pipeline with both agents off (P = fixed_p, C = fixed_c)."""
    _fixed(cfg, "fedsemi")
    return AdaFedSemi(cfg, name="fedsemi", **kw)


@register("fedavg_p", AdaFedSemiConfig)
def fedavg_p(cfg: AdaFedSemiConfig, **kw: Any) -> AdaFedSemi:
    """FedAvg-P = FedSemi-P-1.0: client data only (the pool pass and server epoch left out)."""
    _fixed(cfg, "fedavg_p")
    if cfg.fixed_c != 1.0:
        raise bad("algorithm.fixed_c", cfg.fixed_c, "1.0 for algorithm fedavg_p")
    return AdaFedSemi(cfg, name="fedavg_p", server_training=False, **kw)
