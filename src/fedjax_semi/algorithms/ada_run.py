"""What an Ada-FedSemi run does around its rounds (Xu et al., "Enhancing Federated Learning with
Server-Side Unlabeled Data by Adaptive Client and Data Selection"): the budgets and target of
Eq. 11 as the run loop's stop reasons, and the preference switch of Figs. 9-10 (alpha changes
once the test accuracy reaches a threshold) as a run-loop hook. Host-side code: it reads the
rows the loop makes of each round's metrics (engine.loop), never a compiled round.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_semi.algorithms.ada_fedsemi_config import AdaFedSemiConfig
from fedjax_semi.engine.loop import Hook, Rows, Run


def stop_reason(cfg: AdaFedSemiConfig, row: dict) -> str | None:
    """Eq. 11 as stop rules: the round's row says the time or traffic budget is spent
    (`over_time`, `over_traffic`: the cumulative simulated time / traffic reached it), or the
    validation accuracy reached the target with stop_on_target (`reached`)."""
    if row.get("over_time"):
        return (
            f"time budget spent: {row['cum_time_min']:.2f} simulated min >= "
            f"algorithm.time_budget_min={cfg.time_budget_min}"
        )
    if row.get("over_traffic"):
        return (
            f"traffic budget spent: {row['cum_traffic_gb']:.4f} GB >= "
            f"algorithm.traffic_budget_gb={cfg.traffic_budget_gb}"
        )
    if row.get("reached"):
        return (
            f"target reached: validation accuracy {row['val_acc']:.2f}% >= "
            f"algorithm.target_acc={cfg.target_acc} (stop_on_target)"
        )
    return None


class PreferenceSwitch(Hook):
    """Figs. 9-10's change of preference on the test accuracy: once replica r's evaluated test
    accuracy (its row's `metric`, a fraction) reaches `at`, its state's `switched` flag
    (`AdaState.switched`, bool [] or [R]) is set, so its later rounds weigh the cost with
    alpha_after (`AdaFedSemi.server_update`). Runs before the checkpointer, so a resumed run
    keeps the flag."""

    def __init__(self, at: float, metric: str = "accuracy") -> None:
        self.at, self.metric = at, metric

    def round(self, run: Run, rnd: int, rows: Rows) -> None:
        hit = [r for r, row in rows.items() if (row.get(self.metric) or -np.inf) >= self.at]
        if not hit:
            return
        flag = np.array(jax.device_get(run.state.switched))
        if flag.ndim == 0:  # a single run
            flag = np.asarray(True)
        else:  # replicas: [R]
            flag[hit] = True
        run.state = run.state.replace(switched=jnp.asarray(flag))
