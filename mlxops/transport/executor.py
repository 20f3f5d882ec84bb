"""The bounded parallel executor: one worker per host, at most ``forks`` at once.

An unreachable or failing host never stops the others: its exception becomes its result.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, TypeVar

from mlxops.transport.hostkeys import HostUnreachable
from mlxops.transport.results import FAILED, OK, UNREACHABLE, HostResult, Results

H = TypeVar("H")
MAX_FORKS = 32


def default_forks(n_hosts: int) -> int:
    return max(1, min(MAX_FORKS, n_hosts))


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
    as its ``value``.
    """
    forks = forks or default_forks(len(hosts))
    done: dict[str, HostResult] = {}

    def guarded(host: H) -> HostResult:
        start = time.monotonic()
        try:
            result = work(host)
            if not isinstance(result, HostResult):
                result = HostResult(name(host), OK, value=result)
        except HostUnreachable as exc:
            result = HostResult(name(host), UNREACHABLE, exc.reason)
        except Exception as exc:  # noqa: BLE001 - a host's failure is its result, not ours
            result = HostResult(name(host), FAILED, f"{type(exc).__name__}: {exc}")
        if not result.duration:
            result.duration = time.monotonic() - start
        return result

    if not hosts:
        return Results({})
    with ThreadPoolExecutor(max_workers=forks, thread_name_prefix="mlxops-host") as pool:
        futures = {pool.submit(guarded, h): name(h) for h in hosts}
        for future in as_completed(futures):
            result = future.result()
            done[futures[future]] = result
            if on_result is not None:
                on_result(result)
    return Results({name(h): done[name(h)] for h in hosts})
