"""Ada-FedSemi's teacher and the pseudo-labels of the server's pool (Xu et al., "Enhancing
Federated Learning with Server-Side Unlabeled Data by Adaptive Client and Data Selection",
Eqs. 2, 6 and 12): pure, jittable functions that `ada_fedsemi.AdaFedSemi.server_update` calls.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_semi.engine.pytrees import PyTree
from fedjax_semi.models.zoo import Model


def teacher_ema(w_half: PyTree, teacher: PyTree, gamma: float, first: jax.Array) -> PyTree:
    """Eq. 12: gamma w_{k+1/2} + (1 - gamma) w~_{k-1}; w_{1+1/2} itself in round 1 (`first`)."""
    return jax.tree.map(
        lambda a, b: jnp.where(first, a, gamma * a + (1.0 - gamma) * b).astype(a.dtype),
        w_half,
        teacher,
    )


def pseudo_label(
    model: Model, variables: PyTree, x: jax.Array, idx: jax.Array, batch: int
) -> tuple[jax.Array, jax.Array]:
    """Eqs. 2 and 6: the teacher's confidence a_j = max_q p_jq and label argmax_q p_jq of every
    pool sample idx [N] (deterministic forward, in chunks of `batch`) -> (f32 [N], int32 [N])."""
    n = idx.shape[0]
    nb = -(-n // batch)
    padded = jnp.pad(idx, (0, nb * batch - n)).reshape(nb, batch)

    def one(ids):
        logits, _ = model.apply(variables, x[ids])
        p = jax.nn.softmax(logits.astype(jnp.float32), -1)
        return jnp.max(p, -1), jnp.argmax(p, -1).astype(jnp.int32)

    conf, yhat = jax.lax.map(one, padded)
    return conf.reshape(-1)[:n], yhat.reshape(-1)[:n]


def confident(conf: jax.Array, threshold: jax.Array, has_pl: jax.Array) -> jax.Array:
    """D_{k,U}: a_j > C_k (strict, the paper's set definition, so C = 1.0 selects nothing) once
    pseudo-labels exist. bool [N]."""
    return has_pl & (conf > threshold)
