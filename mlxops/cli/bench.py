"""``mlxops bench INVENTORY``: latency, bandwidth and all-reduce figures, and the best ring."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from mlxops import console
from mlxops.bench.budget import DEFAULT_BUDGET
from mlxops.bench.choices import ALL, RING, default_port
from mlxops.cli.options import (
    connect_options,
    inventory_argument,
    json_option,
    limit_option,
)
from mlxops.errors import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, bad_input

if TYPE_CHECKING:
    from rich.table import Table

    from mlxops.bench.results import BenchResult
    from mlxops.bench.run import Request

MAX_STREAMS = 128
DEFAULT_SIZES = "4K..256M"


def parse_streams(text: str) -> tuple[int, ...]:
    try:
        streams = sorted({int(w) for w in text.split(",") if w.strip()})
    except ValueError:
        raise bad_input("--streams", None, f"{text!r}: want stream counts, e.g. 1,4") from None
    if not streams or not all(1 <= k <= MAX_STREAMS for k in streams):
        raise bad_input("--streams", None, f"{text!r}: want counts from 1 to {MAX_STREAMS}")
    return tuple(streams)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def _num(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}g}" if x < 1000 else f"{x:.0f}"


def pairs_table(result: BenchResult) -> Table:
    """One row per direction: round trip (the pair's), Gbit/s per stream count, and both
    ways at once (ring links)."""
    streams = sorted({k for p in result.pairs for k in p.streams}, key=int)
    t = console.table(console.column("from", wrap=True), console.column("to", wrap=True),
                      console.column("rtt p50 us", right=True),
                      console.column("rtt p99 us", right=True),
                      *(console.column(f"{k}x Gbit/s", right=True) for k in streams),
                      console.column("both Gbit/s", right=True),
                      title="links (round trip; bandwidth by parallel streams)")
    for p in result.pairs:
        lat = p.latency_us or {}
        if p.error:
            t.add_row(p.src, p.dst, "[red]failed[/]", "", *("" for _ in streams), "")
            continue
        t.add_row(p.src, p.dst, _num(lat.get("median")), _num(lat.get("p99")),
                  *(_num(p.streams.get(k)) for k in streams), _num(p.bidir_gbps))
    return t


def loopback_table(result: BenchResult) -> Table:
    t = console.table(console.column("host", wrap=True),
                      console.column("rtt p50 us", right=True),
                      console.column("rtt p99 us", right=True),
                      console.column("Gbit/s", right=True),
                      title="loopback floor per host (each host to itself)")
    for lb in result.loopback:
        lat = lb.latency_us or {}
        if lb.error:
            t.add_row(lb.host, "[red]failed[/]", "", "")
            continue
        t.add_row(lb.host, _num(lat.get("median")), _num(lat.get("p99")),
                  _num(lb.bandwidth_gbps))
    return t


def allreduce_table(result: BenchResult) -> Table:
    """The sweep, one row a size: the all-reduce's figures, then the all_gather's time at
    that size (``mlxops plan`` predicts a sharded step's gather from it); ``wrong``: both."""
    info = result.allreduce_info
    t = console.table(console.column("size", right=True), console.column("time us", right=True),
                      console.column("algbw Gbit/s", right=True),
                      console.column("busbw Gbit/s", right=True),
                      console.column("gather us", right=True),
                      console.column("wrong", right=True),
                      title=f"all-reduce (all_sum, float32, {info.get('ranks')} ranks, "
                            f"{info.get('backend')}); gather: all_gather of that size")
    gathers = {i: g for i, g in enumerate(result.all_gather)}
    for i, r in enumerate(result.allreduce):
        g = gathers.get(i)
        wrong = r.wrong + (g.wrong if g else 0)
        t.add_row(_size(r.bytes), _num(r.time_us, 4), _num(r.algbw_gbps), _num(r.busbw_gbps),
                  _num(g.time_us, 4) if g else "", f"[bold red]{wrong}[/]" if wrong else "0")
    return t


def report_lines(result: BenchResult) -> list[str]:
    """What is printed under the tables: findings, problems."""
    lines = [f"- {f['message']}" for f in result.findings if f["kind"] != "loopback"]
    largest = result.allreduce_info.get("largest")
    if largest:
        lines.append(f"all-reduce: sizes up to {_size(largest)}: a larger one would not have "
                     "fit the time budget (--thorough: every size)")
    lines += [f"unreachable: {h}: {why}" for h, why in result.unreachable.items()]
    lines += [f"failed: {why}" for why in result.failures]
    return lines


def _print(result: BenchResult) -> None:
    if result.pairs:
        console.print_table(pairs_table(result))
        console.out.print()
    if result.loopback:
        console.print_table(loopback_table(result))
        console.out.print()
    if result.allreduce:
        console.print_table(allreduce_table(result))
        console.out.print()
    for line in report_lines(result):
        console.out.print(line, markup=False)


@click.command("bench")
@inventory_argument
@limit_option
@click.option("--pairs", type=click.Choice([ALL, RING]), default=ALL, show_default=True,
              help="Measure every pair (and search the best ring), or only the links of the "
                   "inventory order's ring.")
@click.option("--budget", type=click.FloatRange(0, None), default=DEFAULT_BUDGET,
              show_default=True, metavar="SECONDS",
              help="About how long the whole bench may take: each run's length comes from "
                   "it, and the all-reduce stops growing the size once the next would not "
                   "fit. 0: no budget.")
@click.option("--thorough", is_flag=True,
              help="The full sweep, however long it takes: no budget, streams 1,4, 5 s "
                   "runs after 1 s left out, every all-reduce size.")
@click.option("--streams", default=None,
              help="Parallel TCP streams per bandwidth run, comma separated. Default 4; "
                   "1,4 with --thorough.")
@click.option("--seconds", type=click.FloatRange(0.1, 3600), default=None,
              help="Measured seconds of each bandwidth run. Default: from the budget; 5 "
                   "with --thorough or --budget 0.")
@click.option("--omit", type=click.FloatRange(0, 60), default=None,
              help="Seconds at the start of each run left out (TCP slow start), like "
                   "iperf3 -O. Default: half of --seconds from the budget; 1 with "
                   "--thorough or --budget 0.")
@click.option("--serial", is_flag=True,
              help="One pair at a time (links that share a medium: Wi-Fi, one uplink).")
@click.option("--iperf3", is_flag=True,
              help="Bandwidth through iperf3 -J where both hosts have it (a cross-check).")
@click.option("--sizes", default=None,
              help="All-reduce sizes: LOW..HIGH in powers of two, a list 4K,1M, or none. "
                   "Default 4K..256M, as far as the budget allows (all of them with "
                   "--thorough, or when given).")
@click.option("--min-busbw", type=click.FloatRange(0, None), default=None, metavar="GBITS",
              help="Exit 1 when the average all-reduce busbw over sizes >= 1 MiB is below "
                   "this (Gbit/s).")
@click.option("--port", type=click.IntRange(1024, 65000), default=None,
              help="The servers' port (iperf3: the next one; all-reduce ranks: from two "
                   f"above). Default {default_port()}, derived like a job's.")
@click.option("--apply", "apply_", is_flag=True,
              help="Write the best ring order into every host's hostfiles.")
@json_option
@connect_options
def command(inventory, limit, pairs, budget, thorough, streams, seconds, omit, serial, iperf3,
            sizes, min_busbw, port, apply_, as_json, connect):
    """Measure every link (latency, bandwidth), a real all-reduce, and find the ring order
    whose slowest link is fastest.

    \b
    Example:
      mlxops bench inventory.yml                  # everything, within about 30 s
      mlxops bench inventory.yml --thorough       # longer runs, 1 and 4 streams, ~3 min
      mlxops bench inventory.yml --seconds 2 --sizes 1M..64M --apply
    """
    from mlxops.bench.measure import Settings
    from mlxops.bench.results import average_busbw, save
    from mlxops.bench.run import Request, parse_sizes, run_bench
    from mlxops.inventory.variables import ring_order_line
    from mlxops.transport import Connector

    if thorough:
        budget = 0.0
    # The budget decides what was not asked for: the runs' length, the largest size.
    plan_runs = bool(budget) and seconds is None and omit is None
    plan_sweep = bool(budget) and sizes is None
    settings = Settings(streams=parse_streams(streams or ("1,4" if not budget else "4")),
                        seconds=5.0 if seconds is None else seconds,
                        omit=1.0 if omit is None else omit,
                        serial=serial, iperf3=iperf3, port=port or default_port())
    size_list = parse_sizes(sizes or DEFAULT_SIZES)
    if min_busbw is not None and not size_list:
        raise bad_input("--min-busbw", None, "needs an all-reduce: --sizes is none")
    if apply_ and pairs == RING:
        raise bad_input("--apply", None, "needs --pairs all: only a search over every pair "
                                         "finds a better order")
    req = Request(inventory=Path(inventory), limit=limit, pairs=pairs, settings=settings,
                  sizes=size_list, budget=budget, plan_runs=plan_runs,
                  plan_sweep=plan_sweep)
    progress = console.err.is_terminal

    def on_event(message: str) -> None:
        if progress:
            console.err.print(f"[dim]{message}[/]")

    with Connector(connect) as connector:
        result = run_bench(req, connector, on_event)
        busbw = average_busbw(result.allreduce)
        if min_busbw is not None and (busbw is None or busbw < min_busbw):
            result.failures.append(f"--min-busbw: average busbw {_num(busbw)} Gbit/s is below "
                                   f"{min_busbw:g}")
        applied = _apply(result, req, connector) if apply_ else None
        path = save(result)
    if as_json:
        doc = result.to_dict()
        doc["file"] = str(path)
        if applied is not None:
            doc["applied"] = applied
        console.print_json(doc)
    else:
        _print(result)
        console.out.print(f"saved: {path}", markup=False)
        for host, status in (applied or {}).items():
            console.out.print(f"apply: {host}: {status}", markup=False)
        if applied and result.ring is not None and not result.failures:
            console.out.print(f"apply: to keep this order in jobs and through provision, "
                              f"add under all: vars in {inventory}: "
                              f"{ring_order_line(result.ring.order)}", markup=False)
    if result.unreachable:
        sys.exit(EXIT_UNREACHABLE)
    sys.exit(EXIT_FAILED if result.failures else EXIT_OK)


def _apply(result: BenchResult, req: Request, connector) -> dict[str, str]:
    """``{host: status or why not}``; nothing is written unless every host was measured."""
    ring = result.ring
    if result.unreachable or result.failures or ring is None or len(ring.order) < 2:
        why = "not applied: " + ("hosts unreachable" if result.unreachable else
                                 "a measurement failed" if result.failures else "no ring")
        result.failures.append(f"--apply: {why}")
        return {h: why for h in result.hosts}
    from mlxops.bench.apply import apply_order

    results = apply_order(req.inventory, req.limit, ring.order, connector)
    for name in results.failed + results.unreachable:
        result.failures.append(f"--apply: {name}: {results[name].message}")
    return {name: r.status + (f": {r.message}" if r.message else "")
            for name, r in results.items()}
