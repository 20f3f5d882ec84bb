"""One ``mlxops bench``, start to end: pre-flight, servers, loopback, pairs, ring search,
the ring's links both ways, servers down, the all-reduce sweep, findings. With a time
budget (the default), the runs' lengths and the sweep's largest size come from it
(:mod:`mlxops.bench.budget`).

Hosts that cannot be reached are reported and left out; everything else is still
measured. Nothing is left running on any node: the servers are stopped (and have a
deadline of their own), the all-reduce ranks are stopped, then the bench's run directory
is removed, on success, failure and Ctrl-C alike.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mlxops import filelock, render, shell
from mlxops.bench import allreduce, budget
from mlxops.bench.choices import ALL, RING
from mlxops.bench.findings import findings
from mlxops.bench.measure import Network, Node, Settings, server_deadline
from mlxops.bench.results import BenchResult, RingResult, average_busbw, bench_dir, fit
from mlxops.bench.ring import best_ring, ring_bottleneck
from mlxops.bench.schedule import disjoint_rounds, ring_edges, round_robin
from mlxops.datalink import data_link_finding
from mlxops.errors import MlxopsError, bad_input
from mlxops.inventory import load_inventory
from mlxops.inventory.backend import hosts_backend
from mlxops.jobs.placement import place_ranks
from mlxops.jobs.preflight import preflight
from mlxops.jobs.spec import JobSpec
from mlxops.tasks.facts import load_cached_facts
from mlxops.transport import Connector, GroupError, run_parallel

OnEvent = Callable[[str], None]
#: The all-reduce's ring ports start this far above the bench's port (server, iperf3).
RING_PORT_OFFSET = 2


@dataclass(frozen=True)
class Request:
    inventory: Path
    limit: str | None = None
    pairs: str = ALL
    settings: Settings = field(default_factory=Settings)
    sizes: tuple[int, ...] = ()       # the all-reduce sweep; empty: no sweep
    budget: float = 0.0               # seconds the whole bench should take; 0: no budget
    plan_runs: bool = True            # with a budget: seconds and omit come from it
    plan_sweep: bool = True           # with a budget: the largest size comes from it


_SIZE = re.compile(r"^(\d+)([KMG]?)(?:I?B)?$", re.IGNORECASE)
_UNIT = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(word: str, option: str = "--sizes") -> int:
    match = _SIZE.match(word.strip())
    if not match:
        raise bad_input(option, None, f"{word!r}: want a size such as 4K, 1M, 256M")
    size = int(match.group(1)) * _UNIT[match.group(2).upper()]
    if size < 4 or size % 4:
        raise bad_input(option, None, f"{word!r}: want a multiple of 4 bytes (float32)")
    return size


def parse_sizes(text: str) -> tuple[int, ...]:
    """``4K..256M`` (powers of two from one to the other), ``4K,1M,64M``, or ``none``."""
    text = text.strip()
    if text.lower() in ("none", "0", ""):
        return ()
    if ".." in text:
        lo_word, hi_word = text.split("..", 1)
        lo, hi = parse_size(lo_word), parse_size(hi_word)
        if lo & (lo - 1) or hi & (hi - 1) or lo > hi:
            raise bad_input("--sizes", None, f"{text!r}: want powers of two, low..high")
        sizes = []
        while lo <= hi:
            sizes.append(lo)
            lo *= 2
        return tuple(sizes)
    return tuple(sorted({parse_size(w) for w in text.split(",")}))


@contextmanager
def one_at_a_time() -> Iterator[None]:
    """One bench per controller at a time: two would share the internal job's name (the
    second would stop the first's all-reduce as left behind) and the ports."""
    path = bench_dir() / ".lock"
    with filelock.exclusive(path, wait=False) as held:
        if not held:
            raise MlxopsError(f"another mlxops bench runs from this controller ({path} is "
                              "locked)")
        yield


def run_bench(req: Request, connector: Connector, on_event: OnEvent = lambda _: None
              ) -> BenchResult:
    inv = load_inventory(req.inventory)
    hosts = inv.select(req.limit)
    backend = hosts_backend(hosts, inv.path)
    with one_at_a_time():
        return _run(req, inv, hosts, backend, connector, on_event)


