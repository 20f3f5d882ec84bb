"""Transport's pure parts: fingerprints, known_hosts, results, the executor, local commands.

Nothing here touches SSH; the sandbox integration tests cover real connections.
"""

from __future__ import annotations

import base64
import os
import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import paramiko
import pytest

from mlxops.errors import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE
from mlxops.transport import HostResult, HostUnreachable, LocalConnection, Results, run_parallel
from mlxops.transport.connection import TIMED_OUT
from mlxops.transport.hostkeys import (
    ChangedHostKey,
    HostKeyPolicy,
    KnownHosts,
    UnknownHostKey,
    fingerprint,
    lookup_name,
)
from mlxops.transport.results import CHANGED, FAILED, OK, SKIPPED, UNREACHABLE, CommandResult


def _keygen(tmp_path: Path, kind: str) -> tuple[Path, paramiko.PKey]:
    key = tmp_path / f"key_{kind}"
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "test", "-f", str(key)],
                   check=True, capture_output=True)
    pub = key.with_name(key.name + ".pub")
    ktype, blob = pub.read_text().split()[:2]
    return pub, paramiko.PKey.from_type_string(ktype, base64.b64decode(blob))


def _ssh_keygen_fingerprint(pub: Path) -> str:
    out = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", str(pub)], check=True,
                         capture_output=True, text=True).stdout
    return out.split()[1]


# --- host keys ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["ed25519", "ecdsa", "rsa"])
def test_fingerprint_matches_ssh_keygen(tmp_path, kind):
    pub, key = _keygen(tmp_path, kind)
    expected = _ssh_keygen_fingerprint(pub)
    assert expected.startswith("SHA256:")
    assert fingerprint(key) == expected


def test_lookup_name_port_22_bare_else_bracketed():
    assert lookup_name("10.1.2.3", 22) == "10.1.2.3"
    assert lookup_name("studio1.local", 22) == "studio1.local"
    assert lookup_name("10.1.2.3", 2222) == "[10.1.2.3]:2222"
    assert lookup_name("fe80::1", 2200) == "[fe80::1]:2200"


@pytest.mark.parametrize("name", ["10.9.8.7", "[10.9.8.7]:2222", "mac1.example"])
def test_known_hosts_record_is_found_by_ssh_keygen(tmp_path, name):
    pub, key = _keygen(tmp_path, "ed25519")
    path = tmp_path / "ssh" / "known_hosts"  # parent missing: record makes it
    store = KnownHosts(path, system_path=None)
    assert store.keys_for(name) == {}

    store.record(name, key)

    assert store.keys_for(name) == {"ssh-ed25519": key}
    assert path.stat().st_mode & 0o777 == 0o600
    found = subprocess.run(["ssh-keygen", "-F", name, "-f", str(path)],
                           capture_output=True, text=True)
    assert found.returncode == 0, found.stderr
    assert key.get_base64() in found.stdout
    # A fresh parse of the file (the next run) knows it too.
    assert KnownHosts(path, system_path=None).keys_for(name) == {"ssh-ed25519": key}


def test_known_hosts_record_appends_never_rewrites(tmp_path):
    path = tmp_path / "known_hosts"
    path.write_text("# mine\nother.host ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKx4\n")
    _, key = _keygen(tmp_path, "ed25519")
    KnownHosts(path, system_path=None).record("10.0.0.5", key)
    lines = path.read_text().splitlines()
    assert lines[:2] == ["# mine", "other.host ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKx4"]
    assert lines[2] == f"10.0.0.5 ssh-ed25519 {key.get_base64()}"


def test_policy_refuses_unknown_key_with_fingerprint_unless_accept_new(tmp_path):
    pub, key = _keygen(tmp_path, "ed25519")
    store = KnownHosts(tmp_path / "known_hosts", system_path=None)
    with pytest.raises(UnknownHostKey) as info:
        HostKeyPolicy("mac1", store, accept_new=False).missing_host_key(None, "10.0.0.5", key)
    assert _ssh_keygen_fingerprint(pub) in str(info.value)
    assert isinstance(info.value, HostUnreachable)
    assert not (tmp_path / "known_hosts").exists()

    HostKeyPolicy("mac1", store, accept_new=True).missing_host_key(None, "10.0.0.5", key)
    assert store.keys_for("10.0.0.5") == {"ssh-ed25519": key}


def test_changed_key_message(tmp_path):
    _, old = _keygen(tmp_path, "ed25519")
    (tmp_path / "new").mkdir()
    _, new = _keygen(tmp_path / "new", "ed25519")
    exc = ChangedHostKey("mac1", "10.0.0.5", new, old, tmp_path / "known_hosts")
    assert "HOST KEY CHANGED" in str(exc)
    assert fingerprint(new) in str(exc) and fingerprint(old) in str(exc)


# --- results --------------------------------------------------------------------------------


def _results(*statuses: str) -> Results:
    return Results({f"h{i}": HostResult(f"h{i}", s) for i, s in enumerate(statuses)})


@pytest.mark.parametrize("statuses, code", [
    ((), EXIT_OK),
    ((OK, CHANGED, SKIPPED), EXIT_OK),
    ((OK, FAILED), EXIT_FAILED),
    ((OK, UNREACHABLE), EXIT_UNREACHABLE),
    ((FAILED, UNREACHABLE, OK), EXIT_UNREACHABLE),
    ((UNREACHABLE, FAILED), EXIT_UNREACHABLE),
])
def test_results_exit_code_precedence(statuses, code):
    assert _results(*statuses).exit_code == code


