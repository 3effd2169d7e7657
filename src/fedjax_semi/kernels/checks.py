"""Argument checks and the float promotion shared by the DoFed-SPP and FedFomo kernels.

The checks run only on concrete values: under `jit` or `vmap` a traced argument cannot be
inspected, and the caller is expected to have checked it before tracing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt


def concrete(value: Any) -> np.ndarray | None:
    """The value as a NumPy array, or None when it is traced (checks then happen by the caller)."""
    try:
        return np.asarray(value)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None


def check_number(
    name: str, value: Any, ok: Callable[[np.ndarray], npt.ArrayLike], allowed: str
) -> None:
    """Raise ValueError naming `name` when a concrete `value` fails `ok` (traced: no check)."""
    v = concrete(value)
    if v is not None and not bool(np.all(ok(v))):
        raise ValueError(f"{name}={value!r} is not allowed: {allowed}")


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    """Raise ValueError naming `name` when `value` is not one of `choices`."""
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not allowed: one of {list(choices)}")


def as_float(x: Any) -> jax.Array:
    """x as a jnp array of a float dtype: float32, or x's own dtype when that is wider."""
    x = jnp.asarray(x)
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))
