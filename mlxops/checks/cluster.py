"""Every host's state, read once, in parallel, before the checks run.

:meth:`Cluster.read_hosts` reads each host (:func:`mlxops.checks.state.inspect`) through
mlxops's executor, so N hosts cost the time of the slowest, not N times the checks. The
network test between hosts (:meth:`Cluster.probe_reach`) runs after it, on every host
that answered at once: each node listens on its ring ports while it connects to every
other's (the ``reach`` node command). Last, :meth:`Cluster.run_all_sum` runs one real
``all_sum`` across every rank, started as jobs start ranks (``mlxops bench``'s all-reduce
program at one size), once nothing else stands in its way.

The all_sum's machinery (:mod:`mlxops.bench.allreduce`, and through it a job's launch and
pre-flight) is imported by :meth:`Cluster.run_all_sum`, when every host has been read:
not with this module, which every ``mlxops check`` imports before its first connection.
:meth:`Cluster.run_collectives` runs the collectives check the same way
(:mod:`mlxops.jobs.collectives`: rank-coded ``all_sum``, ``all_gather``, ``send``/``recv``)
for those the checked job will trust with data, or all of them without ``--job``.
"""

from __future__ import annotations

import threading
from dataclasses import replace

from mlxops.checks.state import NodeState, inspect
from mlxops.checks.target import Target
from mlxops.errors import MlxopsError
from mlxops.node import protocol
from mlxops.sync import SyncReport
from mlxops.tasks.facts import load_cached_facts
from mlxops.transport import Connector, run_parallel
from mlxops.transport.nodecmd import run_node
from mlxops.transport.results import OK

#: How long a node listens for its peers (and tries theirs). A healthy cluster answers in
#: about a second; a pair that cannot connect costs this long.
REACH_SECONDS = 8.0
#: The all_sum check's one size: 4 KiB of float32, one message per rank pair.
ALL_SUM_BYTES = 4096


