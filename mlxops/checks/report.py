"""What ``mlxops check`` prints: the host x check table, one line per finding, ``--json``.

The table has a row per check and a column per host, split into several tables when the
hosts do not fit across the terminal (a column is as wide as its host's name). Under it:
every failure in one line (``mac2: mlx 0.31.0, controller 0.32.4: run mlxops provision``),
each unreachable host once, the skips grouped by reason, and the counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from mlxops import console
from mlxops.checks.outcome import ERROR, FAILED, OUTCOMES, PASSED, SKIPPED, UNREACHABLE, CheckResult
from mlxops.checks.run import Report

CELL = {PASSED: ("ok", "green"), FAILED: ("FAIL", "bold red"), SKIPPED: ("skip", "cyan"),
        ERROR: ("ERROR", "bold red"), UNREACHABLE: ("unreach", "magenta")}
NOT_PER_HOST = "all"      # the column of a user's check that is not per host
CHECK_HEADER = "check"


def columns(report: Report) -> list[str]:
    hosts = list(report.hosts)
    if any(r.host is None for r in report.results):
        hosts.append(NOT_PER_HOST)
    return hosts


def host_groups(report: Report, width: int) -> list[list[str]]:
    """The hosts split so that each table fits ``width`` columns."""
    check_width = max([len(CHECK_HEADER), *(len(c) for c in report.checks)])
    cell = max(len(text) for text, _ in CELL.values())
    groups: list[list[str]] = [[]]
    used = check_width
    for host in columns(report):
        need = 2 + max(len(host), cell)
        if groups[-1] and used + need > width:
            groups.append([])
            used = check_width
        groups[-1].append(host)
        used += need
    return groups


def table(report: Report, hosts: Sequence[str]) -> Table:
    """Rows of checks, a column per host: ok, FAIL, skip, ERROR, unreach, or blank where
    the check does not apply to the host."""
    t = console.table(console.column(CHECK_HEADER), *(console.column(h) for h in hosts))
    cells = {(r.check, r.host or NOT_PER_HOST): r.outcome for r in report.results}
    for check in report.checks:
        row = []
        for host in hosts:
            outcome = cells.get((check, host))
            text, style = CELL.get(outcome, ("", ""))
            row.append(Text(text, style=style))
        t.add_row(check, *row)
    return t


def skip_lines(results: Sequence[CheckResult]) -> list[str]:
    """``skipped: REASON: check_a, check_b on mac1, mac2``, one line per reason."""
    by_reason: dict[str, tuple[dict[str, None], dict[str, None]]] = {}
    for r in results:
        if r.outcome == SKIPPED:
            checks, hosts = by_reason.setdefault(r.message, ({}, {}))
            checks[r.check] = None
            hosts[r.host or NOT_PER_HOST] = None
    return [f"skipped: {reason}: {', '.join(checks)} on {', '.join(hosts)}"
            for reason, (checks, hosts) in by_reason.items()]


def finding_lines(report: Report) -> list[str]:
    """Failures and errors, one line each; an unreachable host once."""
    lines, seen = [], set()
    for r in report.results:
        if r.outcome in (FAILED, ERROR):
            lines.append(r.message)
        elif r.outcome == UNREACHABLE and r.host not in seen:
            seen.add(r.host)
            lines.append(r.message)
    return list(dict.fromkeys(lines))


def counts(report: Report) -> dict[str, int]:
    return {o: sum(r.outcome == o for r in report.results) for o in OUTCOMES}


def summary(report: Report) -> str:
    c = counts(report)
    said = ", ".join(f"{n} {o}" for o, n in c.items() if n or o in (PASSED, FAILED))
    attempts = f", attempt {report.attempts}" if report.attempts > 1 else ""
    return (f"{len(report.hosts)} hosts, {len(report.checks)} checks: {said} "
            f"({report.duration:.1f} s{attempts})")


def print_report(report: Report) -> None:
    width = console.out.width if console.out.is_terminal else 10_000
    for hosts in host_groups(report, width):
        console.print_table(table(report, hosts))
        console.out.print()
    for line in finding_lines(report):
        console.out.print(line, style="red", markup=False)
    for line in skip_lines(report.results):
        console.out.print(line, style="cyan", markup=False)
    console.out.print(summary(report), style="bold", markup=False)
    if report.junitxml:
        console.out.print(f"JUnit XML: {report.junitxml}", style="dim", markup=False)


def to_json(report: Report) -> dict[str, Any]:
    """The ``mlxops check --json`` document (docs/formats.md)."""
    return {
        "ok": report.exit_code == 0,
        "exit_code": report.exit_code,
        "hosts": list(report.hosts),
        "checks": list(report.checks),
        "results": [{"check": r.check, "host": r.host, "outcome": r.outcome,
                     "message": r.message} for r in report.results],
        "counts": counts(report),
        "attempts": report.attempts,
        "duration": round(report.duration, 3),
        "junitxml": report.junitxml,
    }
