"""A job's state, from every node's answer: per rank and for the job as a whole.

Rank states: running, finished (exit 0), failed (non-zero exit, or gone without one),
stalled (alive, but no progress for ``stall_timeout`` seconds, or no first heartbeat for
``restart.start_timeout``), stopped (mlxops stopped it),
unreachable (its host did not answer). An mpi job also has a launcher (mpirun, on its first
host): a rank it has not started yet counts as running while it runs, and the job failed
when it exited non-zero (or vanished) before every rank finished. Heartbeat ages are
computed on each node's own clock, so clock skew between Macs does not make a healthy rank
look stalled. Each node's answer is a :class:`mlxops.node.protocol.StatusAnswer`
(docs/node-protocol.md).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from mlxops.jobs.record import JobRecord, Restart, inventory_hosts
from mlxops.jobs.serveprobe import ServeFigures
from mlxops.node import protocol
from mlxops.node.protocol import FAILED, FINISHED, RUNNING, STALLED, STOPPED, UNREACHABLE
from mlxops.node.protocol.layout import BEST_DIR
from mlxops.transport import Connector, nodecmd, run_parallel

LAUNCHER_LINGER = 10.0  # seconds mpirun may take to exit after its last rank


@dataclass
class RankStatus:
    rank: int
    host: str
    state: str
    pid: int | None = None
    exit: int | None = None
    step: int | None = None
    loss: float | None = None
    tokens_per_sec: float | None = None
    heartbeat_age: float | None = None
    ended_ago: float | None = None   # seconds since it exited (node clock), when it has
    failure: str | None = None       # the line of its log that says why it failed
    val_loss: float | None = None    # its last validation loss (train.eval_every)
    best_val_loss: float | None = None
    best_step: int | None = None     # where best_val_loss was measured (checkpoint in best/)
    requests: int | None = None      # a serve job's rank 0: requests its server answered
    busy: bool | None = None         # alive: its CPU busy (True) or idle (False) just now


#: What a rank's error says when it failed because a peer rank went away (MLX's ring
#: backend): the consequence of another rank's failure, never its cause.
PEER_LOST = ("[ring] connection to a peer was lost",)

#: Signals whose number is the same on Linux and macOS, so a node's exit code names them.
SIGNAL_NAMES = {1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 6: "SIGABRT", 9: "SIGKILL",
                11: "SIGSEGV", 13: "SIGPIPE", 14: "SIGALRM", 15: "SIGTERM"}


def why_failed(rank: RankStatus) -> str:
    """The line of a failed rank's log that says why (the node read it), else what its exit
    code says."""
    if rank.failure:
        return rank.failure
    if rank.exit is None:
        return "gone without an exit code (killed with its start script)"
    if rank.exit > 128:
        number = rank.exit - 128
        name = f" ({SIGNAL_NAMES[number]})" if number in SIGNAL_NAMES else ""
        return f"killed by signal {number}{name}"
    return f"exited with code {rank.exit}"


def same_cause(why: str) -> str:
    """What two reasons must share to be one cause: numbers, in decimal or hex (pids,
    ports, addresses, host numbers, random temp file names like ``tmp_3d875d5c.cpp``), are
    an instance's, not the cause's."""
    return re.sub(r"[0-9a-fA-F]*[0-9][0-9a-fA-F]*", "#", why)


def cause_of(rank: RankStatus) -> str:
    """What a failed rank shares with the others of its cause: its log's line up to numbers
    (:func:`same_cause`); without one, what its exit code says, exactly (exit code 3 is not
    exit code 4)."""
    return same_cause(rank.failure) if rank.failure else why_failed(rank)


def where(ranks: list[tuple[int, str]]) -> str:
    """``node1 r0-1, node2 r2``: ranks (rank, host) in order, a run of ranks on one host
    said once (as ``mlxops logs`` prefixes lines: ``[node1 r0]``)."""
    runs: list[list] = []  # [host, first, last]
    for rank, host in sorted(ranks):
        if runs and runs[-1][0] == host and runs[-1][2] == rank - 1:
            runs[-1][2] = rank
        else:
            runs.append([host, rank, rank])
    return ", ".join(f"{h} r{a}" if a == b else f"{h} r{a}-{b}" for h, a, b in runs)


@dataclass
class Failure:
    """One distinct reason ranks failed, and every failed rank it was the reason of."""

    why: str
    ranks: list[tuple[int, str]]     # (rank, host)

    def to_dict(self) -> dict[str, Any]:
        return {"why": self.why, "ranks": [{"rank": r, "host": h} for r, h in self.ranks]}


@dataclass
class LauncherStatus:
    """An mpi job's launcher (mpirun on its first host), classified like a rank."""

    host: str
    state: str                       # a rank state (UNREACHABLE: its host did not answer)
    pid: int | None = None
    exit: int | None = None
    age: float | None = None         # seconds since it started (node clock), when known


