"""Runtime configuration: one frozen dataclass read from ``DDL_*`` environment variables.

This is the only module that reads ``os.environ``; the launcher maps its flags to these
variables through :data:`LAUNCHER_FLAGS`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

DEFAULT_SEGMENT_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True)
class Config:
    """Settings fixed at ``ddl.init()``.

    Attributes:
        topology: multi-ring dims spec (``"4x16"``) or None to discover from hosts.
        algorithm: default allreduce algorithm name (``"auto"``).
        segment_bytes: largest single message; bounds the scratch buffer per rank.
        abort_on_exception: an uncaught exception on one rank aborts the whole job.
        hostname: overrides the host name used to group ranks into hosts (tests,
            containers that share a host name).
        verbose: print the chosen topology and algorithms on rank 0.
    """

    topology: str | None = None
    algorithm: str = "auto"
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    abort_on_exception: bool = True
    hostname: str | None = None
    verbose: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Config:
        """Read the configuration from ``env`` (default: the process environment).

        Raises:
            ValueError: a variable holds a value of the wrong form; the message names it.
        """
        env = os.environ if env is None else env
        return cls(
            topology=_str(env, "DDL_TOPOLOGY"),
            algorithm=_str(env, "DDL_ALGORITHM") or "auto",
            segment_bytes=_positive_int(env, "DDL_SEGMENT_BYTES", DEFAULT_SEGMENT_BYTES),
            abort_on_exception=_bool(env, "DDL_ABORT_ON_EXCEPTION", True),
            hostname=_str(env, "DDL_HOSTNAME"),
            verbose=_bool(env, "DDL_VERBOSE", False),
        )


# ddlrun flag (its argparse dest) -> environment variable read above.
LAUNCHER_FLAGS: dict[str, str] = {
    "topology": "DDL_TOPOLOGY",
    "algorithm": "DDL_ALGORITHM",
    "segment_bytes": "DDL_SEGMENT_BYTES",
    "verbose": "DDL_VERBOSE",
}


def _str(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name, "").strip()
    return value or None


def _positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a whole number of bytes; set e.g. {name}={default}") from None
    if value <= 0:
        raise ValueError(f"{name}={raw!r} must be positive; set e.g. {name}={default}")
    return value


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={raw!r} is not a boolean; use 1 or 0")
