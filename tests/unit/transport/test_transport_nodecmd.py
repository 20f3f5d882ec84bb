"""The one-round-trip pre-flight command, run by a real sh through a LocalConnection."""

from __future__ import annotations

import sys

import pytest

from mlxops.node import protocol
from mlxops.sync import parse_manifest, python_manifest_args
from mlxops.transport import LocalConnection
from mlxops.transport.nodecmd import NodeCommandError, parse_preflight, preflight_command

ASK = protocol.preflight_args("runs/j")


def test_resolves_lists_code_and_answers_with_hostile_paths_verbatim(tmp_path):
    canary = tmp_path / "pwned"
    root = tmp_path / f"root dir $(touch {canary})"
    (root / "code" / "mlxops").mkdir(parents=True)
    (root / "code" / "mlxops" / "x.py").write_text("x = 1\n")
    command = preflight_command(str(root), sys.executable,
                                python_manifest_args("code", ["mlxops"]), ASK)
    result = LocalConnection("local").run(command)
    got_root, python, manifest, answer = parse_preflight("local", result, sys.executable)
    assert got_root == str(root) and python.startswith("/")
    assert list(parse_manifest(manifest, True)) == ["mlxops/x.py"]
    assert answer is not None and answer.checkpoints == [] and answer.leftovers == []
    assert not canary.exists()


def test_a_missing_interpreter_is_named(tmp_path):
    command = preflight_command(str(tmp_path / "r"), "no-such-python-3.99",
                                python_manifest_args("code", ["mlxops"]), ASK)
    result = LocalConnection("local").run(command)
    with pytest.raises(NodeCommandError, match="'no-such-python-3.99' .*not found"):
        parse_preflight("local", result, "no-such-python-3.99")


def test_an_unwritable_root_is_a_preflight_failure_not_a_missing_python(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    command = preflight_command(str(blocker / "root"), sys.executable,
                                python_manifest_args("code", ["mlxops"]), ASK)
    result = LocalConnection("local").run(command)
    with pytest.raises(NodeCommandError, match="pre-flight failed"):
        parse_preflight("local", result, sys.executable)
