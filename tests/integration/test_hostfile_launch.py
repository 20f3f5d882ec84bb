"""THE key test: the rendered ring hostfile runs a real all_sum through ``mlx.launch``.

mlx.launch runs the system ``ssh`` with each entry's ``ssh`` word (``mlxnode@<ip>``, as we
render it). The sandbox's ssh_config only has ``Host nodeN`` blocks, so a wrapper first on
PATH adds the sandbox key and known_hosts for any target. The script reaches the nodes
through our own sync, and ranks run the node's absolute interpreter (``--python``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from mlxops import render
from mlxops.inventory import load_inventory
from mlxops.sync import collect, sync_files
from mlxops.transport import Connector

SCRIPT = """\
import mlx.core as mx

group = mx.distributed.init(strict=True, backend="ring")
total = mx.distributed.all_sum(mx.array([group.rank() + 1.0]), group=group)
mx.eval(total)
print(f"rank {group.rank()} of {group.size()}: sum {total.item():g}", flush=True)
"""


def _ssh_wrapper(bindir: Path, sandbox) -> None:
    bindir.mkdir()
    wrapper = bindir / "ssh"
    ssh = shutil.which("ssh") or "/usr/bin/ssh"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"exec {ssh} -F '{sandbox.ssh_config_path}' -i '{sandbox.key_path}' "
        f"-o IdentitiesOnly=yes -o UserKnownHostsFile='{sandbox.known_hosts_path}' "
        "-o StrictHostKeyChecking=yes -o BatchMode=yes -o ConnectTimeout=5 \"$@\"\n")
    wrapper.chmod(0o755)


def test_ring_hostfile_all_sum_through_mlx_launch(login_sandbox, tmp_path):
    # On zsh nodes too: mlx.launch sends each rank's script (bash syntax: [[ ]], arrays)
    # as it is, and sshd runs it under the node user's login shell.
    sandbox = login_sandbox
    inv = load_inventory(sandbox.inventory_path)
    hosts = inv.select("node1,node2,node3")
    # Two ranks on node2: entries repeat per rank, ports stay distinct.
    hosts[1] = dataclasses.replace(hosts[1], vars={**hosts[1].vars, "mlxops_slots": 2})
    hostfile = tmp_path / "hostfile.json"
    hostfile.write_text(render.launch_hostfile(hosts, "ring"))
    assert len(json.loads(hostfile.read_text())["hosts"]) == 4

    src = tmp_path / "job"
    src.mkdir()
    (src / "all_sum.py").write_text(SCRIPT)
    connector = Connector()
    homes = set()
    for h in hosts:
        conn = connector.connect(h)
        sync_files(conn, collect(src)[0], "~/launch-test", python=h.python)
        homes.add(conn.run("printf %s \"$HOME\"").stdout)
        conn.close()
    assert len(homes) == 1  # same home path on every node: one script path for all ranks
    script = f"{homes.pop()}/launch-test/all_sum.py"

    _ssh_wrapper(tmp_path / "bin", sandbox)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    launch = Path(sys.executable).with_name("mlx.launch")
    proc = subprocess.run(
        [str(launch), "--hostfile", str(hostfile), "--python", hosts[0].python, script],
        env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180,
        cwd=tmp_path)
    lines = sorted(line.strip() for line in proc.stdout.splitlines() if "sum" in line)
    assert proc.returncode == 0, proc.stderr
    assert lines == [f"rank {r} of 4: sum 10" for r in range(4)], (proc.stdout, proc.stderr)


def test_hostfiles_task_pushes_every_hostfile(sandbox):
    from mlxops.tasks.base import TaskContext
    from mlxops.tasks.hostfiles import hostfiles_task

    inv = load_inventory(sandbox.inventory_path)
    hosts = inv.select("node5,node6")
    connector = Connector()
    for h in hosts:
        conn = connector.connect(h)
        ctx = TaskContext(h, conn, inv, hosts)
        first = hostfiles_task(ctx, {})
        assert first.status in ("changed", "ok"), first.message
        assert hostfiles_task(ctx, {}).status == "ok"
        conn.close()
    pushed = sandbox.node_home("node6") / ".mlxops" / "hostfiles"
    assert sorted(p.name for p in pushed.iterdir()) == ["mpi.txt", "ring.json"]
    assert (pushed / "ring.json").read_text() == render.launch_hostfile(hosts, "ring")
    assert (pushed / "mpi.txt").read_text().splitlines()[1:] == [
        f"mlxnode@{sandbox.ip(n)} slots=1" for n in ("node5", "node6")]