@dataclass
class JobStatus:
    name: str
    state: str
    ranks: list[RankStatus]
    attempt: int = 1
    restarts: list[Restart] = field(default_factory=list)
    unreachable: dict[str, str] = field(default_factory=dict)   # host -> reason
    steps: int | None = None
    message: str = ""
    launcher: LauncherStatus | None = None   # mpi only
    stray: list[str] = field(default_factory=list)  # hosts left behind, maybe still running
    serve: ServeFigures | None = None        # a probed job's live figures, when known
    fast_synch: bool = False                 # its ranks run with MLX_METAL_FAST_SYNCH=1
    needs_reboot: list[str] = field(default_factory=list)  # ranks there survived SIGKILL

    def live(self) -> dict[str, Any]:
        """The live figures as a status document or a sample line holds them (empty: none)."""
        return {} if self.serve is None else {ServeFigures.KEY: self.serve.to_dict()}

    @property
    def step(self) -> int | None:
        """The job's progress: the step every rank has reached."""
        steps = [r.step for r in self.ranks if r.step is not None]
        return min(steps) if len(steps) == len(self.ranks) and steps else None

    @property
    def validation(self) -> str | None:
        """``validation loss 2.3101 (best 2.2950 at step 400, in best/)``: rank 0's last
        evaluation, or None before one (every rank evaluates the same)."""
        first = next((r for r in self.ranks if r.val_loss is not None), None)
        if first is None:
            return None
        best = "" if first.best_val_loss is None else (
            f" (best {first.best_val_loss:.4f} at step {first.best_step}, in "
            f"{BEST_DIR}/)")
        return f"validation loss {first.val_loss:.4f}{best}"

    @property
    def problem(self) -> str | None:
        """Why the watchdog should restart, or None."""
        failed = [r for r in self.ranks if r.state == FAILED]
        launcher = self.launcher
        if launcher and launcher.state == FAILED and self.state == FAILED and \
                not any(r.pid is not None for r in failed):
            # mpirun itself failed (e.g. could not reach a node): no rank to blame.
            how = (f"exited with code {launcher.exit}" if launcher.exit is not None
                   else "vanished")
            return (f"mpirun on {launcher.host} {how} "
                    "(see launcher.log in the job's run directory there)")
        if failed:
            # When one rank dies its peers fail too (their all-reduce breaks, or mpirun kills
            # them): name the likely cause. A rank whose script recorded death by a signal
            # comes first (its time is known), then one gone without an exit code (killed
            # with its script: when is unknown, and mpirun's clean-up after the first death
            # looks the same), then one that raised an error, before one whose error says
            # it lost a peer (it exits as fast as the peer it lost); among equals, the one
            # that ended first.
            def blame(r: RankStatus) -> tuple[int, bool, float]:
                kind = 0 if r.exit is not None and r.exit < 128 else 1 if r.exit is None else 2
                cause = not (r.failure and any(said in r.failure for said in PEER_LOST))
                return kind, cause, float("inf") if r.ended_ago is None else r.ended_ago

            r = max(failed, key=blame)
            how = f"exited with code {r.exit}" if r.exit is not None else "vanished"
            problem = f"rank {r.rank} on {r.host} {how}"
            if not r.failure:
                return problem
            also = [(x.rank, x.host) for x in failed if x is not r and cause_of(x) == cause_of(r)]
            return f"{problem}: {r.failure}" + (f" (also {where(also)})" if also else "")
        stalled = [r for r in self.ranks if r.state == STALLED]
        if stalled:
            r = stalled[0]
            kind = {True: ", its CPU busy: a collective spinning on a lost peer?",
                    False: ", idle: a collective waiting forever?"}.get(r.busy, "")
            return (f"rank {r.rank} on {r.host} made no progress for "
                    f"{r.heartbeat_age:.0f}s (stalled{kind})")
        return None

    @property
    def failures(self) -> list[Failure]:
        """Each distinct reason the failed ranks failed (:func:`why_failed`, grouped by
        :func:`cause_of`), once, with the ranks that share it; in rank order."""
        found: dict[str, Failure] = {}
        for r in sorted((r for r in self.ranks if r.state == FAILED), key=lambda r: r.rank):
            found.setdefault(cause_of(r), Failure(why_failed(r), [])).ranks.append(
                (r.rank, r.host))
        return list(found.values())

    def to_dict(self) -> dict[str, Any]:
        doc = {"name": self.name, "state": self.state, "step": self.step, "steps": self.steps,
               "attempt": self.attempt, "restarts": [asdict(r) for r in self.restarts],
               "unreachable": self.unreachable, "message": self.message,
               "ranks": [asdict(r) for r in self.ranks],
               "failures": [f.to_dict() for f in self.failures]}
        if self.launcher is not None:
            doc["launcher"] = asdict(self.launcher)
        if self.stray:
            doc["stray"] = self.stray
        if self.fast_synch:
            doc["fast_synch"] = True
        if self.needs_reboot:
            doc["needs_reboot"] = self.needs_reboot
        return doc | self.live()


