"""The network phases of a bench, over SSH: servers up, loopback, every pair in rounds, the
ring's links both ways at once, servers down.

Each measurement is one ``bench-client`` node command on the client host of a pair,
against the ``bench-serve`` server of the other (docs/node-protocol.md, "Bench commands").
A round's pairs share no host and run at the same time; ``serial`` runs them one by one
(for links that share a medium: Wi-Fi, one switch uplink).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mlxops.bench.results import LoopbackResult, PairResult
from mlxops.jobs.placement import NodePaths
from mlxops.node.protocol import bench as benchproto
from mlxops.node.protocol.bench import BOTH, DOWN, UP, ClientAnswer, ServeAnswer
from mlxops.transport import Connector, Results, nodecmd, run_parallel

OnEvent = Callable[[str], None]
LATENCY_BUDGET = 20.0        # seconds a latency measurement may take, at most
COMMAND_SLACK = 30.0         # SSH, interpreter start, connection set-up


@dataclass(frozen=True)
class Settings:
    streams: tuple[int, ...] = (1, 4)
    seconds: float = 5.0
    omit: float = 1.0
    serial: bool = False
    iperf3: bool = False
    port: int = 0            # the servers' port; iperf3 listens on the next one
    latency_seconds: float = 0.0  # time box of each latency measurement; 0: every round trip

    def run_seconds(self) -> float:
        """How long one bandwidth run lasts (iperf3 counts whole seconds)."""
        if self.iperf3:
            return max(1, round(self.seconds)) + round(self.omit)
        return self.seconds + self.omit


@dataclass
class Node:
    """A reachable host, as pre-flight resolved it."""

    host: object              # mlxops.inventory.Host
    root: str
    python: str
    ip: str                   # where the other hosts reach it (its cluster address)
    iperf3: bool = False      # its `iperf3 -s` runs

    @property
    def name(self) -> str:
        return self.host.name  # type: ignore[attr-defined]

    @property
    def paths(self) -> NodePaths:
        return NodePaths(self.root, benchproto.BENCH_JOB)


class Network:
    def __init__(self, nodes: Sequence[Node], connector: Connector, settings: Settings,
                 on_event: OnEvent = lambda _: None):
        self.nodes = {n.name: n for n in nodes}
        self.connector = connector
        self.settings = settings
        self.on_event = on_event
        self.unreachable: dict[str, str] = {}
        self.failures: list[str] = []

    def _ask(self, node: Node, args: list[str], timeout: float):
        return nodecmd.run_node(self.connector.connect(node.host), node.python,
                                node.paths.code, args, timeout=timeout)

    def _parallel(self, nodes: Sequence[Node], work) -> Results:
        results = run_parallel(list(nodes), work, forks=1 if self.settings.serial else None,
                               name=lambda n: n.name)
        for name in results.unreachable:
            self.unreachable.setdefault(name, results[name].message)
        return results

    def client_timeout(self, runs: int, latency: bool) -> float:
        per_run = self.settings.run_seconds() + 10.0
        return runs * per_run + (LATENCY_BUDGET if latency else 0.0) + COMMAND_SLACK

    # -- servers -------------------------------------------------------------------------

    def start_servers(self, deadline: float) -> list[str]:
        """Start every node's server; the names of those that run."""
        s = self.settings

        def work(node: Node) -> ServeAnswer:
            answer = self._ask(node, benchproto.serve_args(
                node.paths.run_dir, ip=node.ip, port=s.port, deadline=deadline,
                iperf3_port=s.port + 1 if s.iperf3 else 0), timeout=60)
            node.iperf3 = answer.iperf3_port is not None
            return answer

        results = run_parallel(list(self.nodes.values()), work, name=lambda n: n.name)
        for name in results.unreachable:
            self.unreachable.setdefault(name, results[name].message)
        for name in results.failed:
            self.failures.append(f"{name}: bench server: {results[name].message}")
        if s.iperf3:
            lacking = [n for n in results.succeeded if not self.nodes[n].iperf3]
            if lacking:
                self.on_event(f"no iperf3 on {', '.join(lacking)}: their links are measured "
                              "with mlxops' own streams")
        return results.succeeded

    def stop_servers(self) -> Results:
        """Stop every server (also those that did not answer their start: a server may run
        although its start timed out)."""
        results = run_parallel(list(self.nodes.values()),
                               lambda n: self._ask(n, benchproto.stop_args(n.paths.run_dir),
                                                   timeout=30),
                               name=lambda n: n.name)
        for name, result in results.items():
            if result.succeeded and result.value.alive:
                self.failures.append(f"{name}: the bench server (pid {result.value.pid}) "
                                     "survived SIGKILL")
            elif result.status == "failed":
                self.failures.append(f"{name}: stopping the bench server: {result.message}")
        return results

    # -- measurements --------------------------------------------------------------------

    def loopback(self, names: Sequence[str]) -> list[LoopbackResult]:
        """Each host to itself over 127.0.0.1: the most its own stack and CPU can show."""
        s = self.settings
        streams = max(s.streams)
        nodes = [self.nodes[n] for n in names]

        def work(node: Node) -> ClientAnswer:
            return self._ask(node, benchproto.client_args(
                peer="127.0.0.1", port=s.port, latency=True, modes=[UP], streams=[streams],
                seconds=s.seconds, omit=s.omit, latency_seconds=s.latency_seconds),
                timeout=self.client_timeout(1, True))

        self.on_event(f"loopback on {len(nodes)} host(s)")
        results = self._parallel(nodes, work)
        out = []
        for node in nodes:
            result = results[node.name]
            if not result.succeeded:
                out.append(LoopbackResult(node.name, error=result.message))
                if result.status == "failed":
                    self.failures.append(f"{node.name}: loopback: {result.message}")
                continue
            answer: ClientAnswer = result.value
            out.append(LoopbackResult(node.name, latency_us=_latency(answer),
                                      bandwidth_gbps=answer.runs[0].up_gbps))
        return out

    def pairs(self, rounds: Sequence[Sequence[tuple[str, str]]]) -> list[PairResult]:
        """Every pair of every round, both directions at each stream count, with latency."""
        s = self.settings
        found: list[PairResult] = []
        for i, pairs in enumerate(rounds, 1):
            self.on_event(f"round {i}/{len(rounds)}: "
                          + ", ".join(f"{a}-{b}" for a, b in pairs))
            peer = dict(pairs)

            def work(node: Node, peer: dict[str, str] = peer) -> ClientAnswer:
                other = self.nodes[peer[node.name]]
                both_iperf3 = s.iperf3 and node.iperf3 and other.iperf3
                return self._ask(node, benchproto.client_args(
                    peer=other.ip, port=s.port, latency=True, modes=[UP, DOWN],
                    streams=s.streams, seconds=s.seconds, omit=s.omit,
                    iperf3_port=s.port + 1 if both_iperf3 else 0,
                    latency_seconds=s.latency_seconds),
                    timeout=self.client_timeout(2 * len(s.streams), True))

            results = self._parallel([self.nodes[a] for a, _ in pairs], work)
            for a, b in pairs:
                found += self._pair_results(a, b, results[a])
        return found

    def _pair_results(self, a: str, b: str, result) -> list[PairResult]:
        there, back = PairResult(a, b), PairResult(b, a)
        if not result.succeeded:
            for p in (there, back):
                p.error = result.message
            if result.status == "failed":
                self.failures.append(f"{a}-{b}: {result.message}")
            return [there, back]
        answer: ClientAnswer = result.value
        for p in (there, back):
            p.latency_us = _latency(answer)
        for run in answer.runs:
            there.tool = back.tool = run.tool
            if run.up_gbps is not None:
                there.streams[str(run.streams)] = run.up_gbps
            if run.down_gbps is not None:
                back.streams[str(run.streams)] = run.down_gbps
        return [there, back]

    def bidir(self, rounds: Sequence[Sequence[tuple[str, str]]]
              ) -> dict[tuple[str, str], float]:
        """Ring links, both directions at once: ``{(src, dst): Gbit/s}`` for each direction."""
        s = self.settings
        streams = max(s.streams)
        found: dict[tuple[str, str], float] = {}
        for i, pairs in enumerate(rounds, 1):
            self.on_event(f"ring links both ways, round {i}/{len(rounds)}")
            peer = dict(pairs)

            def work(node: Node, peer: dict[str, str] = peer) -> ClientAnswer:
                other = self.nodes[peer[node.name]]
                both_iperf3 = s.iperf3 and node.iperf3 and other.iperf3
                return self._ask(node, benchproto.client_args(
                    peer=other.ip, port=s.port, latency=False, modes=[BOTH],
                    streams=[streams], seconds=s.seconds, omit=s.omit,
                    iperf3_port=s.port + 1 if both_iperf3 else 0),
                    timeout=self.client_timeout(1, False))

            results = self._parallel([self.nodes[a] for a, _ in pairs], work)
            for a, b in pairs:
                result = results[a]
                if not result.succeeded:
                    if result.status == "failed":
                        self.failures.append(f"{a}-{b} both ways: {result.message}")
                    continue
                run = result.value.runs[0]
                found[(a, b)], found[(b, a)] = run.up_gbps, run.down_gbps
        return found


def _latency(answer: ClientAnswer) -> dict[str, float] | None:
    lat = answer.latency
    if lat is None:
        return None
    return {"min": lat.min, "median": lat.p50, "p90": lat.p90, "p99": lat.p99, "max": lat.max}


def rounds_needed(n: int) -> int:
    return (n - 1 if n % 2 == 0 else n) if n > 1 else 0


def server_deadline(settings: Settings, hosts: int) -> float:
    """Seconds a server may live: three times what the phases should take, plus a minute.
    Long enough for a slow start, short enough that the servers of a controller that died
    do not linger (``bench-stop`` ends them at once otherwise)."""
    runs = 2 * len(settings.streams)
    per_pair = runs * (settings.run_seconds() + 1.0) + 4.0   # + latency, SSH, start-up
    pairs = hosts * (hosts - 1) // 2
    count = pairs if settings.serial else rounds_needed(hosts)
    loopback = per_pair * (hosts if settings.serial else 1)
    ring = (settings.run_seconds() + 4.0) * (hosts if settings.serial else 3)
    return math.ceil(3 * (per_pair * count + loopback + ring) + 60)
