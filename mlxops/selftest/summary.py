"""What one ``mlxops selftest`` found: the record of the run, as ``--json`` prints it
(docs/formats.md, "mlxops selftest --json") and as the plain text a user pastes into a bug
report.

A run is the steps of :data:`STEPS`, in that order. Each has a result, its time, one line
of detail and the problems it met, every problem a line that starts with its host. Around
them: the controller and each host as its facts describe it (system, chip, memory, the
Python and MLX its jobs run), each link's figures and the all-reduce's from the bench, and
how the watchdog recovered the killed rank.

Exit code (docs/cli.md): 130 when Ctrl-C cut the run short; else 3 when a step could not
reach a host; else 1 when a step failed; else 0 (steps left out with ``--skip`` do not
count).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from mlxops import console
from mlxops.bench.results import BUSBW_FROM, BenchResult, average_busbw
from mlxops.errors import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE
from mlxops.hostfacts import HostFacts
from mlxops.selftest.choices import BENCH, CHECK, JOB, PROVISION, STOP, TRUST
from mlxops.transport.results import FAILED, SKIPPED, UNREACHABLE
from mlxops.transport.results import OK as OK  # a step's result too (S.OK)

VERSION = 1
#: The steps, in the order they run (docs/cli.md, "mlxops selftest"); named in .choices.
STEPS = (TRUST, PROVISION, CHECK, BENCH, JOB, STOP)
#: A step's result: a host result's words (mlxops.transport.results) and two of its own.
#: ``not run``: an earlier step failed or Ctrl-C came first.
NOT_RUN, INTERRUPTED = "not run", "interrupted"
EXIT_INTERRUPTED = 130
GIB = 1 << 30


@dataclass
class Step:
    name: str
    result: str = NOT_RUN
    seconds: float = 0.0
    detail: str = ""
    problems: list[str] = field(default_factory=list)   # "host: what was found"
    data: dict[str, Any] = field(default_factory=dict)  # the step's own figures

    @property
    def ran(self) -> bool:
        return self.result not in (NOT_RUN, SKIPPED)


@dataclass
class HostInfo:
    """One host as its facts describe it; ``python``/``mlx``: what its jobs run (the
    venv provision made under ``mlxops_root``, else ``mlxops_python``)."""

    name: str
    os: str | None = None          # "macOS 15.3.1 (24D70)", "Linux"
    arch: str | None = None
    chip: str | None = None
    memory_bytes: int | None = None
    cpu_cores: int | None = None
    gpu_cores: int | None = None
    python: str | None = None
    mlx: str | None = None

    @classmethod
    def from_facts(cls, name: str, facts: HostFacts | None) -> HostInfo:
        if facts is None:
            return cls(name)
        os_name = facts.system
        if facts.is_darwin:
            os_name = f"macOS {facts.macos_version or '?'}"
            if facts.macos_build:
                os_name += f" ({facts.macos_build})"
        interpreter = facts.interpreter()
        return cls(name, os_name, facts.arch, facts.chip, facts.memory_bytes,
                   facts.cpu_cores, facts.gpu_cores, interpreter.version, interpreter.mlx)


@dataclass
class Link:
    """One pair of hosts, both directions: best Gbit/s of each, round trip p50."""

    a: str
    b: str
    a_to_b_gbps: float | None
    b_to_a_gbps: float | None
    rtt_us: float | None


@dataclass
class Recovery:
    """The job step: which rank was killed, why the watchdog says it restarted, and how
    long from the kill until every rank of the new attempt had made a step."""

    rank: int
    host: str
    killed_at_step: int                      # its last heartbeat's, before the kill
    reason: str = ""
    resumed_from: int | None = None
    restart_seconds: float | None = None     # kill -> the watchdog's new attempt seen
    recovered_seconds: float | None = None   # kill -> every rank training again


@dataclass
class Summary:
    inventory: str
    hosts: list[str]
    limit: str | None
    controller: dict[str, str | None]
    steps: list[Step] = field(default_factory=lambda: [Step(name) for name in STEPS])
    host_info: list[HostInfo] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    ring: dict[str, Any] | None = None
    allreduce: dict[str, Any] | None = None
    recovery: Recovery | None = None
    interrupted: bool = False
    kept: bool = False
    duration: float = 0.0

    def step(self, name: str) -> Step:
        return next(s for s in self.steps if s.name == name)

    @property
    def exit_code(self) -> int:
        results = {s.result for s in self.steps}
        if self.interrupted:
            return EXIT_INTERRUPTED
        if UNREACHABLE in results:
            return EXIT_UNREACHABLE
        if results & {FAILED, INTERRUPTED, NOT_RUN}:
            return EXIT_FAILED  # a step not run is no pass, whatever kept it from running
        return EXIT_OK

    @property
    def passed(self) -> bool:
        return self.exit_code == EXIT_OK

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": VERSION, "ok": self.passed, "exit_code": self.exit_code,
            "interrupted": self.interrupted, "inventory": self.inventory,
            "limit": self.limit, "hosts": list(self.hosts), "controller": self.controller,
            "host_info": [asdict(h) for h in self.host_info],
            "steps": [{"name": s.name, "result": s.result, "seconds": round(s.seconds, 3),
                       "detail": s.detail, "problems": list(s.problems), "data": s.data}
                      for s in self.steps],
            "links": [asdict(x) for x in self.links], "ring": self.ring,
            "allreduce": self.allreduce,
            "recovery": asdict(self.recovery) if self.recovery else None,
            "kept": self.kept, "duration": round(self.duration, 3),
        }


# --- from the bench ------------------------------------------------------------------------


def links_from(result: BenchResult) -> list[Link]:
    """Each measured pair once (in the order the bench measured them), both directions."""
    links, seen = [], set()
    for pair in result.pairs:
        key = frozenset((pair.src, pair.dst))
        if key in seen:
            continue
        seen.add(key)
        back = result.pair(pair.dst, pair.src)
        rtt = (pair.latency_us or {}).get("median")
        if rtt is None and back is not None:
            rtt = (back.latency_us or {}).get("median")
        links.append(Link(pair.src, pair.dst, pair.bandwidth_gbps,
                          back.bandwidth_gbps if back else None, rtt))
    return links


def allreduce_from(result: BenchResult) -> dict[str, Any] | None:
    """The all-reduce in brief: backend, ranks, average busbw over sizes >= 1 MiB, and per
    size its time and busbw; None when none ran."""
    info = result.allreduce_info
    if not info:
        return None
    return {"backend": info.get("backend"), "ranks": info.get("ranks"),
            "busbw_gbps": average_busbw(result.allreduce), "busbw_from_bytes": BUSBW_FROM,
            "wrong": sum(r.wrong for r in result.allreduce), "error": info.get("error"),
            "sizes": [{"bytes": r.bytes, "time_us": r.time_us, "busbw_gbps": r.busbw_gbps}
                      for r in result.allreduce]}


def ring_from(result: BenchResult) -> dict[str, Any] | None:
    if result.ring is None:
        return None
    return {"order": list(result.ring.order), "bottleneck_gbps": result.ring.bottleneck_gbps,
            "inventory_bottleneck_gbps": result.ring.inventory_bottleneck_gbps}


# --- as text -------------------------------------------------------------------------------


def count(n: int, noun: str) -> str:
    """``1 host``, ``3 hosts``."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _num(x: float | None, unit: str = "") -> str:
    if x is None:
        return "-"
    text = f"{x:.3g}" if x < 1000 else f"{x:,.0f}"
    return f"{text}{unit}"


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int],
           wrap: set[int] = frozenset()) -> Any:
    table = console.table(*(console.column(h, right=i in right, wrap=i in wrap)
                            for i, h in enumerate(headers)))
    for row in rows:
        table.add_row(*row)
    return table