def _run(req: Request, inv, hosts: list, backend: str, connector: Connector,
         on_event: OnEvent) -> BenchResult:
    start = time.monotonic()
    s = req.settings
    result = BenchResult(inventory=str(inv.path), hosts=[h.name for h in hosts], options={
        "limit": req.limit, "pairs": req.pairs, **asdict(s), "sizes": list(req.sizes),
        "backend": backend, "budget": req.budget})
    spec = allreduce.job_spec(inv.path, req.limit or "all", backend,
                              s.port + RING_PORT_OFFSET, req.sizes or (4,))
    ranks = place_ranks(hosts, spec.base_port) if req.sizes else []
    on_event(f"pre-flight on {len(hosts)} host(s)")
    checked, preps = preflight(spec, hosts, ranks, connector, None)
    for name in checked.unreachable:
        result.unreachable[name] = checked[name].message
    for name in checked.failed:
        result.failures.append(f"{name}: {checked[name].message}")
    nodes = [Node(p.host, p.root, p.python, render.cluster_ip(p.host)) for p in preps.values()]
    result.seconds["preflight"] = time.monotonic() - start
    keep_run_dirs = removed = False
    try:
        _network(req, result, Network(nodes, connector, s, on_event))
        left_out = [h.name for h in hosts
                    if h.name not in preps or h.name in result.unreachable]
        ranks_left = sum(h.slots for h in hosts if h.name not in left_out)
        if req.budget and req.plan_sweep and req.sizes:
            within = budget.sweep_budget(req.budget, time.monotonic() - start)
            spec = allreduce.job_spec(inv.path, req.limit or "all", backend,
                                      s.port + RING_PORT_OFFSET, req.sizes, within)
        keep_run_dirs = _sweep(req, result, spec, left_out, ranks_left, connector, on_event)
        # A sweep that ran on every node removed the run directory there (the servers'
        # files were in it): one round trip less.
        removed = bool(result.allreduce) and not left_out
    finally:
        if not keep_run_dirs and not removed:
            _remove_run_dirs(nodes, connector, result)
    result.findings = findings(result) + data_link_findings(hosts) + fast_synch_findings(hosts)
    result.seconds["total"] = time.monotonic() - start
    return result


def data_link_findings(hosts: list) -> list[dict]:
    """``data_link`` findings: a host whose data address (what bench measures) is on Wi-Fi
    or SSH's slower link, by the facts provision last cached (mlxops/datalink.py)."""
    out = []
    for host in hosts:
        facts = load_cached_facts(host.name) if len(hosts) > 1 else None
        found = facts and data_link_finding(facts, render.cluster_ip(host), host.address)
        if found:
            out.append({"kind": "data_link", "host": host.name,
                        "message": f"{host.name}: {found[0]}: {found[1]}"})
    return out


def fast_synch_findings(hosts: list) -> list[dict]:
    """A ``fast_synch`` finding: MLX_METAL_FAST_SYNCH does not apply where no host is a
    Mac (no Metal); on Macs its cost is not measured by this version (docs/cli.md)."""
    systems = {f.system for h in hosts if (f := load_cached_facts(h.name)) is not None}
    if systems and "Darwin" not in systems:
        return [{"kind": "fast_synch", "message": "MLX_METAL_FAST_SYNCH does not apply: "
                                                  "no host is a Mac (no Metal)"}]
    if "Darwin" in systems:
        return [{"kind": "fast_synch", "message": "MLX_METAL_FAST_SYNCH: its cost on a "
                 "small all-reduce from the GPU is not measured by this version; off is "
                 "MLX's advice (on, a fence can wedge the GPU until reboot)"}]
    return []


def _network(req: Request, result: BenchResult, net: Network) -> None:
    mark = time.monotonic()
    names = list(net.nodes)
    try:
        up = net.start_servers(server_deadline(req.settings, len(names)))
        result.seconds["servers"] = time.monotonic() - mark
        if req.budget and req.plan_runs:
            # A round of node commands costs what starting the servers did: measured, not
            # assumed (a loaded node starts its interpreter slowly).
            net.settings = budget.plan(req.budget, len(up), req.settings,
                                       ring_only=req.pairs == RING,
                                       round_cost=result.seconds["servers"])
            result.options.update(seconds=net.settings.seconds, omit=net.settings.omit,
                                  latency_seconds=net.settings.latency_seconds)
        mark = time.monotonic()
        result.loopback = net.loopback(up)
        result.seconds["loopback"] = time.monotonic() - mark
        mark = time.monotonic()
        if req.pairs == RING:
            rounds = disjoint_rounds(ring_edges(up))
        else:
            rounds = round_robin(up)
        order = {name: i for i, name in enumerate(names)}
        result.pairs = sorted(net.pairs(rounds), key=lambda p: (order[p.src], order[p.dst]))
        result.seconds["pairs"] = time.monotonic() - mark
        mark = time.monotonic()
        result.ring = _ring(req, result, up)
        if result.ring and len(result.ring.order) > 1:
            both = net.bidir(disjoint_rounds(ring_edges(result.ring.order)))
            for (src, dst), gbps in both.items():
                pair = result.pair(src, dst)
                if pair is not None:
                    pair.bidir_gbps = gbps
            sums = [both[(a, b)] + both[(b, a)] for a, b in ring_edges(result.ring.order)
                    if (a, b) in both and (b, a) in both]
            if sums and len(sums) == len(ring_edges(result.ring.order)):
                result.ring.bidir_bottleneck_gbps = min(sums)
        result.seconds["ring"] = time.monotonic() - mark
    finally:
        net.stop_servers()
        for name, why in net.unreachable.items():
            result.unreachable.setdefault(name, why)
        result.failures += net.failures


