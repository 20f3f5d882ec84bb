"""A node command imports its own module and no other command's.

The watchdog asks every node of a running job for a ``sample`` (or a ``status``) at every
poll; each is a fresh ``python -m mlxops.node``. With every command's module imported at
the top of ``mlxops/node/__main__.py`` (pre-flight's ``importlib.metadata``, the content
hashes, the bench, ...) the imports were most of such a command's CPU, taken from the
ranks training beside it. The real command runs here in its own process; the modules it
imported are read from ``sys.modules`` as it exits. No timing: counts of modules only.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
# Run the node's entry point, then list what it imported (the answer goes to stdout first).
PROBE = ("import runpy, sys, json\n"
         "sys.argv = ['mlxops.node'] + sys.argv[1:]\n"
         "try:\n"
         "    runpy.run_module('mlxops.node', run_name='__main__')\n"
         "except SystemExit:\n"
         "    pass\n"
         "print(json.dumps(sorted(sys.modules)))\n")
OTHER_COMMANDS = {"mlxops.node.preflight", "mlxops.node.content", "mlxops.node.reach",
                  "mlxops.node.ready", "mlxops.node.spawn", "mlxops.node.netclient",
                  "mlxops.node.netserver", "mlxops.node.ckptparts", "mlxops.node.calibration",
                  "importlib.metadata"}


def imported_by(*argv: str) -> set[str]:
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True,
                          text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    answer, modules = done.stdout.strip().splitlines()[-2:]
    json.loads(answer)  # the command answered, one JSON line
    return set(json.loads(modules))


def test_a_status_imports_no_other_commands_module(tmp_path: Path):
    run_dir = tmp_path / "runs" / "job"
    run_dir.mkdir(parents=True)
    modules = imported_by("status", "--run-dir", str(run_dir))
    assert "mlxops.node.status" in modules
    assert modules & OTHER_COMMANDS == set(), modules & OTHER_COMMANDS


#: What the commands asked every few seconds (status, stop, the watch channel) leave out:
#: a Linux node answers them from /proc (mlxops/node/host.py). (shutil is not here:
#: argparse's help formatter imports it while the command line is parsed.)
NOT_FOR_PROC = {"subprocess", "platform"}


def test_a_status_on_a_node_with_proc_starts_no_tool_module(tmp_path: Path):
    run_dir = tmp_path / "runs" / "job"
    run_dir.mkdir(parents=True)
    assert imported_by("status", "--run-dir", str(run_dir)) & NOT_FOR_PROC == set()
    assert imported_by("stop", "--run-dir", str(run_dir)) & NOT_FOR_PROC == set()


def test_a_sample_imports_no_other_commands_module(tmp_path: Path):
    modules = imported_by("sample")
    assert "mlxops.node.sample" in modules
    assert modules & OTHER_COMMANDS == set(), modules & OTHER_COMMANDS
