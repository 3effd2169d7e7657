"""The TX2 clients' constants checked in one place (a leaf module: `config` validates
`systems.tx2.*` with it, and `systems.tx2.Tx2System` too)."""

from __future__ import annotations

from typing import Any

from fedjax_semi.errors import bad


def check_tx2(values: dict[str, Any]) -> None:
    """The TX2 constants by their names (`systems.tx2.<name>`: config_groups.Tx2Systems and
    `systems.tx2.Tx2System`, which both call this): one line naming systems.tx2.<name>."""
    number = lambda v: isinstance(v, int | float) and not isinstance(v, bool)
    positive = lambda vs: (
        isinstance(vs, list | tuple) and len(vs) > 0 and all(number(v) and v > 0 for v in vs)
    )
    if not positive(values["speeds"]):
        raise bad("systems.tx2.speeds", values["speeds"], "a non-empty list of speeds > 0")
    shares, bw = values["group_shares"], values["group_bw_mbps"]
    if not (positive(shares) and abs(sum(shares) - 1.0) < 1e-6):
        raise bad("systems.tx2.group_shares", shares, "a list of shares > 0 that sum to 1")
    if not (positive(bw) and len(bw) == len(shares)):
        raise bad(
            "systems.tx2.group_bw_mbps", bw, f"{len(shares)} bandwidths > 0 (MB/s), one a group"
        )
    period = values["mode_period"]
    if not (isinstance(period, int) and not isinstance(period, bool) and period >= 1):
        raise bad("systems.tx2.mode_period", period, "an integer >= 1 (rounds)")
    for name in ("bw_sigma", "overhead_s"):
        if not (number(values[name]) and values[name] >= 0):
            raise bad(f"systems.tx2.{name}", values[name], "a number >= 0")
    if not (number(values["compute_full_s"]) and values["compute_full_s"] > 0):
        raise bad("systems.tx2.compute_full_s", values["compute_full_s"], "seconds > 0")