def _ring(req: Request, result: BenchResult, names: list[str]) -> RingResult | None:
    """The best ring of the measured hosts (``--pairs all``), or the inventory order's
    figures (``--pairs ring``)."""
    if len(names) < 2:
        return None
    def speed(a: str, b: str) -> float:
        there, back = result.pair(a, b), result.pair(b, a)
        got = [p.bandwidth_gbps for p in (there, back) if p and p.bandwidth_gbps is not None]
        return min(got) if len(got) == 2 else 0.0  # a link not measured is not usable

    w = [[0.0 if a == b else speed(a, b) for b in names] for a in names]
    inventory = ring_bottleneck(list(range(len(names))), w)
    if req.pairs == RING:
        return RingResult(order=names, bottleneck_gbps=inventory, exact=False,
                          bound_gbps=None, inventory_bottleneck_gbps=inventory,
                          measured=RING)
    ring = best_ring(w)
    return RingResult(order=[names[i] for i in ring.order], bottleneck_gbps=ring.bottleneck,
                      exact=ring.exact, bound_gbps=ring.bound,
                      inventory_bottleneck_gbps=inventory)


def _sweep(req: Request, result: BenchResult, spec: JobSpec, left_out: list[str],
           ranks: int, connector: Connector, on_event: OnEvent) -> bool:
    """The all-reduce (and all_gather) sweep, when asked for and there are two ranks; True
    when its ranks
    could not be stopped (its run directories must then stay for 'mlxops stop')."""
    if not req.sizes:
        return False
    info = result.allreduce_info
    info.update({"backend": spec.backend, "ranks": ranks, "avg_busbw_gbps": None,
                 "fit": None, "all_gather_fit": None, "error": None})
    if ranks < 2:
        info["error"] = "one rank: nothing to all-reduce"
        return False
    mark = time.monotonic()
    try:
        rows, gathered, ranks = allreduce.sweep(spec, connector, exclude=left_out,
                                                on_event=on_event)
    except MlxopsError as exc:
        if isinstance(exc, GroupError):
            for name in exc.results.unreachable:
                result.unreachable.setdefault(name, exc.results[name].message)
        info["error"] = str(exc)
        result.failures.append(f"all-reduce: {exc}")
        return isinstance(exc, allreduce.LeftRunning)
    finally:
        result.seconds["allreduce"] = time.monotonic() - mark
    result.allreduce, result.all_gather = rows, gathered
    info.update({"ranks": ranks, "avg_busbw_gbps": average_busbw(rows), "fit": fit(rows),
                 "all_gather_fit": fit(gathered)})
    if rows and len(rows) < len(req.sizes):  # the budget stopped it growing
        info["largest"] = rows[-1].bytes
    for what, got in (("all-reduce", rows), ("all_gather", gathered)):
        wrong = sum(r.wrong for r in got)
        if wrong:
            result.failures.append(f"{what}: {wrong} wrong element(s)")
    return False


def _remove_run_dirs(nodes: list[Node], connector: Connector, result: BenchResult) -> None:
    """The bench's run directory on every host (server pid file and log, sweep files)."""
    def work(node: Node) -> None:
        run_dir = node.paths.run_dir
        done = connector.connect(node.host).run(shell.join(["rm", "-rf", run_dir]), timeout=60)
        if not done.ok:
            raise MlxopsError(f"rm -rf {run_dir}: {done.error_line()}")

    removed = run_parallel(nodes, work, name=lambda n: n.name)
    for name in removed.failed:
        result.failures.append(f"{name}: {removed[name].message}")
