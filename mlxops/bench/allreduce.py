"""The all-reduce sweep: ``python -m mlxops.node.allreduce`` on every rank, started as jobs
start ranks, followed to its end, its results read, then removed.

It runs as an internal job named ``mlxops-bench`` (:data:`BENCH_JOB`) through the job
machinery itself: pre-flight, run files, the ranks' environment for the inventory's backend
(``mlxops_backend``, else ring), detached start, status, stop. So the all-reduce is the one
training would see: same backend, same placement, same ports rule. Its ring ports start two
above the bench's port (the server and iperf3 have the first two). While it runs,
``mlxops status mlxops-bench`` shows it and ``mlxops stop mlxops-bench`` stops it; a bench
that finds the record of an earlier one (its controller killed) stops that first. Whatever
happens (a failure, Ctrl-C), its ranks are stopped before the bench returns, and the run
directory and the record are removed once nothing of it runs.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from mlxops.bench.results import AllreduceRow, allreduce_rows, gather_factor
from mlxops.errors import MlxopsError, UserError
from mlxops.jobs.internal import read_rank_files, wait_until_ended
from mlxops.jobs.jobdirs import job_dir
from mlxops.jobs.launch import launch
from mlxops.jobs.record import JobRecord, load_record
from mlxops.jobs.spec import JobSpec, RestartPolicy
from mlxops.jobs.stop import remove_run_dirs, stop_job
from mlxops.jobs.workloads.command import CommandWorkload
from mlxops.node.protocol.bench import BENCH_JOB, allreduce_result
from mlxops.transport import Connector

OnEvent = Callable[[str], None]
PROGRAM = "mlxops.node.allreduce"
STALL_TIMEOUT = 180.0     # a rank beats after every warm-up, size and 5 s of timed calls
POLL = 0.5


class LeftRunning(MlxopsError):
    """The sweep's ranks could not all be stopped: its run directories and record stay, so
    that ``mlxops stop mlxops-bench`` can finish the job."""


def job_spec(inventory: Path, hosts: str, backend: str, port: int,
             sizes: Sequence[int], budget: float = 0.0) -> JobSpec:
    """The sweep as a job: ``command:`` the rank program, no restarts; with ``budget``
    (seconds), the ranks stop growing the size once the next would not fit it."""
    within = ["--budget", f"{budget:.1f}"] if budget > 0 else []
    return JobSpec(
        path=inventory.resolve(), name=BENCH_JOB, inventory=inventory.resolve(), hosts=hosts,
        backend=backend,
        workload=CommandWorkload(("python", "-m", PROGRAM, "--sizes", *map(str, sizes),
                                  *within)),
        restart=RestartPolicy(max_restarts=0, stall_timeout=STALL_TIMEOUT,
                              start_timeout=STALL_TIMEOUT),
        port=port, stop_grace=2.0)


def clear_earlier(connector: Connector, on_event: OnEvent) -> None:
    """Stop and forget the sweep of an earlier bench whose controller did not finish."""
    try:
        record = load_record(BENCH_JOB)
    except UserError:
        return
    ours = isinstance(record.workload, CommandWorkload) and PROGRAM in record.workload.argv
    if not ours:
        raise MlxopsError(f"a job named {BENCH_JOB!r} exists and is not a bench's: the name is "
                          "mlxops bench's own; stop and rename that job")
    on_event("an earlier bench's all-reduce was left behind: stopping it")
    results = stop_job(record, connector, grace=1.0, mark_stopped=False)
    results.raise_on_failure(f"stopping the earlier {BENCH_JOB} job")
    _forget(record, connector)


def sweep(spec: JobSpec, connector: Connector, *, exclude: Sequence[str] = (),
          on_event: OnEvent = lambda _: None
          ) -> tuple[list[AllreduceRow], list[AllreduceRow], int]:
    """Run the sweep; ``(all_sum rows, all_gather rows, ranks)``. Raises MlxopsError when
    it could not be run (the ranks are stopped and everything removed first)."""
    clear_earlier(connector, on_event)
    on_event(f"all-reduce: starting {BENCH_JOB} ({spec.backend})")
    record = launch(spec, connector, exclude=exclude, fresh=True)
    try:
        wait_until_ended(record, connector, poll=POLL,
                         failed=lambda why: MlxopsError(f"all-reduce {why}"),
                         on_step=lambda n: on_event(f"all-reduce: {n} size(s) done"))
        per_rank = _read(record, connector)
    finally:
        stopped = stop_job(record, connector, grace=1.0, mark_stopped=False)
        if stopped.exit_code:
            raise LeftRunning(f"{BENCH_JOB}: ranks may still run ({_why(stopped)}); "
                              f"run 'mlxops stop {BENCH_JOB}'")
        _forget(record, connector)
    n = record.world_size
    return (allreduce_rows([d["results"] for d in per_rank], n),
            allreduce_rows([d.get("all_gather", []) for d in per_rank], n, gather_factor), n)


def _read(record: JobRecord, connector: Connector) -> list[dict]:
    """Every rank's ``allreduce-rank-<r>.json``, by rank."""
    def parse(_host: str, stdout: str) -> dict[int, dict]:
        try:
            docs = [json.loads(line) for line in stdout.splitlines() if line.strip()]
            return {int(d["rank"]): d for d in docs}
        except (ValueError, KeyError, TypeError) as exc:
            raise MlxopsError(f"unreadable all-reduce results: {exc}") from None

    by_rank = read_rank_files(record, connector, allreduce_result, parse,
                              what="the all-reduce results")
    missing = [r.rank for r in record.ranks if r.rank not in by_rank]
    if missing:
        raise MlxopsError(f"no all-reduce results from ranks {missing}")
    return [by_rank[r.rank] for r in record.ranks]


def _forget(record: JobRecord, connector: Connector) -> None:
    """Remove the run directory on every host, then the record (once nothing runs)."""
    results = remove_run_dirs(record, connector)
    shutil.rmtree(job_dir(record.name), ignore_errors=True)
    if results.exit_code:
        raise MlxopsError(f"removing {BENCH_JOB}'s run directories: {_why(results)}")


def _why(results) -> str:
    return "; ".join(f"{h}: {results[h].message or results[h].status}"
                     for h in results.unreachable + results.failed)
