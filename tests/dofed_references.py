"""NumPy references for DoFed-SPP's kernels (Eq. 19's similarity ratios, the K/B selection)
and a tiny linear model of clients, shared by test_dofed_spp_kernels.py and
test_dofed_spp_numpy.py."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st

SEEDS = st.integers(0, 2**31 - 1)
F32 = {"width": 32, "allow_subnormal": False}  # hypothesis floats that float32 holds


def np_softmax(z):
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


# ----------------------------------------------------------------------------- references


def np_sr(loss_cross, loss_own, dist, sr_prev, gamma, g1, g2, eps, exclude_self, valid, rule):
    """Eq. 19 literally, one (n, i) pair at a time, with docs/choices.md's degenerate-row rule."""
    n_rows, n_cols = loss_cross.shape
    out = np.zeros((n_rows, n_cols))
    degenerate = np.zeros(n_rows, bool)
    for n in range(n_rows):
        a = np.zeros(n_cols)
        allowed = np.ones(n_cols, bool)
        for i in range(n_cols):
            allowed[i] = (valid is None or valid[n, i]) and not (exclude_self and i == n)
            if allowed[i]:
                num = gamma * (loss_own[n] - loss_cross[n, i]) + g1 + gamma * g2
                a[i] = max(num / max(dist[n, i], eps), 0.0)
        if a.sum() > 0:
            out[n] = a / a.sum()
        else:
            degenerate[n] = True
            if rule == "zeros":
                out[n] = 0.0
            elif rule == "keep_previous" and sr_prev is not None:
                out[n] = sr_prev[n]
            elif allowed.any():
                out[n] = allowed / allowed.sum()
    return out, degenerate


def np_topb_value(s, chosen_ids, b):
    """F(U) by brute force: sort each row's SRs within U and sum the B largest."""
    ids = list(chosen_ids)
    if not ids:
        return 0.0
    return float(sum(np.sort(row[ids])[::-1][:b].sum() for row in s))


def np_greedy(s, k, b):
    """Algorithm 1 by marginal gains F(U + i) - F(U) recomputed from scratch; ties -> lowest i."""
    chosen = []
    for _ in range(k):
        base = np_topb_value(s, chosen, b)
        best, best_gain = None, -1.0
        for i in range(s.shape[0]):
            if i not in chosen:
                gain = np_topb_value(s, chosen + [i], b) - base
                if gain > best_gain:
                    best, best_gain = i, gain
        chosen.append(best)
    return chosen


def np_opt(s, k, b):
    """max F(U) over every U with |U| = k (F is monotone, so the optimum has k elements)."""
    return max(np_topb_value(s, u, b) for u in itertools.combinations(range(s.shape[0]), k))


def dyadic(rng, high, shape, denom=8):
    """Random multiples of 1/denom in [0, high): every sum and product below stays exact in f32,
    so ties are exact ties in both the kernel and the reference."""
    return (rng.integers(0, int(high * denom), size=shape) / denom).astype(np.float32)


def random_stochastic(rng, n):
    p = rng.uniform(0.1, 1.0, size=(n, n))
    return (p / p.sum(-1, keepdims=True)).astype(np.float32)


# ----------------------------------------------------------------------------- tiny model


def linear_loss(params, batch):
    """Masked mean cross-entropy of a linear softmax model."""
    x, y, m = batch
    logp = jax.nn.log_softmax(x @ params["w"] + params["b"])
    ce = -jnp.take_along_axis(logp, y[:, None], axis=-1)[:, 0]
    return jnp.sum(ce * m) / jnp.maximum(jnp.sum(m), 1)


def np_linear_loss(w, b, x, y, m):
    logp = np.log(np_softmax(x.astype(np.float64) @ w + b))
    total = sum(-logp[d, y[d]] for d in range(len(y)) if m[d])
    return total / max(m.sum(), 1)


def make_clients(seed, n=4, d=6, f=5, q=3, scale=0.5):
    rng = np.random.default_rng(seed)
    params = {
        "w": rng.normal(scale=scale, size=(n, f, q)).astype(np.float32),
        "b": rng.normal(scale=scale, size=(n, q)).astype(np.float32),
    }
    x = rng.normal(size=(n, d, f)).astype(np.float32)
    y = rng.integers(0, q, size=(n, d)).astype(np.int32)
    counts = rng.integers(1, d + 1, size=n)
    m = (np.arange(d)[None, :] < counts[:, None]).astype(np.float32)  # padded, variable size
    return params, (x, y, m)


def np_flat(params, i):
    return np.concatenate([params["b"][i].ravel(), params["w"][i].ravel()]).astype(np.float64)


def kb_instance(draw_n, draw_k, draw_b):
    k = min(draw_k, draw_n)
    return draw_n, k, min(draw_b, k)


def np_candidates(c1, c2, c3, n):
    """Spec 2.3.3 by loops: every (K, B(K)) with K in [min(K_lo, K_hi), K_hi]."""
    c1, c2, c3 = np.float32(c1), np.float32(c2), np.float32(c3)
    b_of = {}
    for k in range(1, n + 1):
        fits = [b for b in range(1, k + 1) if np.float32(b) * c2 + np.float32(k) * c3 <= c1]
        b_of[k] = max(fits) if fits else 0
    k_hi = max([k for k in b_of if b_of[k] >= 1], default=0)
    k_lo = max([k for k in b_of if b_of[k] == k], default=0)
    k_lo = max(k_lo, 1)
    return [(k, b_of[k]) for k in range(min(k_lo, k_hi), k_hi + 1) if k >= 1]
