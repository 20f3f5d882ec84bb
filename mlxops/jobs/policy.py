"""The job file's ``restart:`` and ``alerts:`` sections: what the watchdog does when a rank
dies or stalls, and what the monitor, the dashboard, the report and the timeline flag
(docs/job-file.md). Parsed by :func:`mlxops.jobs.spec.load_job`, kept in the job record.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from mlxops.errors import EXIT_BAD_INPUT, bad_input
from mlxops.node.protocol import FAILED

RESTART_KEYS = {"max_restarts", "stall_timeout", "poll_interval", "exclude_unreachable",
                "start_timeout"}
#: ``alerts:``: the thresholds ``mlxops monitor``, the dashboard and the report flag
#: (docs/job-file.md); 0 turns one off. Upper bound of each, and whether it is included.
ALERT_DEFAULTS = {"memory_share": 0.9, "tokens_per_sec_drop": 0.5, "heartbeat_age": 30.0,
                  "val_loss_rise": 0.02}
_ALERT_LIMITS = {"memory_share": (1.0, True, "a share of the node's memory from 0 to 1"),
                 "tokens_per_sec_drop": (1.0, False, "a fraction from 0 to below 1"),
                 "heartbeat_age": (float("inf"), False, "a number of seconds"),
                 "val_loss_rise": (float("inf"), False, "a fraction of the best "
                                   "validation loss")}


@dataclass(frozen=True)
class RestartPolicy:
    """The job file's ``restart:`` section: what the watchdog does (kept in the job record)."""

    max_restarts: int = 3
    stall_timeout: float = 60.0   # seconds without progress from any rank = stalled
    poll_interval: float = 0.0    # how often the watchdog looks; 0 = see `interval`
    exclude_unreachable: bool = False  # a restart may go on without hosts that are down
    #: Seconds a rank may take to its first heartbeat (cold MLX kernel compiles took 40-67 s
    #: on 2 cores here, and would trip a 60 s stall_timeout); never less than stall_timeout.
    start_timeout: float = 300.0

    @property
    def start_limit(self) -> float:
        """How long a rank without a heartbeat yet may go before it counts as stalled."""
        return max(self.start_timeout, self.stall_timeout)

    @property
    def interval(self) -> float:
        """Seconds between the watchdog's looks: ``poll_interval``, else often enough to
        notice a stall well within its timeout, at most twice a second."""
        if self.poll_interval:
            return self.poll_interval
        return max(0.5, min(2.0, self.stall_timeout / 10))


class _Ended(Protocol):
    """What :func:`not_restarted` reads of a rank (a :class:`jobs.status.RankStatus`)."""

    rank: int
    host: str
    state: str
    exit: int | None
    failure: str | None


def not_restarted(ranks: Iterable[_Ended]) -> str | None:
    """Why the job fails for good instead of being restarted, or None.

    A rank that exited with code 2 refused its input (the house's exit code for bad input:
    a config key, a file it names, a model that does not fit the method): the same input
    would be refused again on every attempt, so restarting only delays the error and uses
    up ``max_restarts``. The job fails with the rank's own error line.
    """
    for r in sorted(ranks, key=lambda r: r.rank):
        if r.state == FAILED and r.exit == EXIT_BAD_INPUT:
            said = f": {r.failure}" if r.failure else ""
            return (f"rank {r.rank} on {r.host} exited with code {EXIT_BAD_INPUT} (bad input, "
                    f"not restarted){said}")
    return None


def number(path: Path, key: str, value: Any, *, integer: bool = False,
            minimum: float = 0.0, allow_zero: bool = False) -> Any:
    ok = isinstance(value, int if integer else (int, float)) and not isinstance(value, bool)
    if not ok or value < minimum or (value == 0 and not allow_zero):
        kind = "integer" if integer else "number"
        qual = "non-negative" if allow_zero else "positive"
        raise bad_input(path, key, f"must be a {qual} {kind}, got {value!r}")
    return value


def flag(path: Path, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise bad_input(path, key, f"must be true or false, got {value!r}")
    return value


def parse_restart(path: Path, data: Any) -> RestartPolicy:
    if data is None:
        return RestartPolicy()
    if not isinstance(data, dict):
        raise bad_input(path, "restart", "must be a mapping (max_restarts, stall_timeout)")
    for key in data:
        if key not in RESTART_KEYS:
            raise bad_input(path, f"restart.{key}", "unknown key (known: "
                                                    f"{', '.join(sorted(RESTART_KEYS))})")
    d = RestartPolicy()
    return RestartPolicy(
        max_restarts=number(path, "restart.max_restarts", data.get("max_restarts",
                             d.max_restarts), integer=True, allow_zero=True),
        stall_timeout=float(number(path, "restart.stall_timeout",
                                    data.get("stall_timeout", d.stall_timeout))),
        poll_interval=float(number(path, "restart.poll_interval",
                                    data.get("poll_interval", d.poll_interval),
                                    allow_zero=True)),
        exclude_unreachable=flag(path, "restart.exclude_unreachable",
                                  data.get("exclude_unreachable", d.exclude_unreachable)),
        start_timeout=float(number(path, "restart.start_timeout",
                                    data.get("start_timeout", d.start_timeout))),
    )


def parse_alerts(path: Path, data: Any) -> dict[str, float]:
    if data is None:
        return dict(ALERT_DEFAULTS)
    if not isinstance(data, dict):
        raise bad_input(path, "alerts", "must be a mapping (memory_share, "
                                        "tokens_per_sec_drop, heartbeat_age, "
                                        "val_loss_rise)")
    out = dict(ALERT_DEFAULTS)
    for key, value in data.items():
        if key not in ALERT_DEFAULTS:
            raise bad_input(path, f"alerts.{key}", "unknown key (known: "
                                                   f"{', '.join(sorted(ALERT_DEFAULTS))})")
        top, inclusive, what = _ALERT_LIMITS[key]
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not value >= 0 or value > top or (value == top and not inclusive):
            raise bad_input(path, f"alerts.{key}", f"must be {what} (0: off), got {value!r}")
        out[key] = float(value)
    return out
