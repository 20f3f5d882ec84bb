"""Every remote command runs in POSIX ``sh``, whatever the node user's login shell.

sshd hands what a client sends to ``$SHELL -c``: zsh on a stock Mac. These tests run the
line mlxops sends under real login shells (Debian's zsh and bash, as sshd would run them)
and hold that the command means what ``/bin/sh`` makes of it; and that no code sends a
command over SSH without :func:`mlxops.shell.posix_sh`.
"""

from __future__ import annotations

import ast
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from mlxops import shell
from mlxops.transport.connection import SSHConnection

PACKAGE = Path(__file__).resolve().parents[2] / "mlxops"

# Lines that sh and zsh read differently (MACS.md, "Logging in").
ZSH_TRAPS = {
    "unmatched glob": "rm -f /nonexistent-dir/rank-*.sh; echo cleaned",
    "word splitting": 'words="a b c"; for w in $words; do echo "[$w]"; done',
    "equals expansion": "echo =ls",
    "echo backslash": r"echo 'a\tb'",
    "pipeline + $$": 'printf "%s\\n" "$$" | wc -l',
    "multi-line": "x=1\nif [ $x = 1 ]; then echo one; fi",
    "hostile quote": "printf '%s' \"it's \\$HOME\"",
}


def _login_shell(path: str, line: str) -> subprocess.CompletedProcess:
    """``line`` run the way sshd runs a remote command for a user whose shell is ``path``
    (``$SHELL -c line``; zsh started as ``zsh`` reads /etc/zsh/zshenv as on a Mac)."""
    return subprocess.run([path, "-c", line], capture_output=True, text=True, timeout=10,
                          env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"})


@pytest.mark.parametrize("login", ["zsh", "bash"])
@pytest.mark.parametrize("what", sorted(ZSH_TRAPS))
def test_wrapped_command_means_what_sh_makes_of_it(login, what):
    path = shutil.which(login)
    assert path, f"{login} is installed by `make test` (SYSTEM_PACKAGES)"
    command = ZSH_TRAPS[what]
    expected = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True)
    got = _login_shell(path, shell.posix_sh(command))
    assert (got.returncode, got.stdout) == (expected.returncode, expected.stdout), got.stderr


def test_zsh_breaks_the_unwrapped_clean_up():
    """The reason for the wrapper: zsh refuses the run-directory clean-up as sent raw."""
    raw = _login_shell(shutil.which("zsh"), ZSH_TRAPS["unmatched glob"])
    assert "no matches found" in raw.stderr  # and rm never ran


class _Channel:
    """A paramiko channel that records the command and exits 0 at once."""

    def __init__(self, sent: list[str]):
        self.sent = sent
        self.closed = False
        self.eof_received = True

    def exec_command(self, command: str) -> None:
        self.sent.append(command)

    def shutdown_write(self) -> None: ...
    def recv_ready(self) -> bool: return False
    def recv_stderr_ready(self) -> bool: return False
    def exit_status_ready(self) -> bool: return True
    def recv_exit_status(self) -> int: return 0
    def close(self) -> None: self.closed = True


@pytest.mark.parametrize("timeout", [None, 5.0])
def test_ssh_connection_sends_every_command_through_posix_sh(monkeypatch, timeout):
    sent: list[str] = []
    conn = SSHConnection.__new__(SSHConnection)
    conn.name = "mac1"
    monkeypatch.setattr(conn, "_session", lambda: (None, _Channel(sent)), raising=False)
    command = "rm -f ~/runs/x/rank-*.sh && echo $HOME"
    conn.run(command, timeout=timeout)
    [line] = sent
    words = shlex.split(line)
    assert words[:3] == ["exec", "/bin/sh", "-c"] and len(words) == 4
    assert words[3].endswith(command)  # with a timeout, the pgid report comes first


def _exec_command_calls() -> list[str]:
    """``module:function`` of every call to ``.exec_command(`` / ``.invoke_shell(`` in the
    package (the paramiko calls that send a command line to a node)."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in ("exec_command", "invoke_shell")):
                    found.append(f"{path.relative_to(PACKAGE)}:{func.name}")
    return found


def test_no_remote_command_bypasses_the_wrapper():
    assert _exec_command_calls() == ["transport/connection.py:_exec"]


def test_only_the_transport_uses_fabric_or_paramiko_sessions():
    """Fabric's ``run``/``sudo`` would send a command past the wrapper: only the transport
    may hold a Fabric connection."""
    users = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                   if "import fabric" in p.read_text() or "from fabric" in p.read_text())
    assert users and all(u.startswith("transport/") for u in users), users
