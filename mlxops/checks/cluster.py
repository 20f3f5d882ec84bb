"""Every host's state, gathered once in parallel before the checks run.

:meth:`Cluster.gather` reads each host (:func:`mlxops.checks.state.inspect`) through
mlxops's executor, so N hosts cost the time of the slowest, not N times the checks. The
network test between hosts (:meth:`Cluster.gather_reach`) runs after it, on every host
that answered at once: each node listens on its ring ports while it connects to every
other's (the ``reach`` node command).
"""

from __future__ import annotations

from mlxops.checks.state import READ_ONLY, NodeState, inspect
from mlxops.checks.target import Target
from mlxops.jobs.nodecmd import run_node
from mlxops.node import protocol
from mlxops.tasks.facts import load_cached_facts
from mlxops.transport import Connector, run_parallel
from mlxops.transport.results import OK

#: How long a node listens for its peers (and tries theirs). A healthy cluster answers in
#: about a second; a pair that cannot connect costs this long.
REACH_SECONDS = 8.0


class Cluster:
    """The checked hosts' states (``states``, in host order) and the target they are
    checked against."""

    def __init__(self, target: Target, connector: Connector):
        self.target = target
        self.connector = connector
        self.states: dict[str, NodeState] = {}
        self.reached = False

    def gather(self) -> None:
        results = run_parallel(list(self.target.hosts),
                               lambda host: inspect(self.target, self.connector, host),
                               forks=self.target.forks)
        for host in self.target.hosts:
            result = results[host.name]
            state = (result.value if result.succeeded else
                     NodeState(host, result.status, result.message))
            if state.status != OK:
                state.cached = load_cached_facts(host.name) or {}
            self.states[host.name] = state

    def state(self, name: str) -> NodeState:
        return self.states[name]

    def answered(self) -> list[NodeState]:
        """The hosts that were read (reachable, trusted)."""
        return [s for s in self.states.values() if s.status == OK]

    def gather_reach(self) -> None:
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
            root = state.facts["root"]
            args = protocol.reach_args(state.name, ip=state.host.ip,
                                       ports=where[state.name][1], peers=peers,
                                       seconds=REACH_SECONDS)
            return run_node(self.connector.connect(state.host), state.interpreter["path"],
                            f"{root}/{protocol.CODE_DIR}", args, timeout=REACH_SECONDS + 60,
                            prefix=READ_ONLY)

        results = run_parallel(hosts, work, forks=len(hosts))
        for state in hosts:
            result = results[state.name]
            state.reach = result.value if result.succeeded else result.message