class Cluster:
    """The checked hosts' states (``states``, in host order) and the target they are
    checked against."""

    def __init__(self, target: Target, connector: Connector):
        self.target = target
        self.connector = connector
        self.states: dict[str, NodeState] = {}
        self.reached = False
        # The all_sum across every rank: None until run; then "" (0 wrong), or why not.
        self.all_sum: str | None = None
        self.all_sum_skipped = ""
        self.all_sum_ranks = 0
        # The collectives check: None until run; then wrong lines by host (none: right),
        # or why it did not run (collectives_skipped: not run, for a reason named elsewhere).
        self.collectives: dict[str, list[str]] | None = None
        self.collectives_line = ""     # the refusal: backend, MLX version, what was wrong
        self.collectives_error = ""
        self.collectives_skipped = ""

    def read_hosts(self) -> None:
        results = run_parallel(list(self.target.hosts),
                               lambda host: inspect(self.target, self.connector, host),
                               forks=self.target.forks)
        for host in self.target.hosts:
            result = results[host.name]
            state = (result.value if result.succeeded else
                     NodeState(host, result.status, result.message))
            if state.status != OK:
                state.cached = load_cached_facts(host.name)
            self.states[host.name] = state

    def state(self, name: str) -> NodeState:
        return self.states[name]

    def answered(self) -> list[NodeState]:
        """The hosts that were read (reachable, trusted)."""
        return [s for s in self.states.values() if s.status == OK]

    def probe_reach(self) -> None:
        """Every host whose helpers answered ``ready`` tests its ring ports against the
        others', all at once (so the executor gets one worker per host)."""
        self.reached = True
        hosts = [s for s in self.answered()
                 if isinstance(s.ready, protocol.ReadyAnswer) and self.target.ports[s.name]]
        if len(hosts) < 2:
            return
        where = {s.name: (s.host.ip, list(self.target.ports[s.name])) for s in hosts}

        def work(state: NodeState) -> protocol.ReachAnswer:
            peers = {n: w for n, w in where.items() if n != state.name}
            root = state.facts.root
            args = protocol.reach_args(state.name, ip=state.host.ip,
                                       ports=where[state.name][1], peers=peers,
                                       seconds=REACH_SECONDS)
            return run_node(self.connector.connect(state.host), state.interpreter.path,
                            f"{root}/{protocol.CODE_DIR}", args, timeout=REACH_SECONDS + 60)

        results = run_parallel(hosts, work, forks=len(hosts))
        for state in hosts:
            result = results[state.name]
            state.reach = result.value if result.succeeded else result.message

    def all_sum_blocker(self) -> str:
        """Why the all_sum cannot run without changing a host, or "" when it can.

        Its ranks start as a job's do, and a job's pre-flight syncs the code: so the
        check runs it only where the code is already current (reading stays reading), the
        ring ports are free and every checked host answered; otherwise the other checks
        name the problem, and this one waits for them.
        """
        for state in self.states.values():
            if state.status != OK:
                return f"{state.name} was not read ({state.reason or state.status})"
            if not isinstance(state.code, SyncReport) or state.code.has_changes:
                return f"the code on {state.name} is not current (check_synced_code)"
            if not isinstance(state.ready, protocol.ReadyAnswer):
                return f"the node helpers on {state.name} did not answer"
            if state.ready.ports_busy:
                return f"ring ports are busy on {state.name} (check_ring_ports)"
            reach = state.reach
            if self.reached and self.target.ports.get(state.name) and len(self.states) > 1 \
                    and not (isinstance(reach, protocol.ReachAnswer) and not reach.unreached):
                # A pair that cannot connect would only hang the ranks until the stall timeout.
                return f"{state.name} does not reach every peer (check_ring_reach)"
        return ""

    def run_all_sum(self) -> None:
        """One ``all_sum`` of float32 across every rank of the checked hosts, with the
        target's backend and ring ports; records ``""`` or the failure in ``all_sum``."""
        blocker = self.all_sum_blocker()
        if blocker:
            self.all_sum_skipped = blocker
            return
        from mlxops.bench import allreduce

        target = self.target
        spec = allreduce.job_spec(target.inventory.path, ",".join(target.names),
                                  target.backend, target.base_port, [ALL_SUM_BYTES])
        # No bytecode on the nodes: the check leaves their files as it found them.
        spec = replace(spec, env={**spec.env, "PYTHONDONTWRITEBYTECODE": "1"})
        try:
            rows, _gathered, ranks = allreduce.sweep(spec, self.connector)
        except MlxopsError as exc:
            self.all_sum = str(exc)
            return
        wrong = sum(row.wrong for row in rows)
        self.all_sum = (f"{wrong} of {ranks} ranks x {ALL_SUM_BYTES // 4} values wrong"
                        if wrong else "")
        self.all_sum_ranks = ranks


    def collectives_ops(self) -> tuple[str, ...]:
        """What the collectives check runs: the checked job's (pre-flight's rule,
        :func:`mlxops.jobs.preflight.collectives_for`), or every collective without one."""
        from mlxops.node.protocol.collectives import COLLECTIVES

        job = self.target.job
        if job is None:
            return COLLECTIVES
        from mlxops.jobs.preflight import collectives_for

        return collectives_for(job, self.target.world)

    def run_collectives(self) -> None:
        """Run the collectives check across every rank of the checked hosts (once nothing
        stands in its way, as the all_sum); records each host's wrong answers."""
        blocker = self.all_sum_blocker()
        if blocker:
            self.collectives_skipped = blocker
            return
        from mlxops.jobs import collectives
        from mlxops.jobs.launch import launch

        target = self.target
        job = target.job
        spec = collectives.job_spec(target.inventory.path, ",".join(target.names),
                                    target.backend, target.base_port, self.collectives_ops(),
                                    job.env if job is not None else None)
        try:
            answers = collectives.run_check(spec, self.connector, launch)
        except MlxopsError as exc:
            self.collectives_error = str(exc)
            return
        self.collectives = {name: [] for name in target.names}
        for host, answer in answers:
            self.collectives.setdefault(host, []).extend(answer.wrong)
        self.collectives_line = collectives.refusal([a for _, a in answers])


class Reading:
    """``cluster.read_hosts()`` under way in a thread of its own from now on; :meth:`wait`
    until it is done (its exception, if it raised one, raised there).

    ``mlxops check`` starts it before it imports pytest (:mod:`mlxops.checks.run`), so
    that the hosts' answers and pytest's start-up overlap.
    """

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._read, name="check-read-hosts",
                                        daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            self.cluster.read_hosts()
        except BaseException as exc:  # noqa: BLE001 - raised again by wait(), in the session
            self._error = exc

    def wait(self) -> Cluster:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self.cluster