def host_table(infos: Sequence[HostInfo]) -> Any:
    rows = [[h.name, h.os or "-", h.chip or "-",
             _num(h.memory_bytes / GIB) if h.memory_bytes else "-",
             str(h.cpu_cores or "-"), str(h.gpu_cores or "-"), h.python or "-", h.mlx or "-"]
            for h in infos]
    return _table(["host", "system", "chip", "mem GiB", "cpus", "gpus", "python", "mlx"],
                  rows, right={3, 4, 5}, wrap={2})


def step_table(steps: Sequence[Step]) -> Any:
    rows = [[s.name, s.result, f"{s.seconds:.1f}" if s.ran else "", s.detail] for s in steps]
    return _table(["step", "result", "time s", "detail"], rows, right={2}, wrap={3})


def link_table(links: Sequence[Link]) -> Any:
    rows = [[f"{x.a} <> {x.b}", _num(x.a_to_b_gbps), _num(x.b_to_a_gbps), _num(x.rtt_us)]
            for x in links]
    return _table(["link", "a>b Gbit/s", "b>a Gbit/s", "rtt p50 us"], rows, right={1, 2, 3})


def headline(summary: Summary) -> list[str]:
    """The verdict, the controller, the inventory."""
    verdict = {0: "PASSED", EXIT_INTERRUPTED: "INTERRUPTED"}.get(summary.exit_code, "FAILED")
    c = summary.controller
    return [f"mlxops selftest: {verdict} (exit {summary.exit_code}) in "
            f"{summary.duration:.1f} s",
            f"controller: mlxops {c.get('mlxops')}, {c.get('system')}, Python "
            f"{c.get('python')}, mlx {c.get('mlx') or '-'}",
            f"inventory: {summary.inventory} ({count(len(summary.hosts), 'host')}"
            + (f", --limit {summary.limit}" if summary.limit else "") + ")"]


