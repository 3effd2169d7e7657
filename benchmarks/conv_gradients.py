"""The gradient convolutions of the FedAvg CNN's conv2 (batch 32, 14x14x32 -> 14x14x64, 5x5),
each alone and inside a `lax.scan` of 19 steps (one client's epoch in W0), in one process: why
`models.layers.lax_conv` writes its gradient as canonical-layout forward convolutions.

    python benchmarks/conv_gradients.py [--repeats 5] [--out FILE]

Rows: XLA's autodiff of `lax.conv_general_dilated` (weight gradient `dW autodiff`, input
gradient `dx autodiff`), the same gradients as `lax_conv` computes them (`dW canonical`,
`dx canonical`), and the weight gradient as im2col matmuls (whole, by kernel rows, and through
`lax.conv_general_dilated_patches`). Each is checked against `dW autodiff` / `dx autodiff` first
(float32 summation order aside). Prints a table and appends JSON lines to
benchmarks/results/conv_gradients.jsonl.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax
import jax.numpy as jnp

from common import RESULTS, emit, environment, timed

STEPS, B, H, CIN, F, K = 19, 32, 14, 32, 64, 5
DN = ("NHWC", "HWIO", "NHWC")
P = K // 2


def conv(x, w):
    return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=DN)


def pad(x):
    return jnp.pad(x, ((0, 0), (P, P), (P, P), (0, 0)))


def dw_autodiff(x, w, dy):
    return jax.grad(lambda w: jnp.vdot(conv(x, w), dy))(w)


def dx_autodiff(x, w, dy):
    return jax.grad(lambda x: jnp.vdot(conv(x, w), dy))(x)


def dw_canonical(x, w, dy):
    cols = pad(x).transpose(3, 1, 2, 0)  # [C, Hp, Wp, B]: channels as images, batch as features
    out = jax.lax.conv_general_dilated(cols, dy.transpose(1, 2, 0, 3), (1, 1), "VALID",
                                       dimension_numbers=DN)  # fmt: skip
    return out.transpose(1, 2, 0, 3)


def dx_canonical(x, w, dy):
    return conv(dy, jnp.flip(w, (0, 1)).transpose(0, 1, 3, 2))


def _windows(xp, rows=range(K)):
    return [xp[:, i : i + H, j : j + H, :] for i in rows for j in range(K)]


def dw_im2col(x, w, dy):
    cols = jnp.concatenate(_windows(pad(x)), -1).reshape(-1, K * K * CIN)
    return (cols.T @ dy.reshape(-1, F)).reshape(K, K, CIN, F)


def dw_im2col_rows(x, w, dy):
    xp, d = pad(x), dy.reshape(-1, F)
    rows = [jnp.concatenate(_windows(xp, [i]), -1).reshape(-1, K * CIN).T @ d for i in range(K)]
    return jnp.stack(rows).reshape(K, K, CIN, F)


def dw_patches(x, w, dy):
    p = jax.lax.conv_general_dilated_patches(pad(x), (K, K), (1, 1), "VALID", dimension_numbers=DN)
    return (
        (p.reshape(-1, CIN * K * K).T @ dy.reshape(-1, F))
        .reshape(CIN, K, K, F)
        .transpose(1, 2, 0, 3)
    )


CASES = {
    "dW autodiff": (dw_autodiff, dw_autodiff),
    "dW canonical": (dw_canonical, dw_autodiff),
    "dW im2col": (dw_im2col, dw_autodiff),
    "dW im2col by kernel rows": (dw_im2col_rows, dw_autodiff),
    "dW conv_general_dilated_patches": (dw_patches, dw_autodiff),
    "dx autodiff": (dx_autodiff, dx_autodiff),
    "dx canonical": (dx_canonical, dx_autodiff),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(RESULTS / "conv_gradients.jsonl"))
    args = ap.parse_args()
    env = environment()
    ks = jax.random.split(jax.random.PRNGKey(0), 3)
    xs = jax.random.normal(ks[0], (STEPS, B, H, H, CIN))
    dys = jax.random.normal(ks[1], (STEPS, B, H, H, F))
    w = jax.random.normal(ks[2], (K, K, CIN, F)) * 0.05
    print("| gradient | alone (ms) | in a lax.scan (ms / step) |\n|---|---|---|")
    for name, (fn, ref) in CASES.items():
        err = float(jnp.max(jnp.abs(fn(xs[0], w, dys[0]) - ref(xs[0], w, dys[0]))))
        assert err < 1e-2, (name, err)  # float32 sums of 6,272 (dW) or 1,600 (dx) terms
        one = jax.jit(fn)
        loop = jax.jit(lambda a, d, fn=fn: jax.lax.scan(lambda c, t: (c, fn(t[0], w, t[1])), 0.0,
                                                       (a, d))[1])  # fmt: skip
        _, t_one, _ = timed(lambda one=one: one(xs[0], w, dys[0]), args.repeats)
        _, t_loop, _ = timed(lambda loop=loop: loop(xs, dys), args.repeats)
        rec = {"bench": "conv_gradients", "case": name, "alone_s": t_one,
               "in_scan_s_per_step": t_loop / STEPS, "max_abs_diff": err}  # fmt: skip
        emit({**rec, **env}, Path(args.out))
        print(f"| {name} | {1e3 * t_one:.2f} | {1e3 * t_loop / STEPS:.2f} |")


if __name__ == "__main__":
    main()
