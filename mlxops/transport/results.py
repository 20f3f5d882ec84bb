"""A command's result, per-host results keyed by host name, and the one exception that
carries them.

Like Fabric's GroupResult: every host has a result whatever happened to the others, a
result carries what the work returned for its host (``value``), and a failure anywhere can
be raised as :class:`GroupError` without losing the partial results.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from mlxops.errors import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, MlxopsError
from mlxops.node.protocol import FAILED, UNREACHABLE

# A host's result status (not a job's or a rank's state): ok, changed, skipped, and the two
# words it shares with job states, failed and unreachable (mlxops.node.protocol spells them).
OK, CHANGED, SKIPPED = "ok", "changed", "skipped"
__all__ = ["CHANGED", "FAILED", "OK", "SKIPPED", "UNREACHABLE", "CommandResult", "GroupError",
           "HostResult", "Results", "failure_line"]


@dataclass(frozen=True)
class CommandResult:
    command: str
    exit_code: int
    stdout: str
    stderr: str
    duration: float
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def error_line(self) -> str:
        """Why the command failed, in one line: ``exit 2: <last line>``, the last line of
        stderr, else of stdout; ``exit 2`` alone when it printed nothing.

        The one way every caller words a failed command (a failing node command usually
        ends with the line that says why: a Python exception, a shell's complaint).
        """
        return failure_line(self.exit_code, self.stdout, self.stderr, self.timed_out)


def failure_line(exit_code: int, stdout: str, stderr: str, timed_out: bool = False) -> str:
    """:meth:`CommandResult.error_line` for any command's output (e.g. a local subprocess)."""
    code = f"exit {exit_code}" + (" (timed out)" if timed_out else "")
    for text in (stderr, stdout):
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if lines:
            return f"{code}: {lines[-1]}"
    return code



@dataclass
class HostResult:
    """One host's result. ``value``: what the work returned for this host (a work function
    that returns a plain value gets it wrapped as an OK result with that value);
    ``data``: details for people and ``--json`` output."""

    host: str
    status: str = OK
    message: str = ""
    command: CommandResult | None = None
    duration: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)
    value: Any = None

    @property
    def succeeded(self) -> bool:
        return self.status in (OK, CHANGED, SKIPPED)


class Results(Mapping[str, HostResult]):
    """Results of one operation on a set of hosts, in inventory order."""

    def __init__(self, results: Mapping[str, HostResult]):
        self._results = dict(results)

    def __getitem__(self, host: str) -> HostResult:
        return self._results[host]

    def __iter__(self) -> Iterator[str]:
        return iter(self._results)

    def __len__(self) -> int:
        return len(self._results)

    def with_status(self, *statuses: str) -> list[str]:
        return [h for h, r in self._results.items() if r.status in statuses]

    @property
    def succeeded(self) -> list[str]:
        return self.with_status(OK, CHANGED, SKIPPED)

    @property
    def failed(self) -> list[str]:
        return self.with_status(FAILED)

    @property
    def unreachable(self) -> list[str]:
        return self.with_status(UNREACHABLE)

    def succeeded_values(self) -> dict[str, Any]:
        """The ``value`` of every host that succeeded, in host order."""
        return {h: r.value for h, r in self._results.items() if r.succeeded}

    @property
    def exit_code(self) -> int:
        """3 when any host is unreachable, else 1 when any failed, else 0 (docs/cli.md,
        "Exit codes")."""
        if self.unreachable:
            return EXIT_UNREACHABLE
        if self.failed:
            return EXIT_FAILED
        return EXIT_OK

    def raise_on_failure(self, what: str) -> None:
        if self.exit_code != EXIT_OK:
            raise GroupError(what, self)


class GroupError(MlxopsError):
    """Some hosts failed or were unreachable; ``results`` holds every host's result."""

    def __init__(self, what: str, results: Results):
        bad = results.unreachable + results.failed
        details = "; ".join(f"{h}: {results[h].message or results[h].status}" for h in bad[:5])
        more = f" (+{len(bad) - 5} more)" if len(bad) > 5 else ""
        super().__init__(f"{what} failed on {len(bad)} of {len(results)} hosts: {details}{more}")
        self.results = results
        self.exit_code = results.exit_code
