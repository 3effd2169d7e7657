"""The one error a bad setting raises, and the one message style: `key=value is not allowed: ...`.

A leaf module (it imports nothing from the package), so configs, data, models, kernels and
systems all raise the same error with the same wording.
"""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A config value that is not allowed; the message names key, value and the allowed values."""


def bad(key: str, value: Any, allowed: str) -> ConfigError:
    """`ConfigError("key=value is not allowed: allowed")`, one line."""
    return ConfigError(f"{key}={value!r} is not allowed: {allowed}")


def check_choice(key: str, value: Any, allowed: tuple[str, ...]) -> None:
    """`value` is one of `allowed`, else `bad(key, value, "one of [...]")`."""
    if value not in allowed:
        raise bad(key, value, f"one of {list(allowed)}")