def rank_state(*, exit_code: int | None, alive: bool, heartbeat_age: float | None,
               stopped: bool, stall_timeout: float) -> str:
    """A rank's state from what its node says of it (``stopped``: the node's marker, or the
    record's state, says mlxops stopped the job)."""
    if exit_code is not None:
        return FINISHED if exit_code == 0 else FAILED
    if alive:
        return STALLED if heartbeat_age is not None and heartbeat_age > stall_timeout else RUNNING
    if stopped:
        return STOPPED
    return FAILED  # gone without an exit code: killed by a signal it could not record


def job_state(record: JobRecord, ranks: list[RankStatus], launcher: str | None = None) -> str:
    states = {r.state for r in ranks}
    if record.state == STOPPED and not states & {RUNNING, STALLED}:
        return STOPPED
    if states == {FINISHED}:
        # mpi: mpirun exits a moment after its ranks; until then (or for 10 s at most, if
        # it lingers) the job is still ending, and a resume or relaunch must wait for it.
        ended = [r.ended_ago for r in ranks if r.ended_ago is not None]
        if launcher in (RUNNING, STALLED) and ended and min(ended) < LAUNCHER_LINGER:
            return RUNNING
        return FINISHED
    if FAILED in states or launcher == FAILED:
        return FAILED
    if STALLED in states:
        return STALLED
    if STOPPED in states and not states & {RUNNING}:
        return STOPPED
    return RUNNING


def stall_limit(record: JobRecord, rank: protocol.RankAnswer) -> float:
    """Seconds without a heartbeat after which ``rank`` is stalled: ``stall_timeout`` once
    it wrote its first heartbeat; before, while it starts (a cold MLX compiles its kernels
    first), ``restart.start_timeout``."""
    if rank.progress is None:
        return record.restart.start_limit
    return record.restart.stall_timeout


def stall_rule(record: JobRecord, rank: protocol.RankAnswer) -> tuple[float | None, float]:
    """The age the stall rule compares, and its limit: the rank is stalled when age > limit.

    A rank that beats while it starts (``starting`` heartbeats, trainer/startbeat.py, before
    its first step) is alive but may get nowhere (a first collective waiting forever keeps
    the beat going). With ``silence`` = its heartbeat's age and ``since`` = the time since
    it started (``silence + beat.time - started``), it is stalled when
    ``silence > stall_timeout`` (the beat stopped: frozen, wedged) or
    ``since > max(start_timeout, stall_timeout)`` (too long to start). Any other rank:
    its heartbeat's age against :func:`stall_limit`."""
    beat, silence = rank.progress, rank.heartbeat_age
    if beat is None or beat.state != protocol.STARTING or silence is None:
        return silence, stall_limit(record, rank)
    if silence > record.restart.stall_timeout:
        return silence, record.restart.stall_timeout
    since = silence + max(0.0, (beat.time or 0.0) - (rank.started or beat.time or 0.0))
    return since, record.restart.start_limit


def _absent(rank: int) -> protocol.RankAnswer:
    """A rank its node has no files of (not written, or removed)."""
    return protocol.RankAnswer(rank=rank, pid=None, alive=False, exit=None, ended_ago=None,
                               started=None, heartbeat_age=None, progress=None, log_bytes=0)


