"""ensure_file through a real LocalConnection (a shell on this machine), on a temp dir."""

from __future__ import annotations

import os
import stat

import pytest

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


def test_unreadable_file_fails(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads everything")
    p = tmp_path / "f"
    p.write_text("x")
    p.chmod(0)
    assert ensure_file(ctx(), str(p), b"y").status == "failed"
