"""The exceptions that map to mlxops' exit codes (docs/cli.md, "Exit codes"), and what is a bug.

0 all good; 2 bad input; 3 one or more hosts unreachable; 1 any other failure.
The CLI turns these into one line on stderr and the exit code, never a traceback. Exit 3
comes from per-host results (``mlxops.transport.results``): a host that cannot be reached
is a result, not an exception.

Any other exception (a ``KeyError``, a ``TypeError``, ...) is a bug in mlxops, not a
problem of the user's or of a host: it is reported as an *internal error* (exit 1) with the
hint to rerun with ``MLXOPS_DEBUG=1``, which prints the full tracebacks.
"""

from __future__ import annotations

import os

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_UNREACHABLE = 3

DEBUG_VARIABLE = "MLXOPS_DEBUG"
DEBUG_HINT = f"rerun with {DEBUG_VARIABLE}=1 for the traceback"


def debug() -> bool:
    """``MLXOPS_DEBUG`` is set (to anything but empty or 0): print full tracebacks."""
    return os.environ.get(DEBUG_VARIABLE, "") not in ("", "0")


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


class InternalError(Exception):
    """A bug met while working on hosts: the unexpected exception of one or more hosts.

    Deliberately not an :class:`MlxopsError`: nothing that handles a host's or a user's
    failure (a watchdog marking a job failed, a playbook dropping a host) may swallow it.
    ``errors`` maps each host to its exception; the first one (in the hosts' order) is the
    ``__cause__`` and names the message.
    """

    def __init__(self, errors: dict[str, BaseException]):
        host, exc = next(iter(errors.items()))
        others = len(errors) - 1
        more = f" (and on {others} more host{'s' if others > 1 else ''})" if others else ""
        super().__init__(f"{describe(exc)} on {host}{more}")
        self.errors = errors
        self.__cause__ = exc


def describe(exc: BaseException) -> str:
    """``KeyError: 'x'``: an exception in one line, its type first."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
