"""The exceptions that map to mlxops' exit codes (DESIGN.md, "Commands").

0 all good; 2 bad input; 3 one or more hosts unreachable; 1 any other failure.
The CLI turns these into one line on stderr and the exit code, never a traceback. Exit 3
comes from per-host results (``mlxops.transport.results``): a host that cannot be reached
is a result, not an exception.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_UNREACHABLE = 3


class MlxopsError(Exception):
    """A failure the user should read as one line; exit code 1."""

    exit_code = EXIT_FAILED


class UserError(MlxopsError):
    """Bad input: an unreadable or invalid file or argument; exit code 2.

    Build it with :func:`bad_input` so that the message always names the file and the key.
    """

    exit_code = EXIT_BAD_INPUT


def bad_input(path: object, key: str | None, problem: str) -> UserError:
    """``inventory.yml: all.hosts.mac1.mlxops_slots: must be a positive integer``."""
    where = f"{path}: {key}: " if key else f"{path}: "
    return UserError(f"{where}{problem}")
