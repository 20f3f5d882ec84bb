"""ensure_file through a real LocalConnection (a shell on this machine), on a temp dir."""

from __future__ import annotations

import os
import stat
import tempfile

import pytest

from mlxops import shell
from mlxops.tasks.base import TaskContext
from mlxops.tasks.files import ensure_file, read_file
from mlxops.transport import LocalConnection


def ctx(check=False, diff=False):
    return TaskContext(host=None, conn=LocalConnection("local"), inventory=None, hosts=[],
                       check=check, diff=diff)


@pytest.fixture
def target(tmp_path):
    # A hostile directory name: every word reaches the shell quoted.
    return tmp_path / "a b" / "$(touch pwned)" / "env.sh"


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_create_then_ok(target):
    out = ensure_file(ctx(), str(target), b"export A=1\n")
    assert out.status == "changed" and "created" in out.message
    assert target.read_bytes() == b"export A=1\n" and mode(target) == 0o600
    assert ensure_file(ctx(), str(target), b"export A=1\n").status == "ok"
    assert not (target.parent.parent.parent / "pwned").exists()
    assert os.listdir(target.parent) == ["env.sh"]  # no temp file left behind


def test_check_changes_nothing(target):
    out = ensure_file(ctx(check=True, diff=True), str(target), b"x\n")
    assert out.status == "changed" and "would be created" in out.message
    assert "+x" in out.diff
    assert not target.exists()


def test_update_shows_diff_and_binary_survives(target):
    ensure_file(ctx(), str(target), b"a\nb\n")
    out = ensure_file(ctx(diff=True), str(target), b"a\nc\n\x00\xff")
    assert out.status == "changed"
    assert "-b\n" in out.diff and "+c\n" in out.diff
    assert read_file(LocalConnection("l"), str(target)) == (b"a\nc\n\x00\xff", 0o600)


def test_mode_only_change(target):
    ensure_file(ctx(), str(target), b"a\n", mode=0o644)
    assert mode(target) == 0o644
    out = ensure_file(ctx(diff=True), str(target), b"a\n", mode=0o600)
    assert out.status == "changed" and "644 -> 600" in out.diff
    assert mode(target) == 0o600


def test_home_relative_path(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    # LocalConnection runs in ~ and the shell expands "$HOME" itself.
    assert ensure_file(ctx(), "~/.mlxops/env.sh", b"x\n").status == "changed"
    assert (tmp_path / ".mlxops" / "env.sh").read_bytes() == b"x\n"


class _Unprivileged(LocalConnection):
    """Commands as ``nobody``: root reads every file, so as root (CI) the test drops
    privileges instead of skipping."""

    def run(self, command, **kwargs):
        return super().run(shell.join(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
                                       "--clear-groups", "/bin/sh", "-c", command]), **kwargs)


NOBODY = 65534


def test_unreadable_file_fails():
    conn = LocalConnection("local")
    # A directory anyone may enter (tmp_path's parents are root's, mode 700).
    with tempfile.TemporaryDirectory(dir="/tmp") as top:
        os.chmod(top, 0o755)
        p = os.path.join(top, "f")
        with open(p, "w") as f:
            f.write("x")
        os.chmod(p, 0)
        if os.geteuid() == 0:
            os.chown(p, NOBODY, NOBODY)  # its owner, without the read bit
            conn = _Unprivileged("local")
        context = TaskContext(host=None, conn=conn, inventory=None, hosts=[], check=False,
                              diff=False)
        outcome = ensure_file(context, p, b"y")
        assert outcome.status == "failed" and "Permission denied" in outcome.message
        os.chmod(p, 0o600)
        with open(p, "rb") as f:
            assert f.read() == b"x"  # nothing was written
