"""UM-pFSSL: uncertainty-aware personalized federated semi-supervised learning with helper
agents (Shi, Chen and Zhang, "Uncertainty Minimization for Personalized Federated
Semi-Supervised Learning"; the paper's Alg. 1 and Alg. 2), written as one round:

    warm-up: every client trains on its labeled data; pool[k] = w_k             (Alg. 1 l.3-4)
    for t = 1..T:
        S = sample clients                                                      (l.6)
        for k in S in parallel (they read the pool as it was at the start of the round):
            a. FILL     first participation: M-1 random helpers                 (l.8-9)
            b. REPLACE  t <= F: the R worst helpers vs R random candidates    (l.10-11, Alg. 2)
            c. REFRESH  t % nu == 0: re-download kept helpers uploaded since (l.12-13, Alg. 2)
            d. STATS    MC dropout of every helper on k's data -> Corr(k|j), p_bar, entropy
            e. AGG      w_k = sum_j Corr(k|j) w_j / sum_j Corr(k|j)             (l.14-15)
            f. PSEUDO   y_hat_i = p_bar of the least uncertain helper on x_i    (l.16-17)
            g. TRAIN    E epochs, mu_k CE(labeled) + (1 - mu_k) KL(y_hat || f_w) (l.18-20)
            h. UPLOAD   pool[k] = w_k, record[k] = t                            (l.21)

Every step is array code over the client's M helper slots; the engine maps it over the cohort.
There is no global model: the server's pool of uploads is the clients' models w_k.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from fedjax_semi.algorithms import um_pfssl_train
from fedjax_semi.algorithms.base import ClientTable, Mapper, RoundShared, cohort_metrics, register
from fedjax_semi.algorithms.fedavg import FedAvgFamily, _check
from fedjax_semi.algorithms.um_pfssl_config import UMPFSSLConfig
from fedjax_semi.algorithms.um_pfssl_state import HelperList, UMClient, UMComm, UMState, UMUpload
from fedjax_semi.algorithms.um_pfssl_train import UMObjective
from fedjax_semi.data.federated import FederatedData, TrainView
from fedjax_semi.engine.aggregate import select_rows
from fedjax_semi.engine.clients import Clients, broadcast, gather, map_within_client, scatter
from fedjax_semi.engine.keys import (
    CANDIDATE,
    DROPOUT,
    FILL,
    INIT,
    MC_CANDIDATE,
    MC_REFRESH,
    MC_REPLACE,
    MC_STATS,
    MC_STATS_OWN,
    WARMUP,
    client_key,
)
from fedjax_semi.engine.pytrees import PyTree
from fedjax_semi.engine.train import Schedule, masked_mean
from fedjax_semi.errors import bad
from fedjax_semi.kernels.selection import lowest_mask, merge_best, sample_excluding
from fedjax_semi.kernels.uncertainty import (
    aggregation_weights,
    helper_pseudo_labels,
    pair_stats,
    personalized_average,
)


def _stack(head, tail):
    """[P] + [M-1, P] -> [M, P] per leaf."""
    return jax.tree.map(lambda a, b: jnp.concatenate([a[None], b]), head, tail)


@dataclasses.dataclass
class UMPFSSL(FedAvgFamily):
    cfg: UMPFSSLConfig
    name: str = "um_pfssl"

    def __post_init__(self) -> None:
        super().__post_init__()
        c = self.cfg
        self.M, self.R = c.helper_list_size, c.num_replace
        self.um_objective = UMObjective(self.model)  # Eq. 1 and 5 (the warm-up: CE only)
        self._client_rounds: dict = {}

    # ------------------------------------------------------------------ state

    def init(self, key: jax.Array, fed: FederatedData) -> UMState:
        """Alg. 1 l.1-2: every w_k = w_0 (FedAvg's initial model), H_k = {w_k}."""
        w0 = self.model.init(client_key(key, INIT, 0, 0))
        k, m = self.num_clients, self.M
        zeros = jnp.zeros((), jnp.int32)
        per_client = self.cfg.refresh_trigger == "per_client_elapsed"
        return UMState(
            round=zeros,
            w=w0,
            w_k=broadcast(w0, k),
            opt_k={},
            H=HelperList(
                j=jnp.full((k, m), -1, jnp.int32).at[:, 0].set(jnp.arange(k)),
                valid=jnp.zeros((k, m), bool).at[:, 0].set(True),
                w_j=broadcast(broadcast(w0, m - 1), k),
                version=jnp.zeros((k, m - 1), jnp.int32),
            ),
            record=jnp.zeros((k,), jnp.int32),
            participations=jnp.zeros((k,), jnp.int32),
            last_refresh=jnp.zeros((k,), jnp.int32) if per_client else None,
            comm=UMComm(zeros, zeros, zeros, zeros, zeros),
            sim_time=jnp.zeros((), jnp.float32),
        )

    has_warmup: ClassVar[bool] = True
    # Eq. 11's chosen labels, the own model's, and "any helper right" ([S, M, N], hidden labels).
    label_scores: ClassVar[dict[str, str]] = {
        "pl_label": "pl_acc", "pl_self_label": "pl_self_acc", "pl_helper_label": "pl_any_helper_acc"
    }  # fmt: skip
    mechanism_metrics: ClassVar[tuple[str, ...]] = tuple(label_scores.values())

    def warmup(self, state: UMState, data: TrainView, mapper: Mapper, key: jax.Array) -> UMState:
        """Alg. 1 l.3-4: every client trains on its labeled data only, then uploads."""
        inputs = ClientTable(jnp.arange(self.num_clients), data.roles["labeled"])
        shared = RoundShared(state.w_k, data.x, data.y, jnp.int32(0), key, state.record)
        pool = mapper(self.warmup_client, inputs, shared)
        comm = state.comm.replace(warmup_uploads=jnp.int32(self.num_clients))
        return state.replace(w_k=pool, comm=comm)

    def warmup_client(self, inp: ClientTable, shared: RoundShared) -> PyTree:
        k = inp.id
        variables = jax.tree.map(lambda a: a[k], shared.models)
        warm = Schedule(self.cfg.batch_size, self.cfg.warmup_epochs, 0)
        new, _, _ = self.train_client(
            variables, inp.table, shared, k, WARMUP, DROPOUT, rnd=0, schedule=warm
        )
        return new

    # ------------------------------------------------------------------ one round

    def round_flags(self, t: int) -> tuple[bool, bool]:
        """(replace possible, refresh possible) in round t: `UMPFSSLConfig.round_flags`."""
        return self.cfg.round_flags(t)

    def round(
        self,
        state: UMState,
        data: TrainView,
        key: jax.Array,
        clients: Clients,
        flags: tuple = (),
    ) -> tuple[UMState, dict]:
        """Round t = state.round + 1 of Alg. 1, top-down: sample the clients, each updates its
        helper list against the pool as it was at the start of the round, aggregates, labels
        and trains; the server stores their uploads."""
        cohort = self.sample_cohort(key, state.round)  # l.6
        rows = self.cohort_rows(state, data, cohort)
        pool = RoundShared(state.w_k, data.x, data.y, state.round + 1, key, state.record)
        up = clients.map(self.client_round_for(flags or (False, False)), rows, pool)  # l.7-20
        return clients.server(self.upload)(state, cohort, up)  # l.21

    def cohort_rows(self, state: UMState, data: TrainView, cohort: jax.Array) -> UMClient:
        """The cohort's rows [S, ...]: each client's data, model, H_k and counters."""
        return UMClient(
            id=cohort,
            lab=data.roles["labeled"].take(cohort),
            unl=data.roles["unlabeled"].take(cohort),
            own=gather(state.w_k, cohort),
            H=gather(state.H, cohort),
            part=state.participations[cohort],
            last=None if state.last_refresh is None else state.last_refresh[cohort],
        )

    def client_round_for(
        self, flags: tuple[bool, bool]
    ) -> Callable[[UMClient, RoundShared], UMUpload]:
        """`client_round` with the round's static switches, one function object per pair (the
        backends cache their compiled programs by it)."""
        if flags not in self._client_rounds:
            replace, refresh = flags
            self._client_rounds[flags] = functools.partial(
                self.client_round, replace=replace, refresh=refresh
            )
        return self._client_rounds[flags]

    def client_round(
        self, inp: UMClient, shared: RoundShared, *, replace: bool, refresh: bool
    ) -> UMUpload:
        """Alg. 1 l.8-20 for one client k; shared.models is the pool [N, ...] it downloads from."""
        c, M, R = self.cfg, self.M, self.R
        k, t = inp.id, shared.round
        pool, pool_ver = shared.models, shared.versions
        lab, unl = inp.lab, inp.unl
        n_s, n_u = lab.count, unl.count
        mu = n_s / jnp.maximum(n_s + n_u, 1)
        own, hidx, hval, cache, cver = inp.own, inp.H.j, inp.H.valid, inp.H.w_j, inp.H.version

        # a. FILL (l.8-9): the first participation draws M-1 distinct helpers other than k.
        missing = ~hval[1:]
        taken = jnp.zeros(self.num_clients, bool).at[jnp.where(hval, hidx, k)].set(True)
        drawn = sample_excluding(client_key(shared.key, FILL, t, k), taken[None], M - 1)[0]
        tail = jnp.where(missing, drawn, hidx[1:])
        cache = select_rows(missing, gather(pool, tail), cache)
        cver = jnp.where(missing, pool_ver[tail], cver)
        n_fill = jnp.sum(missing)
        hidx, hval = jnp.concatenate([k[None], tail]), jnp.ones(M, bool)
        if c.helper_cache == "fresh":
            cache, cver = gather(pool, tail), pool_ver[tail]

        # b. REPLACEHELPER (l.10-11): R random candidates vs the R worst non-self helpers.
        corr, searching = None, jnp.bool_(replace)
        if replace:
            search = functools.partial(self.replace_helpers, inp, shared, mu)
            if c.search_schedule == "global_rounds":
                hidx, cache, cver, corr = search((hidx, cache, cver))
            else:
                searching = inp.part < c.search_rounds
                keep = lambda args: (*args, jnp.zeros(M, jnp.float32))
                hidx, cache, cver, corr = jax.lax.cond(searching, search, keep, (hidx, cache, cver))
        n_replace = jnp.where(searching, R, 0).astype(jnp.int32)

        # c. UPDATEHELPER (l.12-13; t % nu == 0 by default): re-download kept helpers uploaded
        # since our copy (Alg. 2 l.8-10).
        n_update = jnp.int32(0)
        due = jnp.bool_(refresh)  # per_client_elapsed: nu rounds since this client's last one
        if inp.last is not None:
            due = due & (t - inp.last >= c.refresh_period)
        if refresh and c.helper_cache == "exact":
            current = lambda: self.helper_stats(
                _stack(own, cache), hidx, MC_REFRESH, inp, shared, mu
            )["corr"]

            def refresh_corr(prev=corr):
                if prev is None:
                    return current()
                if c.search_schedule != "global_rounds":
                    return jax.lax.cond(searching, lambda: prev, current)
                return prev

            if inp.last is None:
                corr = refresh_corr()
            else:  # skip the MC passes of clients not due (under vmap both branches run)
                corr = jax.lax.cond(due, refresh_corr, lambda: jnp.zeros(M, jnp.float32))
            keep = jnp.ones(M - 1, bool)
            if not c.refresh_lowest_r:  # Alg. 2 l.5: the R lowest are not refreshed
                keep = ~lowest_mask(corr[1:][None], R)[0]
            latest = pool_ver[hidx[1:]]
            need = keep & (latest > cver) & due
            cache = select_rows(need, gather(pool, hidx[1:]), cache)
            cver = jnp.where(need, latest, cver)
            n_update = jnp.sum(need)

        # d. STATS on the final list (Eq. 9-14); e. AGG (l.14-15); f. PSEUDO (l.16-17, Eq. 11).
        helpers = _stack(own, cache)
        st = self.helper_stats(helpers, hidx, MC_STATS, inp, shared, mu)
        agg = self.aggregate(st["corr"], hval, helpers, own)
        p_bar, ent = st["p_bar_u"], st["ent_u"]
        if c.self_pl_model == "post_aggregation":
            own_st = self.helper_stats(
                jax.tree.map(lambda a: a[None], agg), k[None], MC_STATS_OWN, inp, shared, mu
            )
            p_bar, ent = p_bar.at[0].set(own_st["p_bar_u"][0]), ent.at[0].set(own_st["ent_u"][0])
        y_hat, chosen, confidence = helper_pseudo_labels(
            p_bar[None], ent[None], hval[None], c.pseudo_label == "hard"
        )
        y_hat, chosen, confidence = y_hat[0], chosen[0], confidence[0]
        # Optional confidence threshold, not in Eq. 11 (pl_threshold: null = keep every label).
        keep = jnp.ones_like(confidence, bool)
        if c.pl_threshold is not None:
            keep = confidence >= c.pl_threshold

        # g. TRAIN (l.18-20) on D_k with the mu-weighted joint loss, or alternating passes.
        new_vars, stats = self.train_personal(agg, inp, shared, y_hat, keep, mu)
        nu_max = unl.idx.shape[0]
        unl_mask = jnp.arange(nu_max) < n_u
        return UMUpload(
            w_k=new_vars,
            H=HelperList(hidx, hval, cache, cver),
            n_fill=n_fill,
            n_replace=n_replace,
            n_update=n_update,
            loss=stats["loss"],
            steps=stats["steps"],
            pl_from_self=masked_mean((chosen == 0).astype(jnp.float32), unl_mask),
            pl_entropy=masked_mean(
                jnp.where(unl_mask, jnp.min(jnp.where(hval[:, None], ent, jnp.inf), 0), 0.0),
                unl_mask,
            ),
            corr_mean=jnp.mean(st["corr"]),
            # For the pseudo-label accuracy diagnostic, scored outside training (the run loop).
            pl_kept=masked_mean(keep.astype(jnp.float32), unl_mask),
            pl_index=unl.idx,
            pl_label=jnp.where(unl_mask & keep, jnp.argmax(y_hat, -1), -1),
            # The own (pre-aggregation) model's and each helper's labels: was the right one there?
            pl_self_label=jnp.where(unl_mask, jnp.argmax(st["p_bar_u"][0], -1), -1),
            pl_helper_label=jnp.where(unl_mask & hval[:, None], jnp.argmax(st["p_bar_u"], -1), -1),
            last=None if inp.last is None else jnp.where(due, t, inp.last),
        )

    def upload(self, state: UMState, cohort: jax.Array, up: UMUpload) -> tuple[UMState, dict]:
        """l.21: the server stores the cohort's models and records round t as their version;
        each client keeps its new H_k. The round's metrics."""
        t = state.round + 1
        old = state.comm
        comm = UMComm(
            fill_downloads=old.fill_downloads + jnp.sum(up.n_fill),
            replace_downloads=old.replace_downloads + jnp.sum(up.n_replace),
            update_downloads=old.update_downloads + jnp.sum(up.n_update),
            uploads=old.uploads + cohort.shape[0],
            warmup_uploads=old.warmup_uploads,
        )
        last = state.last_refresh
        new = state.replace(
            H=scatter(state.H, cohort, up.H),
            record=state.record.at[cohort].set(t),
            participations=state.participations.at[cohort].add(1),
            last_refresh=None if last is None else last.at[cohort].set(up.last),
            comm=comm,
        )
        metrics = {
            **cohort_metrics(cohort, {"loss": up.loss, "steps": up.steps}, up.w_k),
            "pl_from_self": jnp.mean(up.pl_from_self),
            "pl_entropy": jnp.mean(up.pl_entropy),
            "pl_kept": jnp.mean(up.pl_kept),
            "corr_mean": jnp.mean(up.corr_mean),
            "pl_index": up.pl_index,
            "pl_label": up.pl_label,
            "pl_self_label": up.pl_self_label,
            "pl_helper_label": up.pl_helper_label,
            "comm_fill_downloads": comm.fill_downloads,
            "comm_replace_downloads": comm.replace_downloads,
            "comm_update_downloads": comm.update_downloads,
            "comm_uploads": comm.uploads,
            "comm_warmup_uploads": comm.warmup_uploads,
            # = comm.downloads + comm.uploads, summed in this order
            "comm_cost": sum(
                (comm.fill_downloads, comm.replace_downloads, comm.update_downloads, comm.uploads)
            ),
        }
        return new.replace(round=t, w_k=scatter(state.w_k, cohort, up.w_k)), metrics

    def helper_stats(
        self,
        models: PyTree,
        ids: jax.Array,
        purpose: int,
        inp: UMClient,
        shared: RoundShared,
        mu: float | jax.Array,
    ) -> dict:
        """pair_stats of G models [G, P] (ids [G]) on this client's data, vmapped over G."""
        c, k, t = self.cfg, inp.id, shared.round
        base = client_key(shared.key, purpose, t, k)
        keys = jax.vmap(lambda j: jax.random.fold_in(base, j))(ids)
        lab, unl = inp.lab, inp.unl

        def one(v, key):
            return pair_stats(
                self.model, v, shared.x, shared.y, unl.idx, unl.count, lab.idx, lab.count,
                mu, key, c.mc_samples, c.corr_form, c.entropy_reduction, c.entropy_eps, c.acc_mode,
                c.mc_bn_mode,
            )  # fmt: skip

        return map_within_client(one, models, keys)

    def replace_helpers(
        self,
        inp: UMClient,
        shared: RoundShared,
        mu: float | jax.Array,
        lists: tuple[jax.Array, PyTree, jax.Array],
    ) -> tuple[jax.Array, PyTree, jax.Array, jax.Array]:
        """Alg. 2 REPLACEHELPER: keep the best R of the R worst incumbents and R random
        candidates. lists = (hidx [M], cache [M-1, P], cver [M-1]) -> (..., corr [M])."""
        hidx, cache, cver = lists
        k, t, R, pool = inp.id, shared.round, self.R, shared.models
        own = inp.own
        inc = self.helper_stats(_stack(own, cache), hidx, MC_REPLACE, inp, shared, mu)["corr"]
        worst = jnp.argsort(inc[1:], stable=True)[:R]  # slots 1..M-1 -> positions in tail
        taken = jnp.zeros(self.num_clients, bool).at[hidx].set(True)
        cand = sample_excluding(client_key(shared.key, CANDIDATE, t, k), taken[None], R)[0]
        cand_models = gather(pool, cand)
        cand_corr = self.helper_stats(cand_models, cand, MC_CANDIDATE, inp, shared, mu)["corr"]
        ids, best, pos = merge_best(
            hidx[1:][worst][None], inc[1:][worst][None], cand[None], cand_corr[None]
        )
        ids, best, pos = ids[0], best[0], pos[0]
        pick = lambda a, b: jnp.concatenate([a, b])[pos]
        survivors = jax.tree.map(pick, gather(cache, worst), cand_models)
        cache = jax.tree.map(lambda a, s: a.at[worst].set(s), cache, survivors)
        cver = cver.at[worst].set(pick(cver[worst], shared.versions[cand]))
        return hidx.at[1 + worst].set(ids), cache, cver, inc.at[1 + worst].set(best)

    def aggregate(self, corr: jax.Array, valid: jax.Array, helpers: PyTree, own: PyTree) -> PyTree:
        """Alg. 1 l.14-15: the Corr-weighted average of the helpers [M, ...] (valid [M]).
        aggregate_bn_stats=false keeps the client's own BatchNorm running statistics instead
        of averaging them, as FedBN does (the paper does not say which). The ablations:
        aggregation=uniform averages with equal weights, aggregation=own skips the average."""
        if self.cfg.aggregation == "own":
            return own
        if self.cfg.aggregation == "uniform":
            corr = jnp.ones_like(corr)
        omega = aggregation_weights(corr[None], valid[None])
        agg = personalized_average(omega, jax.tree.map(lambda a: a[None], helpers))
        agg = jax.tree.map(lambda a: a[0], agg)
        if not self.cfg.aggregate_bn_stats and "batch_stats" in agg:
            agg = {**agg, "batch_stats": own["batch_stats"]}
        return agg

    def train_personal(
        self,
        agg: PyTree,
        inp: UMClient,
        shared: RoundShared,
        y_hat: jax.Array,
        keep: jax.Array,
        mu: float | jax.Array,
    ) -> tuple[PyTree, dict]:
        """g. TRAIN (Alg. 1 l.18-20): `um_pfssl_train.train_personal` with this method's loss,
        optimizer and schedule."""
        return um_pfssl_train.train_personal(
            self.cfg, self.um_objective, self.tx, self.schedule, agg, inp, shared, y_hat, keep, mu
        )


@register("um_pfssl", UMPFSSLConfig)
def um_pfssl(cfg: UMPFSSLConfig, **kw: Any) -> UMPFSSL:
    _check(cfg, "um_pfssl", shared=(lambda v: v == "none", "'none' (there is no global model)"))
    alg = UMPFSSL(cfg, **kw)
    n, m, r = alg.num_clients, cfg.helper_list_size, cfg.num_replace
    if not 2 <= m <= n:
        raise bad("algorithm.helper_list_size", m, f"an integer in [2, num_clients={n}]")
    if not 1 <= r <= m - 1 or m + r > n:
        raise bad(
            "algorithm.num_replace",
            r,
            f"an integer in [1, helper_list_size - 1 = {m - 1}] with helper_list_size + "
            f"num_replace <= num_clients={n}",
        )
    if not alg.model.has_dropout:
        raise bad("model.dropout", 0.0, "a rate in (0, 1) for um_pfssl (MC dropout needs it)")
    return alg
