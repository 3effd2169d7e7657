"""XLA's persistent compilation cache for runs (`hardware.compile_cache`).

A run compiles its round, its evaluation and its warm-up before the first round; with the cache
a repeated job (a resumed run, the next job of a sweep with the same shapes, the same preset
tomorrow) loads them from disk instead. JAX keys each entry by the program, the device, the
XLA flags and the versions, so a stale entry is never used.
"""

from __future__ import annotations

import os
from pathlib import Path

# What hardware.compile_cache accepts besides a directory.
AUTO, OFF = "auto", ("off", "none", "false", "")


def default_dir() -> Path:
    """`${XDG_CACHE_HOME:-~/.cache}/fedjax_semi/xla`, beside the datasets' cache."""
    from fedjax_semi.data.lookup import cache_root

    return cache_root() / "xla"


def cache_dir(setting: str | None) -> Path | None:
    """The directory `hardware.compile_cache` names: "auto" is $JAX_COMPILATION_CACHE_DIR when
    set (a user's or the test suite's), else `default_dir()`; null or "off" is no cache."""
    if setting is None or str(setting).lower() in OFF:
        return None
    if setting == AUTO:
        env = os.environ.get("JAX_COMPILATION_CACHE_DIR")
        return Path(env) if env else default_dir()
    return Path(setting).expanduser()


def enable(setting: str | None) -> str | None:
    """Point JAX's persistent cache at `cache_dir(setting)` (or turn it off) before anything
    compiles. Every program is cached, however short its compile: a run's small programs (the
    evaluation, the key splits) add up to seconds on a job's first round. Returns the directory
    used, or None."""
    import jax

    path = cache_dir(setting)
    if path is None:
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    path.mkdir(parents=True, exist_ok=True)
    if current() not in (None, str(path)):  # JAX opens its cache once per process: reopen it
        from jax._src import compilation_cache  # private; the lock pins the version

        compilation_cache.reset_cache()
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return str(path)


def current() -> str | None:
    """The directory compiled programs are cached in now, or None (summary.json records it)."""
    import jax

    if not jax.config.jax_enable_compilation_cache:
        return None
    return jax.config.jax_compilation_cache_dir or None
