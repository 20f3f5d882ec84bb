"""The selftest's job: the bundled trainer on every host, one rank killed, the watchdog's
recovery, then the stop and the clean-up.

The job is an internal one named ``mlxops-selftest`` (:data:`NAME`), run through the job
machinery itself: launch (pre-flight, run files, detached ranks), the watchdog
(:func:`mlxops.jobs.watch.supervise`), stop. So it is what a user's job meets: same
backend (``mlxops_backend``, else ring), same placement, same ports rule.

The policy:

- **The kill.** Once every rank has passed step :data:`KILL_AFTER` (so a checkpoint
  exists), the last rank (on the last host, not rank 0's when there are two hosts) gets
  ``kill -9`` over SSH: its trainer process, whose pid the rank's own heartbeat names, and
  only if that process is still the child of the rank's start script (a pid never reused
  by something else is killed).
- **Recovered** means: the watchdog stopped the other ranks, restarted the job from the
  newest checkpoint every node has, and every rank of the new attempt made a step. The
  restart's reason must name the killed rank (the watchdog's diagnosis is under test too).
  Then the selftest stops following; the job is still running for :func:`stop_and_remove`.
- **A bound.** :data:`STEPS` steps, so a job whose controller died mid-selftest ends by
  itself (a few seconds to minutes of training); ``mlxops stop mlxops-selftest`` stops it
  sooner, and the next selftest stops it first.
- **Nothing left.** :func:`stop_and_remove` stops every rank (a user's stop, verified: no
  process of the job alive, its ports free) and removes the run directory on every host and
  the controller's record, unless told to keep them (``--keep``: for ``mlxops logs`` and
  ``mlxops report mlxops-selftest``).
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from mlxops import shell
from mlxops.errors import MlxopsError, UserError
from mlxops.jobs.launch import launch
from mlxops.jobs.logs import fetch
from mlxops.jobs.record import (
    JobRecord,
    job_dir,
    load_record,
    supervisor_lock,
)
from mlxops.jobs.spec import JobSpec, RestartPolicy, check_world
from mlxops.jobs.status import JobStatus
from mlxops.jobs.stop import remove_run_dirs, stop_job
from mlxops.jobs.watch import supervise
from mlxops.jobs.workloads.trainer import TrainerWorkload, parse_trainer
from mlxops.monitor.mirror import Feeder
from mlxops.node import protocol
from mlxops.node.protocol import FINISHED, RUNNING
from mlxops.selftest.choices import NAME
from mlxops.selftest.summary import Recovery
from mlxops.transport import Connector, Results, nodecmd, run_parallel

OnEvent = Callable[[str], None]
#: In the job's environment: marks a record of this name as the selftest's own.
MARKER = "MLXOPS_SELFTEST"
CHECKPOINT_EVERY = 20
KILL_AFTER = CHECKPOINT_EVERY + 2
STEPS = 2000
POLL = 0.5                # the watchdog's look: a kill is seen within half a second
STOP_GRACE = 2.0
#: A model small enough for any Mac and for a 2-core CI machine: the step under test is
#: the recovery, not the training.
MODEL = {"dims": 32, "layers": 1, "heads": 2, "vocab_size": 256, "seq_len": 32}


STALL_TIMEOUT = 300.0


def job_spec(inventory: Path, hosts: str, backend: str, world: int) -> JobSpec:
    """The selftest's job over ``hosts`` (a pattern) of ``world`` ranks; refused as a job
    file would be when the trainer rejects it (exit 2, before any connection)."""
    trainer = {
        "model": dict(MODEL), "data": {"source": "synthetic", "seed": 0},
        "train": {"steps": STEPS, "global_batch": 2 * world, "micro_batch": 2, "lr": 3e-3,
                  "checkpoint_every": CHECKPOINT_EVERY, "keep": 2, "log_every": 10},
    }
    spec = JobSpec(path=inventory.resolve(), name=NAME, inventory=inventory.resolve(),
                   hosts=hosts, backend=backend,
                   workload=TrainerWorkload(parse_trainer(inventory, trainer)),
                   env={MARKER: "1"},
                   # The kill is seen as an exit, not a stall; a long stall timeout lets a
                   # Linux node's first job compile MLX's CPU kernels (a minute, cold, on
                   # 2 busy cores: a zsh-node run in CI stalled out at 60 s).
                   restart=RestartPolicy(max_restarts=1, stall_timeout=STALL_TIMEOUT,
                                         poll_interval=POLL),
                   stop_grace=STOP_GRACE)
    check_world(spec, world)
    return spec


class _Recovered(Exception):
    """Raised out of the watchdog's loop once the new attempt trains: the selftest has seen
    what it came for and stops following (the job is stopped next, on purpose)."""


class KillAndWatch:
    """The watchdog's onlooker: kills the victim at :data:`KILL_AFTER`, then waits for the
    new attempt; ``recovery`` holds what it saw."""

    def __init__(self, record: JobRecord, connector: Connector, hosts: dict, deadline: float,
                 on_event: OnEvent):
        self.record, self.connector, self.hosts = record, connector, hosts
        self.deadline, self.on_event = deadline, on_event
        self.victim = record.ranks[-1]
        self.recovery: Recovery | None = None
        self.killed_at = 0.0

    def on_status(self, status: JobStatus) -> None:
        if time.monotonic() > self.deadline:
            where = ("before the kill" if self.recovery is None else
                     "waiting for the watchdog's restart" if status.attempt < 2 else
                     "waiting for the restarted ranks' first step")
            raise MlxopsError(f"timed out {where} (state {status.state}, step "
                              f"{status.step}, attempt {status.attempt}); see --timeout")
        if self.recovery is None:
            if status.attempt > 1:
                reason = status.restarts[-1].reason if status.restarts else "?"
                raise MlxopsError(f"the job restarted before the kill: {reason}")
            if status.state == RUNNING and (status.step or 0) >= KILL_AFTER:
                self._kill()
            return
        if status.attempt < 2:
            return
        r = self.recovery
        if r.restart_seconds is None:
            r.restart_seconds = time.monotonic() - self.killed_at
            r.reason = status.restarts[-1].reason if status.restarts else ""
            found = re.search(r"resumed from step (\d+)", status.message or "")
            r.resumed_from = int(found.group(1)) if found else None
            self.on_event(f"job: restarted ({r.reason})")
        if status.step is not None or status.state == FINISHED:
            r.recovered_seconds = time.monotonic() - self.killed_at
            raise _Recovered

    def _kill(self) -> None:
        rank = self.victim
        step = kill_trainer(self.record, rank.rank, rank.host, self.connector, self.hosts)
        self.killed_at = time.monotonic()
        self.on_event(f"job: kill -9 of rank {rank.rank} on {rank.host} at step {step}")
        self.recovery = Recovery(rank.rank, rank.host, step)


def kill_command(pid: int, parent: int) -> str:
    """``kill -9 PID`` in POSIX sh, only while PID is a child of PARENT (``ps -o ppid=``
    reads the same on macOS and Linux); exit 1 without a signal otherwise."""
    pid_word, parent_word = shell.quote(int(pid)), shell.quote(int(parent))
    return (f'[ "$(ps -o ppid= -p {pid_word} | tr -d \' \')" = {parent_word} ] '
            f"&& kill -9 {pid_word}")


def kill_trainer(record: JobRecord, rank: int, host_name: str, connector: Connector,
                 hosts: dict) -> int:
    """``kill -9`` of the rank's trainer process over SSH; returns the step of its last
    heartbeat (written at most half a second before the kill).

    The pid is the one the trainer wrote in its heartbeat; the kill happens only while that
    process is still a child of the rank's start script (the group leader the node
    reports), so a pid the system gave to something else since is never signalled.
    """
    h = record.host(host_name)
    paths = h.paths(record.name)
    conn = connector.connect(hosts[host_name])
    answer = nodecmd.run_node(conn, h.python, paths.code, protocol.status_args(paths.run_dir),
                              timeout=30)
    victim = answer.rank(rank)
    pid = victim.progress.pid if victim is not None and victim.progress is not None else None
    if victim is None or not victim.alive or victim.pid is None or pid is None:
        raise MlxopsError(f"{host_name}: rank {rank} is not running: nothing to kill")
    done = conn.run(kill_command(pid, victim.pid), timeout=30)
    if not done.ok:
        raise MlxopsError(f"{host_name}: kill -9 of rank {rank} (pid {pid}, child of "
                          f"{victim.pid}) failed: {done.error_line()}")
    return victim.progress.step or 0


def run_job(spec: JobSpec, connector: Connector, hosts: dict, timeout: float,
            on_event: OnEvent = lambda _: None) -> tuple[JobRecord, Recovery]:
    """Launch, kill one rank, follow the watchdog until the job trains again.

    Returns the record (its ranks still run: :func:`stop_and_remove` is next) and what was
    seen. Raises :class:`MlxopsError` when it does not go so; the job may then have been
    launched: :func:`stop_and_remove` cleans up either way.
    """
    deadline = time.monotonic() + timeout
    clear_earlier(connector, on_event)
    on_event(f"job: launching {NAME}")
    record = launch(spec, connector, fresh=True)
    watcher = KillAndWatch(record, connector, hosts, deadline, on_event)
    try:
        with supervisor_lock(NAME) as supervising:
            if not supervising:
                raise MlxopsError(f"another mlxops process supervises {NAME}")
            feeder = Feeder(NAME, connector)  # the mirror, as `mlxops watch` feeds it

            def watch_and_feed(status: JobStatus) -> None:
                watcher.on_status(status)
                feeder.on_status(status)

            final = supervise(record, connector, on_status=watch_and_feed,
                              on_event=lambda m: on_event(f"job: watchdog: {m}"), poll=POLL)
        why = final.message or final.problem or ""
        raise MlxopsError(f"the job ended ({final.state}) before it was killed and recovered"
                          + (f": {why}" if why else ""))
    except _Recovered:
        pass
    except MlxopsError as exc:
        # The logs go with the run directory: keep the line that says why, here.
        raise MlxopsError(f"{exc}{last_error(load_record(NAME), connector, str(exc))}"
                          ) from None
    recovery = watcher.recovery
    assert recovery is not None, "recovered implies killed"
    if f"rank {recovery.rank} on {recovery.host}" not in recovery.reason:
        raise MlxopsError(f"the watchdog blamed another rank: {recovery.reason!r} (killed: "
                          f"rank {recovery.rank} on {recovery.host})")
    return load_record(NAME), recovery


def own_record() -> JobRecord | None:
    """The controller's record of the selftest's job, if there is one. Raises when a job of
    that name is not the selftest's (a user's job is never stopped or removed here)."""
    try:
        record = load_record(NAME)
    except UserError:
        return None
    if MARKER not in ((record.job or {}).get("env") or {}):
        raise MlxopsError(f"a job named {NAME!r} exists and is not a selftest's: the name is "
                          "mlxops selftest's own; stop and rename that job")
    return record


def last_error(record: JobRecord, connector: Connector, message: str) -> str:
    """``; rank 1 on mac2 said: RuntimeError: ...``: the last line of the log of the rank
    the message blames (else of the first rank whose log ends in an error); "" if none."""
    try:
        chunks = fetch(record, connector, {}, tail=4096)
    except MlxopsError:
        return ""
    blamed = re.search(r"rank (\d+) on (\S+)", message)
    ordered = sorted(chunks, key=lambda c: not (blamed and str(c[0]) == blamed.group(1)))
    for key, host, text in ordered:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if lines and (blamed and str(key) == blamed.group(1) or "rror" in lines[-1]):
            return f"; rank {key} on {host} said: {lines[-1][-300:]}"
    return ""


def clear_earlier(connector: Connector, on_event: OnEvent) -> None:
    """Stop and forget the job of an earlier selftest that did not clean up (its
    controller killed, or ``--keep``)."""
    record = own_record()
    if record is None:
        return
    on_event("job: an earlier selftest's job was left: stopping and removing it")
    results = stop_and_remove(record, connector, keep=False)
    if results.exit_code:
        raise MlxopsError(f"stopping the earlier {NAME}: {why_not(results)}")


def stop_and_remove(record: JobRecord, connector: Connector, *, keep: bool,
                    forks: int | None = None) -> Results:
    """Stop every rank (a user's stop: recorded, verified), then, unless ``keep``, remove
    the run directory on every host and the controller's record. Each host's result says
    what was left (a survivor, a busy port, a directory that would not go)."""
    stopped = stop_job(record, connector, grace=STOP_GRACE, forks=forks)
    if keep or stopped.exit_code:
        return stopped  # what could not be stopped keeps its files for `mlxops stop`
    removed = remove_run_dirs(record, connector, forks=forks)
    if removed.exit_code == 0:
        shutil.rmtree(job_dir(record.name), ignore_errors=True)
    return removed if removed.exit_code else stopped


def remove_unrecorded(hosts: Sequence, connector: Connector,
                      forks: int | None = None) -> Results:
    """The run directory on every host, when the launch failed before its record was
    written (pre-flight or the start failed): nothing of it runs, files may be there."""
    def work(host) -> None:
        run_dir = shell.path_word(f"{host.root.rstrip('/')}/{protocol.run_path(NAME)}")
        done = connector.connect(host).run(f"rm -rf {run_dir}", timeout=60)
        if not done.ok:
            raise MlxopsError(f"rm -rf {run_dir}: {done.error_line()}")

    return run_parallel(list(hosts), work, forks=forks)


def why_not(results: Results) -> str:
    return "; ".join(f"{h}: {results[h].message or results[h].status}"
                     for h in results.unreachable + results.failed)
