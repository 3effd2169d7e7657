"""The wireless constants checked in one place (a leaf module: `config` validates
`systems.hwn.*` and `systems.wireless.*` with it, and `systems.hwn.HwnSystem` too)."""

from __future__ import annotations

from typing import Any

from fedjax_semi.errors import bad, check_choice

HWN_FADINGS = ("rayleigh", "none")
HWN_BANDWIDTH_SHARES = ("dedicated", "share_selected")


def check_hwn(values: dict[str, Any]) -> None:
    """CFSL's wireless constants by their names (`systems.hwn.<name>`: config_groups.HwnSystems
    and `systems.hwn.HwnSystem`, which both call this): a bad value is one line naming
    systems.hwn.<name>."""
    check_choice("systems.hwn.fading", values["fading"], HWN_FADINGS)
    check_choice("systems.hwn.bandwidth_share", values["bandwidth_share"], HWN_BANDWIDTH_SHARES)
    check_range("systems.hwn.cpu_hz", values["cpu_hz"])
    check_range("systems.hwn.dist_m", values["dist_m"])
    p = values["power_dbm"]  # dBm may be negative: only low <= high
    if not (
        isinstance(p, list | tuple)
        and len(p) == 2
        and all(isinstance(v, int | float) for v in p)
        and p[0] <= p[1]
    ):
        raise bad("systems.hwn.power_dbm", p, "a pair [low, high] (dBm) with low <= high")
    number = lambda v: isinstance(v, int | float) and not isinstance(v, bool)
    for name in ("bandwidth_hz", "noise_w", "cycles_per_sample", "path_loss_exp", "d0_m",
                 "backhaul_bps"):  # fmt: skip
        if not (number(values[name]) and values[name] > 0):
            raise bad(f"systems.hwn.{name}", values[name], "a number > 0")
    for name in ("capacitance", "edge_power_w"):
        if not (number(values[name]) and values[name] >= 0):
            raise bad(f"systems.hwn.{name}", values[name], "a number >= 0")
    if not number(values["g0_db"]):
        raise bad("systems.hwn.g0_db", values["g0_db"], "a number (dB)")


WIRELESS_MODES = ("empirical", "shannon")


def check_range(key: str, value: Any) -> None:
    """A [low, high] pair with 0 < low <= high."""
    ok = isinstance(value, list | tuple) and len(value) == 2
    if not ok or not all(isinstance(v, int | float) for v in value) or not 0 < value[0] <= value[1]:
        raise bad(key, value, "a pair [low, high] with 0 < low <= high")
