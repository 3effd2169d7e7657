"""hardware=multi_host: JAX's multi-process runtime (`jax.distributed`), one process per host
(or per GPU), the client axis sharded over every process's devices.

Where the processes meet comes from the environment, read once by `initialize`, which must run
before anything starts a JAX backend (experiment.build calls it first):

- FEDJAX_SEMI_COORDINATOR (host:port of process 0), FEDJAX_SEMI_NUM_PROCESSES and
  FEDJAX_SEMI_PROCESS_ID, all three or none;
- none of them: JAX's own cluster detection, which reads SLURM's variables under `srun`
  (SLURM_JOB_ID, SLURM_STEP_NODELIST, SLURM_NTASKS, SLURM_PROCID, SLURM_LOCALID; coordinator:
  the step's first node, a port derived from the job id, or JAX_COORDINATOR_PORT), Open MPI's
  and Kubernetes', and JAX_COORDINATOR_ADDRESS. Under SLURM on GPUs JAX gives each process the
  one GPU of its SLURM_LOCALID (one task per GPU; JAX_LOCAL_DEVICE_IDS overrides that).

On CPU the processes' collectives go through gloo (TCP), JAX's default, set explicitly here.
Every process runs the same program on replicated data and state; only process 0 writes the run
directory's files (`is_primary`), and Orbax's checkpointer is called by all of them (it
coordinates: process 0 writes the metadata and the replicated arrays).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from fedjax_semi.errors import bad

ENV = ("FEDJAX_SEMI_COORDINATOR", "FEDJAX_SEMI_NUM_PROCESSES", "FEDJAX_SEMI_PROCESS_ID")

KEY = "hardware.distributed"


def settings(environ: Mapping[str, str]) -> dict:
    """The arguments of jax.distributed.initialize that the FEDJAX_SEMI_* variables give: all
    three, or {} (none set: JAX detects the cluster). One line naming the problem otherwise."""
    given = {k: environ[k] for k in ENV if environ.get(k)}
    if not given:
        return {}
    if len(given) < len(ENV):
        missing = [k for k in ENV if k not in given]
        raise bad(KEY, True, f"set all of {list(ENV)} or none (missing {missing})")
    coordinator, n, i = (given[k] for k in ENV)
    if ":" not in coordinator:
        raise bad(KEY, True, f"FEDJAX_SEMI_COORDINATOR={coordinator!r} must be host:port")
    try:
        n, i = int(n), int(i)
    except ValueError:
        raise bad(
            KEY,
            True,
            f"FEDJAX_SEMI_NUM_PROCESSES={n!r} and FEDJAX_SEMI_PROCESS_ID={i!r} must be integers",
        ) from None
    if not (n >= 1 and 0 <= i < n):
        raise bad(
            KEY,
            True,
            f"FEDJAX_SEMI_PROCESS_ID={i} must lie in [0, FEDJAX_SEMI_NUM_PROCESSES={n})",
        )
    return {"coordinator_address": coordinator, "num_processes": n, "process_id": i}


def initialize(environ: Mapping[str, str] | None = None) -> None:
    """Join the run's processes (once per process; a second call does nothing). Raises a
    ConfigError when the environment names no cluster or JAX has already started."""
    import jax

    if jax.distributed.is_initialized():
        return
    kwargs = settings(os.environ if environ is None else environ)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(**kwargs)
    except (ValueError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise bad(
            KEY,
            True,
            f"jax.distributed.initialize failed ({first}); under srun JAX reads SLURM's variables, "
            f"elsewhere set {', '.join(ENV)}, before anything starts JAX",
        ) from None


def is_primary() -> bool:
    """Whether this process writes the run directory's files (process 0; the only one without
    jax.distributed)."""
    import jax

    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Wait until every process gets here (nothing with one process)."""
    import jax

    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def agree(text: str) -> str:
    """Process 0's `text` in every process (a run directory named by each process's clock)."""
    import jax

    if jax.process_count() == 1:
        return text
    import numpy as np
    from jax.experimental.multihost_utils import broadcast_one_to_all

    data = np.frombuffer(text.encode(), np.uint8)
    n = int(broadcast_one_to_all(np.int32(len(data))))
    buf = data if is_primary() else np.zeros(n, np.uint8)
    return bytes(np.asarray(broadcast_one_to_all(buf), np.uint8)).decode()
