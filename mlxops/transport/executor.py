"""The bounded parallel executor: one worker per host, at most ``forks`` at once.

An unreachable or failing host never stops the others: its exception becomes its result.
Only the failures a host can cause are a host's result: :class:`HostUnreachable` (and the
host-key errors) makes it *unreachable*; an :class:`MlxopsError`, an SSH (paramiko) error
or an ``OSError``/``EOFError`` makes it *failed*, its message ``Type: message``.

Any other exception (``KeyError``, ``TypeError``, ``AttributeError``, ...) is a bug in
mlxops, and a bug is not a host failure: it aborts the operation instead of being counted
into "3 of 8 hosts failed" (where a watchdog would take the host for down, or a playbook
would go on without it). Hosts already in flight finish (their commands are under way);
hosts not started yet are not started; then :class:`mlxops.errors.InternalError` is raised,
naming each host's exception. With ``MLXOPS_DEBUG=1`` each host's traceback is printed to
stderr as it happens.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, TypeVar

from mlxops.errors import InternalError, MlxopsError, debug, describe
from mlxops.transport.hostkeys import HostUnreachable
from mlxops.transport.results import FAILED, OK, UNREACHABLE, HostResult, Results

H = TypeVar("H")
MAX_FORKS = 32


def host_failures() -> tuple[type[BaseException], ...]:
    """What a host (or the user's input about it) can cause; anything else is a bug.

    paramiko's SSHException counts once paramiko is imported (by the first SSH
    connection); before that no host can have raised one, and start-up stays without it.
    """
    paramiko = sys.modules.get("paramiko")
    ssh = (paramiko.SSHException,) if paramiko is not None else ()
    return (MlxopsError, *ssh, OSError, EOFError)


def default_forks(n_hosts: int) -> int:
    return max(1, min(MAX_FORKS, n_hosts))


def failure_result(host: str, exc: BaseException) -> HostResult | None:
    """The result an exception of ``host``'s work stands for; None when it is a bug."""
    if isinstance(exc, HostUnreachable):
        return HostResult(host, UNREACHABLE, exc.reason)
    if isinstance(exc, host_failures()):
        return HostResult(host, FAILED, f"{type(exc).__name__}: {exc}")
    return None


def run_parallel(
    hosts: Sequence[H],
    work: Callable[[H], Any],
    *,
    forks: int | None = None,
    on_result: Callable[[HostResult], None] | None = None,
    name: Callable[[H], str] = lambda h: h.name,  # type: ignore[attr-defined]
) -> Results:
    """Run ``work(host)`` for every host, ``forks`` at a time; results in the hosts' order.

    ``work`` returns the host's HostResult, or any other value: an OK result carrying it
    as its ``value``. Raises :class:`InternalError` when ``work`` raised something no host
    can cause (a bug).
    """
    forks = forks or default_forks(len(hosts))
    done: dict[str, HostResult] = {}
    bugs: dict[str, BaseException] = {}
    lock = threading.Lock()

    def guarded(host: H) -> HostResult | None:
        if bugs:
            return None  # a bug aborts the operation: start nothing more
        start = time.monotonic()
        try:
            result = work(host)
            if not isinstance(result, HostResult):
                result = HostResult(name(host), OK, value=result)
        except Exception as exc:  # noqa: BLE001 - sorted below: a host's failure, or a bug
            result = failure_result(name(host), exc)
            if result is None:
                _internal(name(host), exc, bugs, lock)
                return None
        if not result.duration:
            result.duration = time.monotonic() - start
        return result

    if not hosts:
        return Results({})
    with ThreadPoolExecutor(max_workers=forks, thread_name_prefix="mlxops-host") as pool:
        futures = {pool.submit(guarded, h): name(h) for h in hosts}
        for future in as_completed(futures):
            result = future.result()
            if result is None:
                continue
            done[futures[future]] = result
            if on_result is not None:
                on_result(result)
    if bugs:
        raise InternalError({name(h): bugs[name(h)] for h in hosts if name(h) in bugs})
    return Results({name(h): done[name(h)] for h in hosts})


def _internal(host: str, exc: BaseException, bugs: dict[str, BaseException],
              lock: threading.Lock) -> None:
    with lock:
        bugs[host] = exc
        if debug():
            text = "".join(traceback.format_exception(exc))
            sys.stderr.write(f"mlxops: internal error on {host}: {describe(exc)}\n{text}")
            sys.stderr.flush()