def classify(record: JobRecord, answers: dict[str, protocol.StatusAnswer],
             unreachable: dict[str, str]) -> JobStatus:
    """Pure: the record plus each host's ``mlxops.node status`` answer → the job's status."""
    ranks: list[RankStatus] = []
    launcher = _launcher(record, answers)
    # A server writes no heartbeat: the watchdog's probe is its liveness (serveprobe).
    heartbeats = record.workload is None or record.workload.heartbeats
    for rank in record.ranks:
        answer = answers.get(rank.host)
        if answer is None:
            ranks.append(RankStatus(rank.rank, rank.host, UNREACHABLE))
            continue
        node_rank = answer.rank(rank.rank) or _absent(rank.rank)
        progress = node_rank.progress or protocol.Progress()
        stall_age, limit = stall_rule(record, node_rank)
        state = rank_state(exit_code=node_rank.exit, alive=node_rank.alive,
                           heartbeat_age=stall_age if heartbeats else None,
                           stopped=answer.stopped or record.state == STOPPED,
                           stall_timeout=limit)
        # A beating rank's heartbeat age shows it alive; a stalled one's says for how long
        # it got nowhere (a start past start_timeout: since it started).
        age = stall_age if state == STALLED else node_rank.heartbeat_age
        if (launcher and launcher.state in (RUNNING, STALLED) and node_rank.pid is None
                and node_rank.exit is None and state in (FAILED, STOPPED)):
            # Not started yet: mpirun is still bringing it up (ssh, orted) - or hangs at it.
            state, age = launcher.state, launcher.age
        ranks.append(RankStatus(
            rank.rank, rank.host, state, node_rank.pid, node_rank.exit, progress.step,
            progress.loss, progress.tokens_per_sec, age, node_rank.ended_ago, node_rank.failure,
            progress.val_loss, progress.best_val_loss, progress.best_step,
            node_rank.requests, node_rank.busy))
    return JobStatus(record.name,
                     job_state(record, ranks, launcher.state if launcher else None),
                     ranks, record.attempt, record.restarts, unreachable, record.steps,
                     record.message, launcher, [h.name for h in record.stray],
                     fast_synch=record.fast_synch, needs_reboot=list(record.needs_reboot))


def _probed(record: JobRecord) -> bool:
    """A probed workload's node counts its server's requests (for its live figures)."""
    return record.workload is not None and record.workload.probed


def _launcher(record: JobRecord, answers: dict[str, protocol.StatusAnswer]
              ) -> LauncherStatus | None:
    """An mpi job's launcher (mpirun on the first host), classified like a rank."""
    if record.backend != protocol.MPI or not record.ranks:
        return None
    host = record.ranks[0].host
    answer = answers.get(host)
    if answer is None:
        return LauncherStatus(host, UNREACHABLE)
    mpirun = answer.launcher or protocol.LauncherAnswer(pid=None, alive=False, exit=None,
                                                        started=None, age=None, ended_ago=None)
    # Its "heartbeat" is its start: it only matters while it has not started every rank.
    state = rank_state(exit_code=mpirun.exit, alive=mpirun.alive, heartbeat_age=mpirun.age,
                       stopped=answer.stopped or record.state == STOPPED,
                       stall_timeout=record.restart.stall_timeout)
    if state == FAILED and mpirun.exit is None and all(
            r.exit == 0 for a in answers.values() for r in a.ranks):
        state = FINISHED  # every rank finished; how mpirun ended does not matter
    return LauncherStatus(host, state, mpirun.pid, mpirun.exit, mpirun.age)


def job_status(record: JobRecord, connector: Connector, forks: int | None = None,
           hosts: dict[str, Any] | None = None) -> JobStatus:
    """Ask every host of the job (in parallel) and classify the answers."""
    hosts = hosts or inventory_hosts(record)

    def work(host) -> protocol.StatusAnswer:
        h = record.host(host.name)
        paths = h.paths(record.name)
        return nodecmd.run_node(connector.connect(host), h.python, paths.code,
                                protocol.status_args(paths.run_dir,
                                                     requests=_probed(record)),
                                timeout=30)

    results = run_parallel([hosts[h.name] for h in record.hosts], work, forks=forks)
    unreachable = {name: r.message for name, r in results.items() if not r.succeeded}
    return classify(record, results.succeeded_values(), unreachable)
