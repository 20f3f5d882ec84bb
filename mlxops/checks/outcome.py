"""How a check says what it found, and what a host that could not be asked is.

A failing check raises :class:`NotReady`: one line, ``host: what was found (against what
was expected): how to fix it``, e.g. ``mac2: mlx 0.31.0, controller 0.32.4: run mlxops
provision``. That line is the table's failure line, the JUnit message and the ``--json``
message. A host mlxops could not reach makes every check of it an error, not a failure:
:class:`Unreachable`, raised while the check is set up.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlxops.transport.results import FAILED, SKIPPED, UNREACHABLE

# The outcomes of one check on one host (``--json``, the table): pytest's two words of its
# own, passed and error (a check that broke, not a finding), and a host result's failed,
# skipped and unreachable (mlxops.transport.results spells them, for every command).
PASSED, ERROR = "passed", "error"
OUTCOMES = (PASSED, FAILED, SKIPPED, ERROR, UNREACHABLE)


class NotReady(AssertionError):
    """A check's finding on a host, in one line."""

    def __init__(self, host: str, found: str, fix: str = ""):
        self.host, self.found, self.fix = host, found, fix
        self.line = f"{host}: {found}: {fix}" if fix else f"{host}: {found}"
        super().__init__(self.line)


class Unreachable(Exception):
    """The host could not be reached: its checks error instead of running."""

    def __init__(self, host: str, reason: str):
        self.host, self.reason = host, reason
        super().__init__(f"{host}: unreachable: {reason}")


@dataclass
class CheckResult:
    """One test's outcome: ``check`` (its function's name) on ``host`` (None: not per
    host), and its one-line message when it did not pass."""

    check: str
    host: str | None
    outcome: str
    message: str = ""
    module: str = ""
    line: int = 0
