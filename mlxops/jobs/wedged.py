"""A rank that does not go away when killed: its node needs a reboot, and is left out.

A process still there after the stop's SIGKILL is stuck in the kernel (on a Mac: a wedged
GPU whose wired memory only a reboot frees), so relaunching the job there fails again.
Policy: the watchdog's restart records such a host as *needs reboot* (the record's
``needs_reboot``, a ``needs_reboot`` event and its notification) and keeps it as a stray
(its rank is stopped, and the host forgotten as one, once it can be); every later attempt
(a restart, ``mlxops resume``) leaves it out as ``resume --exclude`` does, and a job that
cannot go on without it fails saying so.
"""

from __future__ import annotations

from mlxops import events
from mlxops.jobs.record import JobRecord
from mlxops.node.protocol import StopAnswer
from mlxops.transport import Results

Wedged = dict[str, list[int | str]]  # host -> the ranks (or launcher) that survived SIGKILL


def survived_kill(results: Results) -> Wedged:
    """Hosts of a stop's ``results`` where a rank of the job was still there after SIGKILL."""
    return {host: list(result.value.alive) for host, result in results.items()
            if isinstance(result.value, StopAnswer) and result.value.alive}


def mark(current: JobRecord, wedged: Wedged) -> None:
    """Record the wedged hosts in ``current`` (under the record lock: an update's change)."""
    current.needs_reboot += [h for h in wedged if h not in current.needs_reboot]
    known = {h.name for h in current.stray}
    current.stray += [current.host(h) for h in wedged if h not in known]


def tell(name: str, attempt: int, wedged: Wedged) -> list[str]:
    """A ``needs_reboot`` event per wedged host; their messages, for the terminal."""
    said = []
    for host, alive in wedged.items():
        message = (f"{host} needs reboot: rank(s) {', '.join(map(str, alive))} survived "
                   "SIGKILL (a wedged GPU?); the job goes on without it")
        events.record(name, events.NEEDS_REBOOT, message, attempt=attempt, host=host,
                      ranks=alive)
        said.append(message)
    return said


def cannot_go_on(wedged: Wedged, why: object) -> str:
    return (f"{', '.join(wedged)} needs reboot (its ranks survived SIGKILL) and the job "
            f"cannot go on without it: {why}")


def excluded(record: JobRecord) -> list[str]:
    """The hosts an attempt after ``record`` leaves out: those excluded, and those that
    need a reboot (never relaunched onto)."""
    return [*record.excluded, *(h for h in record.needs_reboot if h not in record.excluded)]
