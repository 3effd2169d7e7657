"""UM-pFSSL: uncertainty-aware personalized federated semi-supervised learning with helper
agents (Shi, Chen and Zhang, "Uncertainty Minimization for Personalized Federated
Semi-Supervised Learning"; the paper's Alg. 1 and Alg. 2).

    warm-up: every client trains on its labeled data; pool[k] = w_k
    for t = 1..rounds:
        S = sample clients
        for k in S in parallel (they read the pool as it was at the start of the round):
            a. FILL     first participation: M-1 random helpers
            b. REPLACE  t <= F: R random candidates against the R worst helpers, keep the best R
            c. REFRESH  t % nu == 0 (refresh_trigger): re-download kept helpers that uploaded since
            d. STATS    MC dropout of every helper on k's data -> Corr(k|j), p_bar, entropy
            e. AGG      w_k = sum_j Corr(k|j) w_j / sum_j Corr(k|j)
            f. PSEUDO   y_hat_i = p_bar of the least uncertain helper on x_i
            g. TRAIN    E epochs on mu_k CE(labeled) + (1 - mu_k) KL(y_hat || f_w(x)) (kl_direction)
            h. UPLOAD   pool[k] = w_k, pool_ver[k] = t

Every step is array code over the client's M helper slots; the engine maps it over the cohort.
Where the paper is silent, our choices are in docs/choices.md: UM-pFSSL.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_semi.algorithms.base import (
    ClientTable,
    FLState,
    RoundShared,
    cohort_metrics,
    register,
)
from fedjax_semi.algorithms.fedavg import FedAvgFamily, _check
from fedjax_semi.algorithms.um_pfssl_config import UMPFSSLConfig
from fedjax_semi.data.federated import FederatedData, RoleTable, TrainView
from fedjax_semi.engine.aggregate import select_rows
from fedjax_semi.engine.clients import broadcast, gather, map_within_client, scatter
from fedjax_semi.engine.keys import (
    CANDIDATE,
    DROPOUT,
    FILL,
    MC_CANDIDATE,
    MC_REFRESH,
    MC_REPLACE,
    MC_STATS,
    MC_STATS_OWN,
    SAMPLE,
    WARMUP,
    client_key,
)
from fedjax_semi.engine.train import (
    Schedule,
    kl_divergence,
    local_train,
    masked_mean,
    reverse_kl_divergence,
)
from fedjax_semi.errors import bad
from fedjax_semi.kernels.selection import lowest_mask, merge_best, sample_excluding
from fedjax_semi.kernels.uncertainty import (
    aggregation_weights,
    helper_pseudo_labels,
    pair_stats,
    personalized_average,
)

COUNTERS = ("fill_downloads", "replace_downloads", "update_downloads", "uploads", "warmup_uploads")


def _stack(head, tail):
    """[P] + [M-1, P] -> [M, P] per leaf."""
    return jax.tree.map(lambda a, b: jnp.concatenate([a[None], b]), head, tail)


PyTree = Any


@struct.dataclass
class UMInputs:
    """prepare -> client_round, one row per cohort client [S, ...]: its id, labeled and unlabeled
    tables, own model, helper list (ids [M], valid [M]), its cached helper copies [M-1, ...]
    with their versions [M-1], how often it has participated, and (refresh_trigger:
    per_client_elapsed only, else None) the round of its last refresh."""

    id: jax.Array
    lab: RoleTable
    unl: RoleTable
    own: PyTree
    hidx: jax.Array
    hval: jax.Array
    cache: PyTree
    cver: jax.Array
    part: jax.Array
    last: jax.Array | None = None


@dataclasses.dataclass
class UMPFSSL(FedAvgFamily):
    cfg: UMPFSSLConfig
    name: str = "um_pfssl"

    def __post_init__(self) -> None:
        super().__post_init__()
        c = self.cfg
        self.M, self.R = c.helper_list_size, c.num_replace
        self._updates: dict = {}

    # ------------------------------------------------------------------ state

    def init(self, key: jax.Array, fed: FederatedData) -> FLState:
        state = super().init(key, fed)  # pool = client_vars: every client starts from w_0
        k, m = self.num_clients, self.M
        helper_idx = jnp.full((k, m), -1, jnp.int32).at[:, 0].set(jnp.arange(k))
        extra = {
            "helper_idx": helper_idx,
            "helper_valid": jnp.zeros((k, m), bool).at[:, 0].set(True),
            "cache": broadcast(broadcast(state.global_vars, m - 1), k),
            "cache_ver": jnp.zeros((k, m - 1), jnp.int32),
            "pool_ver": jnp.zeros((k,), jnp.int32),
            "participations": jnp.zeros((k,), jnp.int32),
            "comm": {c: jnp.zeros((), jnp.int32) for c in COUNTERS},
        }
        if self.cfg.refresh_trigger == "per_client_elapsed":
            extra["last_refresh"] = jnp.zeros((k,), jnp.int32)  # the warm-up counts as round 0
        return state.replace(extra=extra)

    has_warmup: ClassVar[bool] = True
    # Eq. 11's chosen labels, the own model's, and "any helper right" ([S, M, N], hidden labels).
    label_scores: ClassVar[dict[str, str]] = {
        "pl_label": "pl_acc", "pl_self_label": "pl_self_acc", "pl_helper_label": "pl_any_helper_acc"
    }  # fmt: skip
    mechanism_metrics: ClassVar[tuple[str, ...]] = tuple(label_scores.values())

    def warmup(self, state: FLState, data: TrainView, mapper, key: jax.Array) -> FLState:
        """Alg. 1 l.3-4: every client trains on its labeled data only, then uploads."""
        ids, ex = jnp.arange(self.num_clients), state.extra
        inputs = ClientTable(ids, data.roles["labeled"])
        shared = RoundShared(state.client_vars, data.x, data.y, jnp.int32(0), key, ex["pool_ver"])
        pool = mapper(self.warmup_client, inputs, shared)
        comm = dict(state.extra["comm"], warmup_uploads=jnp.int32(self.num_clients))
        return state.replace(client_vars=pool, extra=dict(state.extra, comm=comm))

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

    def client_update_for(self, flags: tuple[bool, bool]):
        if flags not in self._updates:
            replace, refresh = flags
            self._updates[flags] = functools.partial(
                self.client_round, replace=replace, refresh=refresh
            )
        return self._updates[flags]

    def client_update(self, inp: UMInputs, shared: RoundShared) -> dict:
        return self.client_update_for((False, False))(inp, shared)

    def prepare(self, state: FLState, data: TrainView, key: jax.Array):
        cohort = self.sample_cohort(key, state.round)
        ex = state.extra
        inputs = UMInputs(
            id=cohort,
            lab=data.roles["labeled"].take(cohort),
            unl=data.roles["unlabeled"].take(cohort),
            own=gather(state.client_vars, cohort),
            hidx=ex["helper_idx"][cohort],
            hval=ex["helper_valid"][cohort],
            cache=gather(ex["cache"], cohort),
            cver=ex["cache_ver"][cohort],
            part=ex["participations"][cohort],
            last=ex["last_refresh"][cohort] if "last_refresh" in ex else None,
        )
        shared = RoundShared(
            state.client_vars, data.x, data.y, state.round + 1, key, ex["pool_ver"]
        )
        return cohort, inputs, shared

    def helper_stats(self, models, ids, purpose, inp, shared, mu):
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

    def replace_helpers(self, inp, shared, mu, lists):
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

    def client_round(self, inp: UMInputs, shared: RoundShared, *, replace: bool, refresh: bool):
        c, M, R = self.cfg, self.M, self.R
        k, t = inp.id, shared.round
        pool, pool_ver = shared.models, shared.versions
        lab, unl = inp.lab, inp.unl
        n_s, n_u = lab.count, unl.count
        mu = n_s / jnp.maximum(n_s + n_u, 1)
        own, hidx, hval, cache, cver = inp.own, inp.hidx, inp.hval, inp.cache, inp.cver

        # a. FILL: the first participation draws M-1 distinct helpers other than k.
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

        # b. REPLACE (Alg. 2): R random candidates vs the R worst non-self helpers, while searching.
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

        # c. REFRESH (t % nu == 0 by default): re-download kept helpers uploaded since our copy.
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
            if not c.refresh_lowest_r:
                keep = ~lowest_mask(corr[1:][None], R)[0]
            latest = pool_ver[hidx[1:]]
            need = keep & (latest > cver) & due
            cache = select_rows(need, gather(pool, hidx[1:]), cache)
            cver = jnp.where(need, latest, cver)
            n_update = jnp.sum(need)

        # d. STATS on the final list; e. AGG; f. PSEUDO.
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

        # g. TRAIN on D_k with the mu-weighted joint loss, or alternating CE and KL passes.
        new_vars, stats = self.train_personal(agg, inp, shared, y_hat, keep, mu)
        nu_max = unl.idx.shape[0]
        unl_mask = jnp.arange(nu_max) < n_u
        out = {
            "vars": new_vars,
            "hidx": hidx,
            "hval": hval,
            "cache": cache,
            "cver": cver,
            "counts": {
                "fill_downloads": n_fill,
                "replace_downloads": n_replace,
                "update_downloads": n_update,
            },
            "loss": stats["loss"],
            "steps": stats["steps"],
            "pl_from_self": masked_mean((chosen == 0).astype(jnp.float32), unl_mask),
            "pl_entropy": masked_mean(
                jnp.where(unl_mask, jnp.min(jnp.where(hval[:, None], ent, jnp.inf), 0), 0.0),
                unl_mask,
            ),
            "corr_mean": jnp.mean(st["corr"]),
            # For the pseudo-label accuracy diagnostic, scored outside training (simulate.py).
            "pl_kept": masked_mean(keep.astype(jnp.float32), unl_mask),
            "pl_index": unl.idx,
            "pl_label": jnp.where(unl_mask & keep, jnp.argmax(y_hat, -1), -1),
            # The own (pre-aggregation) model's and each helper's labels: was the right one there?
            "pl_self_label": jnp.where(unl_mask, jnp.argmax(st["p_bar_u"][0], -1), -1),
            "pl_helper_label": jnp.where(
                unl_mask & hval[:, None], jnp.argmax(st["p_bar_u"], -1), -1
            ),
        }
        if inp.last is not None:
            out["last"] = jnp.where(due, t, inp.last)
        return out

    def aggregate(self, corr, valid, helpers, own):
        """Alg. 1 l.14-15: the Corr-weighted average of the helpers [M, ...] (valid [M]).
        aggregate_bn_stats=false keeps the client's own BatchNorm running statistics instead
        of averaging them, as FedBN does (the paper does not say which)."""
        omega = aggregation_weights(corr[None], valid[None])
        agg = personalized_average(omega, jax.tree.map(lambda a: a[None], helpers))
        agg = jax.tree.map(lambda a: a[0], agg)
        if not self.cfg.aggregate_bn_stats and "batch_stats" in agg:
            agg = {**agg, "batch_stats": own["batch_stats"]}
        return agg

    def train_personal(self, agg, inp, shared, y_hat, keep, mu):
        """E local epochs (not given in the paper) from the aggregated model; momentum starts
        fresh, as in standard FL. Unlabeled samples with keep [Nu] false (below pl_threshold)
        get weight 0.

        joint: each epoch shuffles D_k = D_k^s + D_k^u (compacted into one table row) with
        per-sample weights mu (labeled, one-hot target) and 1 - mu (unlabeled, y_hat).
        alternating: each epoch is a CE pass over D_k^s, then a KL pass over D_k^u, unweighted.
        """
        c, k, t = self.cfg, inp.id, shared.round
        lab, unl = inp.lab, inp.unl
        n_s, n_u = lab.count, unl.count
        one_hot = lambda idx: jax.nn.one_hot(shared.y[idx], y_hat.shape[-1])
        key_s = client_key(shared.key, SAMPLE, t, k)
        key_d = client_key(shared.key, DROPOUT, t, k)
        train = functools.partial(
            local_train, self.um_objective, self.tx, data_x=shared.x, data_y=shared.y
        )
        if c.loss_schedule == "joint":
            ns_max, nu_max = lab.idx.shape[0], unl.idx.shape[0]
            p = jnp.arange(ns_max + nu_max)
            is_lab = p < n_s
            upos = jnp.clip(p - n_s, 0, nu_max - 1)
            idx = jnp.where(is_lab, lab.idx[jnp.clip(p, 0, ns_max - 1)], unl.idx[upos])
            target = jnp.where(is_lab[:, None], one_hot(idx), y_hat[upos])
            weight = jnp.where(is_lab, mu, (1.0 - mu) * keep[upos])
            extras = {"target": target, "weight": weight}
            if c.kl_direction == "model_to_target":
                extras["reverse"] = ~is_lab  # labeled rows keep CE (KL of a one-hot target)
            new_vars, _, stats = train(
                variables=agg,
                opt_state=self.tx.init(agg["params"]),
                table=RoleTable(idx, n_s + n_u),
                schedule=self.schedule,
                key_sample=key_s,
                key_dropout=key_d,
                extras=extras,
            )
            return new_vars, stats

        one_epoch = Schedule(self.schedule.batch_size, 1, 0)
        unl_extras = {"target": y_hat, "weight": keep.astype(jnp.float32)}
        if c.kl_direction == "model_to_target":
            unl_extras["reverse"] = jnp.ones(unl.idx.shape[0], bool)
        passes = [
            (lab, {"target": one_hot(lab.idx), "weight": jnp.ones(lab.idx.shape[0])}),
            (unl, unl_extras),
        ]

        def epoch(carry, e):
            variables, opt, loss_sum, steps = carry
            for j, (table, extras) in enumerate(passes):
                variables, opt, st = train(
                    variables=variables,
                    opt_state=opt,
                    table=table,
                    schedule=one_epoch,
                    key_sample=jax.random.fold_in(key_s, 2 * e + j),
                    key_dropout=jax.random.fold_in(key_d, 2 * e + j),
                    extras=extras,
                )
                loss_sum, steps = loss_sum + st["loss"] * st["steps"], steps + st["steps"]
            return (variables, opt, loss_sum, steps), None

        init = (agg, self.tx.init(agg["params"]), jnp.zeros(()), jnp.zeros((), jnp.int32))
        (new_vars, _, loss_sum, steps), _ = jax.lax.scan(
            epoch, init, jnp.arange(self.schedule.epochs)
        )
        return new_vars, {"loss": loss_sum / jnp.maximum(steps, 1), "steps": steps}

    def um_objective(self, params, model_state, batch, rng, anchor, pl_on):
        """(mu CE(labeled) + (1 - mu) KL(y_hat || f_w)) summed over the batch / n_valid (Eq. 1;
        Eq. 5's KL in the distillation direction, defined for one-hot targets, where it equals
        CE). kl_direction=model_to_target: rows with batch["reverse"] (the pseudo-labeled ones)
        take KL(f_w || y_hat), Alg. 1 l.20 as printed."""
        logits, new_state = self.model.apply(
            {"params": params, **model_state}, batch["x"], train=True, rng=rng, mask=batch["valid"]
        )
        per = kl_divergence(logits, batch["target"])
        if "reverse" in batch:
            per = jnp.where(batch["reverse"], reverse_kl_divergence(logits, batch["target"]), per)
        per = per * batch["weight"]
        return masked_mean(per, batch["valid"]), (new_state, {"pl_rate": jnp.zeros(())})

    def finish(self, state: FLState, cohort, out, key: jax.Array):
        ex = state.extra
        t = state.round + 1
        comm = {n: ex["comm"][n] + jnp.sum(out["counts"][n]) for n in out["counts"]}
        comm["uploads"] = ex["comm"]["uploads"] + cohort.shape[0]
        comm["warmup_uploads"] = ex["comm"]["warmup_uploads"]
        extra = {
            "helper_idx": ex["helper_idx"].at[cohort].set(out["hidx"]),
            "helper_valid": ex["helper_valid"].at[cohort].set(out["hval"]),
            "cache": scatter(ex["cache"], cohort, out["cache"]),
            "cache_ver": ex["cache_ver"].at[cohort].set(out["cver"]),
            "pool_ver": ex["pool_ver"].at[cohort].set(t),
            "participations": ex["participations"].at[cohort].add(1),
            "comm": comm,
        }
        if "last_refresh" in ex:
            extra["last_refresh"] = ex["last_refresh"].at[cohort].set(out["last"])
        metrics = {
            **cohort_metrics(cohort, out, out["vars"]),
            "pl_from_self": jnp.mean(out["pl_from_self"]),
            "pl_entropy": jnp.mean(out["pl_entropy"]),
            "pl_kept": jnp.mean(out["pl_kept"]),
            "corr_mean": jnp.mean(out["corr_mean"]),
            "pl_index": out["pl_index"],
            "pl_label": out["pl_label"],
            "pl_self_label": out["pl_self_label"],
            "pl_helper_label": out["pl_helper_label"],
            **{f"comm_{n}": v for n, v in comm.items()},
            "comm_cost": sum(comm[n] for n in COUNTERS[:4]),
        }
        new_state = state.replace(
            round=t, client_vars=scatter(state.client_vars, cohort, out["vars"]), extra=extra
        )
        return new_state, metrics


@register("um_pfssl", UMPFSSLConfig)
def um_pfssl(cfg: UMPFSSLConfig, **kw) -> UMPFSSL:
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
