"""An internal job's end, seen from the controller: mlxops' own short jobs (the bench's
all-reduce sweep, :mod:`mlxops.bench.allreduce`; the collectives check,
:mod:`mlxops.jobs.collectives`) run through the job machinery and each rank writes one
result file in its run directory.

Followed by status until it has finished: any other state (failed, stalled, stopped) or an
unreachable host ends the wait with the caller's error, naming the state and why (the
job's problem, which carries the line of a failed rank's log that says why, else its
message, else the unreachable hosts). Then every rank's file is read, one ``cat`` a host,
all hosts at once, and parsed by the caller into results by rank.

How often: each look is a ``status`` on every host, a Python start on each node, on the
same cores as the ranks it waits for. So the looks thin out while the job runs
(:func:`next_poll`): the caller's ``poll`` first, each wait :data:`POLL_GROWTH` times the
one before, never more than :data:`POLL_MAX`. A job that ends within a second is seen as
soon as before; one whose ranks take ten seconds to start on a busy machine is looked at
~9 times instead of ~33 at 0.3 s (the checks' all-sum and collectives jobs; ``sum_{k<n}
0.3 * 1.5^k`` passes 10 s at n = 7, then every 2 s), and no end is seen more than
:data:`POLL_MAX` late.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from mlxops import shell
from mlxops.errors import MlxopsError
from mlxops.jobs.record import JobRecord, inventory_hosts
from mlxops.jobs.status import job_status
from mlxops.node.protocol import FINISHED, RUNNING
from mlxops.transport import Connector, run_parallel

T = TypeVar("T")
POLL_GROWTH = 1.5
POLL_MAX = 2.0


def next_poll(poll: float, first: float) -> float:
    """The wait after a look that waited ``poll``, in a wait that began at ``first``:
    ``first`` grown by :data:`POLL_GROWTH` a look, up to :data:`POLL_MAX` (or ``first``
    when that is longer)."""
    return max(first, min(poll * POLL_GROWTH, POLL_MAX))


def wait_until_ended(record: JobRecord, connector: Connector, *, poll: float,
                     failed: Callable[[str], MlxopsError],
                     on_step: Callable[[int], None] = lambda _: None) -> None:
    """Return once the job has finished; raise ``failed("<state>: <why>")`` once it is
    anything but running or a host is unreachable. ``on_step`` hears each new step.
    ``poll``: the first wait between looks (they grow: :func:`next_poll`)."""
    last, wait = -1, poll
    while True:
        status = job_status(record, connector)
        if status.state == FINISHED:
            return
        if status.state != RUNNING or status.unreachable:
            why = status.problem or status.message or ", ".join(
                f"{h}: {r}" for h, r in status.unreachable.items()) or status.state
            raise failed(f"{status.state}: {why}")
        if status.step is not None and status.step != last:
            last = status.step
            on_step(last)
        time.sleep(wait)
        wait = next_poll(wait, poll)


def read_rank_files(record: JobRecord, connector: Connector,
                    result_file: Callable[[int], str],
                    parse: Callable[[str, str], dict[int, T]], *, what: str,
                    error: type[MlxopsError] = MlxopsError) -> dict[int, T]:
    """Every rank's file ``result_file(rank)`` in the job's run directory, by rank:
    ``parse(host, stdout)`` reads one host's (its ranks' files, one after the other). A
    host that cannot be read raises ``error("reading <what>: <why>")``."""
    hosts = {h.name: h for h in record.hosts}
    inv = inventory_hosts(record)

    def work(host) -> dict[int, T]:
        files = [hosts[host.name].paths(record.name).run_file(result_file(r.rank))
                 for r in record.ranks_on(host.name)]
        result = connector.connect(host).run(shell.join(["cat", *files]), timeout=60)
        if not result.ok:
            raise error(f"reading {what}: {result.error_line()}")
        return parse(host.name, result.stdout)

    results = run_parallel([inv[name] for name in hosts], work)
    results.raise_on_failure(f"reading {what}")
    return {r: v for found in results.succeeded_values().values() for r, v in found.items()}