def test_results_partitions():
    r = _results(OK, FAILED, UNREACHABLE, CHANGED, SKIPPED)
    assert r.failed == ["h1"]
    assert r.unreachable == ["h2"]
    assert r.succeeded == ["h0", "h3", "h4"]
    assert list(r) == ["h0", "h1", "h2", "h3", "h4"]


# --- executor -------------------------------------------------------------------------------


def _hosts(n: int) -> list[SimpleNamespace]:
    return [SimpleNamespace(name=f"mac{i}") for i in range(n)]


@pytest.mark.parametrize("forks", [1, 8])
def test_run_parallel_keeps_order_and_turns_exceptions_into_results(forks):
    hosts = _hosts(8)
    seen: list[str] = []

    def work(host) -> HostResult:
        i = int(host.name[3:])
        time.sleep(0.01 * (8 - i))  # later hosts finish first when run together
        if i == 2:
            raise HostUnreachable(host.name, "connection refused")
        if i == 5:
            raise OSError("boom")  # a host's failure (a bug is not: test_internal_errors.py)
        return HostResult(host.name, OK, "fine")

    results = run_parallel(hosts, work, forks=forks, on_result=lambda r: seen.append(r.host))

    assert list(results) == [h.name for h in hosts]
    assert sorted(seen) == sorted(results)
    assert results["mac2"].status == UNREACHABLE
    assert results["mac2"].message == "connection refused"
    assert results["mac5"].status == FAILED
    assert results["mac5"].message == "OSError: boom"
    assert all(results[h].status == OK for h in results if h not in ("mac2", "mac5"))
    assert all(r.duration > 0 for r in results.values())
    assert results.exit_code == EXIT_UNREACHABLE


@pytest.mark.parametrize("forks", [1, 3, 8])
def test_run_parallel_bounds_concurrency(forks):
    lock = threading.Lock()
    running = peak = 0

    def work(host) -> HostResult:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.05)
        with lock:
            running -= 1
        return HostResult(host.name)

    run_parallel(_hosts(8), work, forks=forks)
    assert peak <= forks
    assert peak >= min(forks, 2)  # forks > 1 really runs hosts together


def test_run_parallel_all_hosts_at_once_with_forks_8():
    barrier = threading.Barrier(8, timeout=5)  # breaks unless all 8 are in flight together

    def work(host) -> HostResult:
        barrier.wait()
        return HostResult(host.name)

    results = run_parallel(_hosts(8), work, forks=8)
    assert results.exit_code == EXIT_OK


def test_run_parallel_no_hosts():
    assert len(run_parallel([], lambda h: HostResult(h.name))) == 0


# --- a failed command in one line -----------------------------------------------------------


@pytest.mark.parametrize("stdout, stderr, timed_out, line", [
    ("partial\n", "Traceback (most recent call last):\n  ...\nKeyError: 'x'\n", False,
     "exit 1: KeyError: 'x'"),
    ("first\nlast words\n\n", "", False, "exit 1: last words"),   # no stderr: stdout's
    ("", "  \n", False, "exit 1"),                                    # nothing at all
    ("", "", True, "exit 1 (timed out)"),
])
def test_error_line_is_the_last_line_of_stderr_else_stdout_else_the_exit_code(
        stdout, stderr, timed_out, line):
    result = CommandResult("cmd", 1, stdout, stderr, 0.1, timed_out)
    assert result.error_line() == line


# --- local connection ----------------------------------------------------------------------


def test_local_run_feeds_binary_stdin():
    data = bytes(range(256)) * 1000
    conn = LocalConnection("localhost")
    result = conn.run("wc -c", stdin=data)
    assert result.ok and result.stdout.strip() == str(len(data))
    assert not result.timed_out

    result = conn.run("cat; echo err >&2; exit 7", stdin=b"hello\n")
    assert result.exit_code == 7 and not result.ok
    assert result.stdout == "hello\n" and result.stderr == "err\n"


def test_local_run_stdin_file_object(tmp_path):
    src = tmp_path / "in.bin"
    src.write_bytes(b"\x00\x01abc" * 5000)
    with src.open("rb") as f:
        result = LocalConnection("localhost").run("wc -c", stdin=f)
    assert result.stdout.strip() == "25000"


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")  # killed; only waiting for its (re)parent to reap it


def test_local_run_timeout_kills_the_process_group(tmp_path):
    pidfile = tmp_path / "child.pid"
    start = time.monotonic()
    result = LocalConnection("localhost").run(
        f"sleep 60 & echo $! > {pidfile}; echo started; wait", timeout=0.5)
    assert time.monotonic() - start < 10
    assert result.timed_out is True
    assert result.exit_code == TIMED_OUT == 124
    assert not result.ok
    assert result.stdout == "started\n"
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(child), f"background child {child} survived the timeout"


def test_local_run_in_home_dir():
    result = LocalConnection("localhost").run("pwd")
    assert os.path.realpath(result.stdout.strip()) == os.path.realpath(os.path.expanduser("~"))
