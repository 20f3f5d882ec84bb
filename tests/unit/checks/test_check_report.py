"""What ``mlxops check`` prints: the host x check table fits 80 columns however many Macs
there are (split across tables, never cut), and one line per finding under it."""

from __future__ import annotations

import io
import re

from rich.console import Console

from mlxops import console
from mlxops.checks import report
from mlxops.checks.outcome import CheckResult
from mlxops.checks.run import Report, order

HOSTS = ["studio1", "studio2", "mini-rack-07", "macbook-pro", "studio3", "studio4",
         "mini-rack-08", "mini-rack-09", "mini-rack-10"]
CHECKS = ["check_ssh", "check_interpreter", "check_mlx", "check_env_file", "check_hostfiles",
          "check_synced_code", "check_disk", "check_memory", "check_ring_ports",
          "check_leftover_ranks", "check_clock", "check_wired_limit", "check_sleep",
          "check_versions_agree", "check_ring_reach"]


def sample() -> Report:
    results = []
    for check in CHECKS:
        for host in HOSTS:
            outcome, message = "passed", ""
            if host == "macbook-pro" and check == "check_mlx":
                outcome, message = "failed", "macbook-pro: mlx 0.31.0, controller 0.32.4: " \
                                             "run mlxops provision"
            elif host == "mini-rack-10":
                outcome, message = "unreachable", "mini-rack-10: unreachable: cannot connect " \
                                                  "to 10.0.0.20: timed out"
            elif host == "studio4" and check in ("check_wired_limit", "check_sleep"):
                outcome, message = "skipped", "not on a Mac here"
            results.append(CheckResult(check, host, outcome, message,
                                       module="mlxops.checks.check_host",
                                       line=CHECKS.index(check)))
    return Report(HOSTS, results, duration=2.34, checks=list(CHECKS))


def render(rep: Report, width: int = 80) -> str:
    buf = io.StringIO()
    con = Console(file=buf, width=width, force_terminal=True, color_system=None,
                  highlight=False, soft_wrap=True)
    saved = console.out
    console.out = con
    try:
        report.print_report(rep)
    finally:
        console.out = saved
    return buf.getvalue()


def test_the_table_fits_80_columns_split_by_hosts_and_names_every_host_whole():
    text = render(sample())
    assert "…" not in text
    assert all(len(line.rstrip()) <= 80 for line in text.splitlines()), text
    headers = [line.split() for line in text.splitlines() if line.startswith("check ")]
    assert len(headers) >= 2   # nine Macs do not fit across 80 columns
    assert [h for header in headers for h in header[1:]] == HOSTS
    row = next(line for line in text.splitlines() if line.startswith("check_mlx "))
    assert row.split()[1:5] == ["ok", "ok", "ok", "FAIL"]


def test_under_the_table_each_finding_once_and_the_skips_by_reason():
    text = render(sample())
    lines = text.splitlines()
    assert "macbook-pro: mlx 0.31.0, controller 0.32.4: run mlxops provision" in lines
    # An unreachable host is said once, not once per check.
    assert [ln for ln in lines if ln.startswith("mini-rack-10: unreachable")] == [
        "mini-rack-10: unreachable: cannot connect to 10.0.0.20: timed out"]
    assert "skipped: not on a Mac here: check_wired_limit, check_sleep on studio4" in lines
    assert lines[-1] == ("9 hosts, 15 checks: 117 passed, 1 failed, 2 skipped, "
                         "15 unreachable (2.3 s)")


def test_a_blank_cell_where_a_check_does_not_apply_and_an_all_column_for_the_rest():
    rep = Report(["a", "b"], [
        CheckResult("check_wired_limit", "a", "passed"),
        CheckResult("test_once", None, "passed"),
    ], checks=["check_wired_limit", "test_once"])
    text = render(rep)
    assert re.search(r"^check_wired_limit\s+ok\s*$", text, re.M), text
    assert re.search(r"^test_once\s+ok\s*$", text, re.M)
    assert text.splitlines()[0].split() == ["check", "a", "b", "all"]


def test_the_shipped_checks_come_first_in_their_order_then_the_users():
    results = [
        CheckResult("test_mine", "b", "passed", module="test_site", line=1),
        CheckResult("check_mlx", "b", "passed", module="mlxops.checks.check_host", line=30),
        CheckResult("check_ring_reach", "a", "passed", module="mlxops.checks.check_cluster",
                    line=40),
        CheckResult("check_mlx", "a", "passed", module="mlxops.checks.check_host", line=30),
        CheckResult("check_ssh", "a", "passed", module="mlxops.checks.check_host", line=10),
    ]
    got = [(r.check, r.host) for r in order(results, ["a", "b"])]
    assert got == [("check_ssh", "a"), ("check_mlx", "a"), ("check_mlx", "b"),
                   ("check_ring_reach", "a"), ("test_mine", "b")]


def test_json_has_every_result_and_the_counts():
    doc = report.to_json(sample())
    assert doc["ok"] is False and doc["exit_code"] == 3
    assert len(doc["results"]) == len(HOSTS) * len(CHECKS)
    assert doc["counts"] == {"passed": 117, "failed": 1, "skipped": 2, "error": 0,
                             "unreachable": 15}
    assert doc["results"][0] == {"check": "check_ssh", "host": "studio1",
                                 "outcome": "passed", "message": ""}