def figures(summary: Summary) -> list[str]:
    """The ring, the all-reduce and the recovery, one line each (when they ran)."""
    lines = []
    if summary.ring:
        lines.append(f"best ring: {' > '.join(summary.ring['order'])}, slowest link "
                     f"{_num(summary.ring['bottleneck_gbps'])} Gbit/s")
    ar = summary.allreduce
    if ar:
        sizes = ", ".join(f"{_size(s['bytes'])} {_num(s['time_us'])} us" for s in ar["sizes"])
        lines.append(f"all-reduce: {ar['ranks']} ranks ({ar['backend']}), busbw "
                     f"{_num(ar['busbw_gbps'])} Gbit/s (sizes >= "
                     f"{_size(ar['busbw_from_bytes'])})" + (f"; {sizes}" if sizes else "")
                     + (f"; {ar['wrong']} wrong" if ar["wrong"] else ""))
    r = summary.recovery
    if r and r.recovered_seconds is not None:
        lines.append(f"recovery: {r.recovered_seconds:.1f} s from kill -9 of rank {r.rank} "
                     f"on {r.host} (at step {r.killed_at_step}) to every rank training "
                     f"again from step {r.resumed_from}; the watchdog: {r.reason}, new "
                     f"attempt after {_num(r.restart_seconds)} s")
    return lines


def problem_lines(summary: Summary) -> list[str]:
    problems = [f"  {s.name}: {p}" for s in summary.steps for p in s.problems]
    return ["problems:", *problems] if problems else []


def render_text(summary: Summary) -> str:
    """The whole summary as plain text (no colours), tables at the width they need."""
    from rich.console import Console

    buffer = io.StringIO()
    out = Console(file=buffer, width=100_000, color_system=None, highlight=False,
                  soft_wrap=True)
    for line in [*headline(summary), ""]:
        out.print(line, markup=False)
    tables = [host_table(summary.host_info) if summary.host_info else None,
              step_table(summary.steps), link_table(summary.links) if summary.links else None]
    for table in tables:
        if table is not None:
            console.print_table(table, out)
            out.print()
    for line in [*figures(summary), *problem_lines(summary)]:
        out.print(line, markup=False)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()).strip() + "\n"
