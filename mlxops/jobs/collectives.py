"""The collectives check, from the controller: each collective a job will trust with its
data, proven on its hosts and backend before the job starts.

``all_gather`` and ``send``/``recv`` have returned wrong data without an error on some
backends and MLX versions (ml-explore/mlx#4443: jaccl-ring ``all_gather`` wrong in
0.32.1-0.32.2; #3451: a JACCL all-reduce race). So before a job that uses them starts
(pre-flight, :func:`mlxops.jobs.preflight.verify_collectives`) and in ``mlxops check``,
``python -m mlxops.node.collectives`` runs on every rank of the job's hosts as an internal
job, ``mlxops-collectives``, through the job machinery itself (pre-flight, run files, the
ranks' environment for the backend, detached start, status, stop), as ``mlxops bench``'s
all-reduce does: the collectives checked are the ones the job's ranks will call. Each rank
sends values that name it; its answer (:class:`CollectivesAnswer`) lists what came back
wrong. A wrong answer anywhere refuses, in one line: the backend, the MLX version and
the first wrong answers (:func:`refusal`).

The check's ranks get the job's ``env:`` (backend settings such as ``MLX_RING_*`` change
how collectives run) and, as a test hook, the controller's
:data:`~mlxops.node.protocol.collectives.FAULT_ENV`. Whatever happens, its ranks are
stopped and its run directories and record removed before it returns.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from mlxops.errors import MlxopsError, UserError
from mlxops.jobs.internal import read_rank_files, wait_until_ended
from mlxops.jobs.jobdirs import job_dir
from mlxops.jobs.record import JobRecord, load_record
from mlxops.jobs.spec import JobSpec, RestartPolicy
from mlxops.jobs.stop import remove_run_dirs, stop_job
from mlxops.jobs.workloads.command import CommandWorkload
from mlxops.node.protocol.collectives import (
    COLLECTIVES_JOB,
    FAULT_ENV,
    CollectivesAnswer,
    collectives_args,
    collectives_result,
)
from mlxops.node.protocol.decode import ProtocolError
from mlxops.transport import Connector

OnEvent = Callable[[str], None]
#: ``launch(spec, connector, fresh=True)``: how the check's job starts (passed in by the
#: caller: pre-flight's caller is launch itself, which this module may not import).
Start = Callable[..., JobRecord]
PROGRAM = "mlxops.node.collectives"
#: The check takes about a second once the ranks are up: a rank silent this long hangs in
#: a collective (a broken backend can hang instead of answering wrong).
STALL_TIMEOUT = 120.0
POLL = 0.3
#: Wrong answers quoted in the refusal line, the rest counted.
QUOTED = 2


class CollectivesError(MlxopsError):
    """The check could not be run (its ranks failed, hung, or could not be read)."""


def job_spec(inventory: Path, hosts: str, backend: str, port: int, ops: Sequence[str],
             env: Mapping[str, str] | None = None) -> JobSpec:
    """The check as a job: ``command:`` the rank program, no restarts, the job's ``env``."""
    ranks_env = dict(env or {})
    if os.environ.get(FAULT_ENV):
        ranks_env[FAULT_ENV] = os.environ[FAULT_ENV]
    ranks_env.setdefault("PYTHONDONTWRITEBYTECODE", "1")  # leave the nodes' files alone
    return JobSpec(
        path=inventory.resolve(), name=COLLECTIVES_JOB, inventory=inventory.resolve(),
        hosts=hosts, backend=backend,
        workload=CommandWorkload(("python", "-m", PROGRAM, *collectives_args(tuple(ops)))),
        env=ranks_env,
        restart=RestartPolicy(max_restarts=0, stall_timeout=STALL_TIMEOUT,
                              start_timeout=STALL_TIMEOUT),
        port=port, stop_grace=2.0)


def refusal(answers: Sequence[CollectivesAnswer]) -> str:
    """One line naming the backend, the MLX version(s) and what came back wrong; "" when
    every answer is right."""
    wrong = [line for a in answers for line in a.wrong]
    if not wrong:
        return ""
    backends = sorted({a.backend for a in answers})
    versions = sorted({a.mlx for a in answers})
    more = f"; and {len(wrong) - QUOTED} more" if len(wrong) > QUOTED else ""
    return (f"the {'/'.join(backends)} backend (MLX {', '.join(versions)}) returned wrong "
            f"data: {'; '.join(wrong[:QUOTED])}{more}")


def run_check(spec: JobSpec, connector: Connector, start: Start, *,
              on_event: OnEvent = lambda _: None) -> list[tuple[str, CollectivesAnswer]]:
    """Run the check; every rank's host and answer, by rank. Raises
    :class:`CollectivesError` when it could not be run (the ranks stopped and everything
    removed first)."""
    _clear_earlier(connector, on_event)
    on_event(f"collectives: checking {' '.join(spec.workload.argv[4:])} on the "
             f"{spec.backend} backend")
    record = start(spec, connector, fresh=True)
    try:
        wait_until_ended(record, connector, poll=POLL, failed=lambda why: CollectivesError(
            f"the collectives check {why}"))
        return _read(record, connector)
    finally:
        stopped = stop_job(record, connector, grace=1.0, mark_stopped=False)
        if not stopped.exit_code:
            _forget(record, connector)


def _clear_earlier(connector: Connector, on_event: OnEvent) -> None:
    """Stop and forget a check whose controller did not finish."""
    try:
        record = load_record(COLLECTIVES_JOB)
    except UserError:
        return
    if not (isinstance(record.workload, CommandWorkload) and PROGRAM in record.workload.argv):
        raise MlxopsError(f"a job named {COLLECTIVES_JOB!r} exists and is not the collectives "
                          "check's: the name is mlxops' own; stop and rename that job")
    on_event("an earlier collectives check was left behind: stopping it")
    stop_job(record, connector, grace=1.0, mark_stopped=False).raise_on_failure(
        f"stopping the earlier {COLLECTIVES_JOB} job")
    _forget(record, connector)


def _read(record: JobRecord, connector: Connector) -> list[tuple[str, CollectivesAnswer]]:
    def parse(host: str, stdout: str) -> dict[int, CollectivesAnswer]:
        try:
            answers = [CollectivesAnswer.from_dict(json.loads(line))
                       for line in stdout.splitlines() if line.strip()]
        except (ValueError, ProtocolError) as exc:
            raise CollectivesError(f"{host}: unreadable collectives answer: {exc}") from None
        return {a.rank: a for a in answers}

    by_rank = read_rank_files(record, connector, collectives_result, parse,
                              what="the collectives answers", error=CollectivesError)
    missing = [r.rank for r in record.ranks if r.rank not in by_rank]
    if missing:
        raise CollectivesError(f"no collectives answer from ranks {missing}")
    return [(r.host, by_rank[r.rank]) for r in record.ranks]


def _forget(record: JobRecord, connector: Connector) -> None:
    """Remove the run directory on every host, then the record (once nothing runs)."""
    remove_run_dirs(record, connector)
    shutil.rmtree(job_dir(record.name), ignore_errors=True)
