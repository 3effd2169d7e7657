"""Every random stream of a run, declared in one place.

A run's JAX randomness all derives from one seed key: `client_key` / `round_key` fold a
*purpose* into it, then the round (and the client), so a client's key never depends on its
position in a chunk or on what other streams drew. The purposes below are part of the
results: renumbering one changes every metric that draws on it, so values are never reused
or changed, only added. Methods that deliberately draw what another method draws (the same
initial model, the same channel) import the same constant rather than declaring a copy.
"""

from __future__ import annotations

import jax


def client_key(seed_key: jax.Array, purpose: int, rnd: jax.Array, client: jax.Array) -> jax.Array:
    """Key for (seed, purpose, round, client id)."""
    k = jax.random.fold_in(seed_key, purpose)
    k = jax.random.fold_in(k, rnd)
    return jax.random.fold_in(k, client)


def round_key(seed_key: jax.Array, purpose: int, rnd: jax.Array) -> jax.Array:
    """Key for (seed, purpose, round) with no client: server-side draws such as selection."""
    return jax.random.fold_in(jax.random.fold_in(seed_key, purpose), rnd)


# ---- the engine and every method built on it (0-5) ----------------------------------------
INIT = 0  # model initialization (FedAvg family, FedBE, FedFomo, DoFed-SPP: one initial model)
SELECT = 1  # the round's cohort (engine.clients.select_cohort)
SAMPLE = 2  # a client's minibatch order (FedAvg family, pFedMe, UM-pFSSL)
DROPOUT = 3  # a client's dropout masks (FedAvg family, pFedMe, UM-pFSSL)
AUGMENT = 4  # reserved, unused today (augmentation draws on AUGMENT_STREAM below)
PSEUDO = 5  # reserved, unused today

# ---- UM-pFSSL's helper protocol (6-12, and 112) --------------------------------------------
WARMUP = 6  # warm-up minibatch order (its dropout draws on DROPOUT at round 0)
FILL = 7  # first participation: the M-1 random helpers
CANDIDATE = 8  # the R candidate helpers of a replacement
MC_REPLACE = 9  # MC-dropout statistics of the current helpers, before replacement
MC_CANDIDATE = 10  # MC-dropout statistics of the candidates
MC_REFRESH = 11  # MC-dropout statistics when stale helpers are refreshed
MC_STATS = 12  # MC-dropout statistics of the final helper list
MC_STATS_OWN = MC_STATS + 100  # the post-aggregation model's own statistics (112)

# ---- DoFed-SPP (20-27); the DoFed baselines, FedBE and FedFomo reuse UPLOAD and CHANNEL -----
WARM_SAMPLE = 20  # warm-up minibatch order
WARM_DROPOUT = 21  # warm-up dropout
REC_SAMPLE = 22  # recommendation-model minibatch order
REC_DROPOUT = 23  # recommendation-model dropout
TAR_SAMPLE = 24  # target-model minibatch order
TAR_DROPOUT = 25  # target-model dropout
UPLOAD = 26  # per-round upload rates (systems.wireless)
CHANNEL = 27  # Shannon mode's per-client distances

# ---- FedFomo (30-32): its own sample/dropout streams, not the engine's ----------------------
FEDFOMO_SAMPLE = 30  # minibatch order
FEDFOMO_DROPOUT = 31  # dropout
DOWNLOAD = 32  # which peer models a client downloads (epsilon-greedy)

# ---- FedBE (40-45): its own sample/dropout streams, not the engine's ------------------------
FEDBE_SAMPLE = 40  # minibatch order
FEDBE_DROPOUT = 41  # dropout
GAUSSIAN = 42  # the sampled global models
DISTILL_SAMPLE = 43  # server distillation minibatch order
DISTILL_DROPOUT = 44  # server distillation dropout
POOL_STREAM = 45  # not a JAX purpose: numpy `default_rng([seed, POOL_STREAM])` of the pool draw

# ---- CoFED (50-53): Step 1's local training and Step 4's update training -------------------
COFED_LOCAL_SAMPLE = 50  # local-training minibatch order
COFED_LOCAL_DROPOUT = 51  # local-training dropout
COFED_UPDATE_SAMPLE = 52  # update-training minibatch order
COFED_UPDATE_DROPOUT = 53  # update-training dropout
FINETUNE_SAMPLE = 54  # personalized FedAvg's fine-tuning minibatch order (at evaluation)
FINETUNE_DROPOUT = 55  # its dropout
COFED_PUBLIC_ORDER = 56  # the order in which CoFED's center takes public rows (public_size)

# ---- CoFED on UCI Adult (60-62; algorithms.cofed_adult): numpy streams, not JAX purposes, -----
# drawn as `default_rng([seed, STREAM])`. Its NNs draw on INIT, COFED_LOCAL_SAMPLE and
# COFED_UPDATE_SAMPLE (same meaning as in the image CoFED).
ADULT_SPLIT_STREAM = 60  # which training rows each participant holds (disjoint)
ADULT_PUBLIC_STREAM = 61  # the synthetic public rows (Sec. 5.7)
ADULT_HPARAM_STREAM = 62  # each participant's hyperparameters and its tree's random_state

# ---- FedMD (70-76): transfer learning, the alignment subset, digest and revisit -----------
FEDMD_PUBLIC_SAMPLE = 70  # transfer learning on the labeled public set: minibatch order
FEDMD_PUBLIC_DROPOUT = 71  # its dropout
FEDMD_PRIVATE_SAMPLE = 72  # training on the private set (transfer learning and revisit)
FEDMD_PRIVATE_DROPOUT = 73  # its dropout
FEDMD_ALIGN = 74  # each round's alignment subset of the public set
FEDMD_DIGEST_SAMPLE = 75  # digest: minibatch order over the alignment subset
FEDMD_DIGEST_DROPOUT = 76  # its dropout

# ---- Ada-FedSemi and HeteroAda-FedSemi (80-87): clients train on SAMPLE and DROPOUT ---------
ADA_P_ARM = 80  # the P agent's arm for the next round (Eq. 18)
ADA_C_ARM = 81  # the C agent's arm for the next round (Eq. 18)
ADA_SELECT = 82  # the round's participants: a permutation of all M clients (Alg. 1 line 4)
ADA_SERVER_SAMPLE = 83  # the server's epoch over the pseudo-labeled samples: their order (Eq. 7)
ADA_SERVER_DROPOUT = 84  # its dropout
TX2_MODE = 85  # each TX2 client's power mode, one draw per mode period (systems.tx2)
TX2_BANDWIDTH = 86  # each TX2 client's bandwidth factor, one draw per round (systems.tx2)
HETERO_KMEANS = 87  # Alg. 3's random initial centroids (kernels.depths)

# ---- CFSL (90-92; algorithms.cfsl): its local training draws on SAMPLE and DROPOUT -------------
CFSL_DEVICES = 90  # each worker's fixed transmit power, CPU frequency and distance
CFSL_FADING = 91  # each round's Rayleigh block fading
CFSL_SELECT = 92  # random selection in stopped clusters (the CFL + SSL random baseline)

# ---- folded into an already derived key, not into the seed key --------------------------------
AUGMENT_STREAM = 7919  # a training step's key -> its augmentation draws (engine.train)

PURPOSES: dict[str, int] = {
    name: value
    for name, value in dict(globals()).items()
    if name.isupper() and isinstance(value, int) and not isinstance(value, bool)
}

# Names allowed to share a value with another (alias -> the name it shares with), each with the
# reason. None today: a method that deliberately draws another's stream imports that constant.
ALIASES: dict[str, str] = {}
