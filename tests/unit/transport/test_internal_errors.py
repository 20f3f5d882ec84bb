"""A bug is not a host failure: unexpected exceptions are internal errors, MLXOPS_DEBUG=1
prints their tracebacks, and the CLI says "internal error" in one line.

The CLI cases run the real entry point in a subprocess, with a command added for the test,
so that what reaches stderr is exactly what a user would see.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from types import SimpleNamespace

import paramiko
import pytest

from mlxops.errors import InternalError, MlxopsError
from mlxops.transport import HostResult, HostUnreachable, run_parallel
from mlxops.transport.results import FAILED, OK, UNREACHABLE

HINT = "(rerun with MLXOPS_DEBUG=1 for the traceback)"


def _hosts(n: int) -> list[SimpleNamespace]:
    return [SimpleNamespace(name=f"mac{i}") for i in range(n)]


def _lookup_bug(host) -> HostResult:
    if host.name == "mac2":
        return {}["missing"]  # a KeyError: a bug in mlxops, not anything mac2 did
    return HostResult(host.name, OK)


@pytest.fixture
def no_debug(monkeypatch):
    monkeypatch.delenv("MLXOPS_DEBUG", raising=False)


@pytest.mark.parametrize("exc, status, message", [
    (HostUnreachable("mac0", "connection refused"), UNREACHABLE, "connection refused"),
    (MlxopsError("mac0: status failed"), FAILED, "MlxopsError: mac0: status failed"),
    (OSError("disk full"), FAILED, "OSError: disk full"),
    (EOFError("eof"), FAILED, "EOFError: eof"),
    (paramiko.SSHException("no session"), FAILED, "SSHException: no session"),
])
def test_a_host_failure_stays_that_hosts_result(no_debug, exc, status, message):
    def work(host) -> HostResult:
        raise exc

    results = run_parallel(_hosts(1), work)
    assert results["mac0"].status == status
    assert results["mac0"].message == message


def test_a_key_error_in_work_is_an_internal_error_not_a_failed_host(no_debug, capsys):
    with pytest.raises(InternalError) as info:
        run_parallel(_hosts(4), _lookup_bug, forks=4)
    assert str(info.value) == "KeyError: 'missing' on mac2"
    assert isinstance(info.value.__cause__, KeyError)
    assert list(info.value.errors) == ["mac2"]
    assert capsys.readouterr().err == ""  # no traceback unless asked for


def test_every_host_with_the_bug_is_named_in_host_order(no_debug):
    barrier = threading.Barrier(3, timeout=5)  # all three under way before any raises

    def work(host) -> HostResult:
        barrier.wait()
        raise TypeError(f"bad {host.name}")

    with pytest.raises(InternalError) as info:
        run_parallel(_hosts(3), work, forks=3)
    assert str(info.value) == "TypeError: bad mac0 on mac0 (and on 2 more hosts)"
    assert list(info.value.errors) == ["mac0", "mac1", "mac2"]


def test_a_bug_starts_no_further_host(no_debug):
    started: list[str] = []

    def work(host) -> HostResult:
        started.append(host.name)
        if host.name == "mac1":
            raise AttributeError("no attribute 'ip'")
        return HostResult(host.name, OK)

    with pytest.raises(InternalError):
        run_parallel(_hosts(6), work, forks=1)
    assert started == ["mac0", "mac1"]


def test_hosts_in_flight_finish_before_the_bug_is_raised(no_debug):
    barrier = threading.Barrier(3, timeout=5)
    finished: list[str] = []

    def work(host) -> HostResult:
        barrier.wait()  # all three are under way when mac1 hits the bug
        if host.name == "mac1":
            raise KeyError("x")
        finished.append(host.name)
        return HostResult(host.name, OK)

    with pytest.raises(InternalError):
        run_parallel(_hosts(3), work, forks=3)
    assert sorted(finished) == ["mac0", "mac2"]


def test_mlxops_debug_prints_the_hosts_traceback(monkeypatch, capsys):
    monkeypatch.setenv("MLXOPS_DEBUG", "1")
    with pytest.raises(InternalError):
        run_parallel(_hosts(3), _lookup_bug)
    err = capsys.readouterr().err
    assert "mlxops: internal error on mac2: KeyError: 'missing'" in err
    assert "Traceback (most recent call last)" in err
    assert "_lookup_bug" in err and 'return {}["missing"]' in err


# --- the command line ------------------------------------------------------------------------

SCRIPT = textwrap.dedent("""\
    import click
    from types import SimpleNamespace
    from mlxops.cli import cli, main
    from mlxops.errors import MlxopsError
    from mlxops.transport import HostResult, run_parallel

    def lookup_in_a_command():
        return {}["missing"]

    def lookup_on_a_host(host):
        return {}[host.name]

    @cli.command("boom")
    @click.argument("kind")
    def boom(kind):
        if kind == "bug":
            lookup_in_a_command()
        if kind == "host-bug":
            run_parallel([SimpleNamespace(name="mac1")], lookup_on_a_host)
        raise MlxopsError("the job file says no")

    main()
""")


def mlxops_with_boom(kind: str, debug: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MLXOPS_DEBUG"}
    if debug:
        env["MLXOPS_DEBUG"] = "1"
    return subprocess.run([sys.executable, "-c", SCRIPT, "boom", kind], capture_output=True,
                          text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)


def test_cli_bug_is_one_line_internal_error_exit_1():
    proc = mlxops_with_boom("bug", debug=False)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr == f"mlxops: internal error: KeyError: 'missing' {HINT}\n"
    assert proc.stdout == ""


def test_cli_bug_with_mlxops_debug_prints_the_traceback():
    proc = mlxops_with_boom("bug", debug=True)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback (most recent call last)" in proc.stderr
    assert "lookup_in_a_command" in proc.stderr
    assert proc.stderr.splitlines()[-1] == "mlxops: internal error: KeyError: 'missing'"


def test_cli_bug_on_a_host_names_the_host():
    proc = mlxops_with_boom("host-bug", debug=False)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr == f"mlxops: internal error: KeyError: 'mac1' on mac1 {HINT}\n"


def test_cli_bug_on_a_host_with_mlxops_debug_prints_both_sides():
    proc = mlxops_with_boom("host-bug", debug=True)
    assert proc.returncode == 1, proc.stderr
    err = proc.stderr
    assert "mlxops: internal error on mac1: KeyError: 'mac1'" in err
    assert "lookup_on_a_host" in err           # the host's side (the worker thread)
    assert "run_parallel" in err and "boom" in err  # the controller's side
    assert err.splitlines()[-1] == "mlxops: internal error: KeyError: 'mac1' on mac1"


def test_cli_user_error_is_one_line_and_with_mlxops_debug_its_traceback():
    plain = mlxops_with_boom("user", debug=False)
    assert plain.returncode == 1
    assert plain.stderr == "mlxops: error: the job file says no\n"
    debug = mlxops_with_boom("user", debug=True)
    assert debug.returncode == 1
    assert "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.splitlines()[-1] == "mlxops: error: the job file says no"
